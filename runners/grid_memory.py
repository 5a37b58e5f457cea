"""The memory a rank of the process grid needs for a GCN or SAGE (``bench grid``), estimated from ``meta.json`` before a
shard is read, and the refusal of a run its nodes cannot hold.

:func:`grid_memory` counts, beyond what the process holds at start, the parts of the rank at ``coords`` of a
``shape`` grid (:mod:`sparse_dist.grid_gcn`; ``n_a``: the rank's block of the ``N`` rows over axis ``a``, ``f_a``
of a width; roles ``(o, i, d)`` rotating per layer):

* ``runtime``: library code paged in at first use (:data:`runners.memory_estimate.RUNTIME_BYTES`).
* ``graph``: each rotation's block ``Â[d, o]`` (at most three), ``(E + N) n_d n_o / N^2`` entries (``E`` stored
  entries, ``N`` self-loops; a permuted partition spreads them evenly), a value and an int32 index each, and
  ``n_d + 1`` row pointers. No transpose on the CPU.
* ``input``: layer 0's aggregation ``T[d, i]``, kept for the run (``X[o, i]`` is freed once it is computed).
* ``activations``: what the backward keeps of each later layer (its aggregation ``n_d f_i``) and each ReLU's
  mask at one bit an entry (``n_d f'_o / 8`` bytes, :class:`~sparse_dist.bit_mask.PackedMask`).
* ``transient``: :data:`TRANSIENT_COPIES` arrays of the widest layer's ``n_d x max(f_i, f'_o)`` alive at the
  peak (a layer's product, its allreduce piece's temporary, the backward's gradients) and the heap's slack.
* ``parameters``: each ``W[i, o]`` and ``b[o]``, its gradient and Adam's two moments.

While reading, the peak is the blocks read so far, ``X[o, i]`` and one rotation's block being assembled
(:data:`READ_BYTES_PER_ENTRY` an entry: the part's stored rows with their self-loops, the cut pieces and their
stacked copy in float64 and int64); the estimate is the larger of that and the training peak.

How it was checked: peak RSS (``ru_maxrss``) minus the RSS at start on every rank of ``bench grid`` (GCN 3 x 128,
float32, R-MAT with 128 features in permuted parts): :data:`TRANSIENT_COPIES` and :data:`READ_BYTES_PER_ENTRY`
were fitted on SCALE 20 at 2x2x2 and the estimate checked at SCALE 21 (docs/results.md, "The process grid's
memory").
"""

from __future__ import annotations

from typing import Any

from runners.memory_estimate import RUNTIME_BYTES, Estimate, size
from runners.resources import ResourceError, memory_verdict, node_memory
from sparse_dist.comm import Communicator, said_once
from sparse_dist.grid import GridShape, block_range, roles

TRANSIENT_COPIES = 3.0
"""Arrays of the widest layer's ``n_d x max(f_i, f'_o)`` alive at the peak beyond what the backward keeps, with
the heap's slack: fitted on R-MAT SCALE 20 at 2x2x2 (GCN 3 x 128, float32, masks kept as bits, the aggregation's
product made in one block and the backward's masks applied in place; the largest rank's peak 0.99 GiB beyond the
start, in the forward: a middle layer's input, aggregation and product beside layer 0's aggregation, or the last
layer's input and aggregation beside layer 0's and layer 1's)."""
READ_BYTES_PER_ENTRY = 40
"""Bytes per entry of the rotation block being assembled while reading: the cut rows (float64 values, int64
indices), their stacked copy and the normalised one (fitted on SCALE 20 at 2x2x2: peak while reading 0.73 GiB
beyond the start)."""
INDEX_BYTES = 4
OPTIMIZER_COPIES = 4


def _length(span: tuple[int, int]) -> int:
    return span[1] - span[0]


def _bits(entries: int) -> int:
    """Bytes of a mask of ``entries`` kept at one bit an entry."""
    return -(-entries // 8)


def grid_memory(meta: dict[str, Any], shape: GridShape, coords: dict[str, int], layers: int, hidden: int,
                itemsize: int, terms: int = 1, dropout: bool = False) -> Estimate:
    """The bytes the rank at ``coords`` adds to its start at its peak, by part (module docstring); ``terms``: the
    aggregated terms side by side a layer keeps (GCN 1, SAGE 2: its aggregation ``n_d x terms f_i`` and ``terms``
    weight blocks, :mod:`sparse_dist.grid_sage`). ``dropout``: every layer's input masked
    (:mod:`algorithms.grid_dropout`): ``X[o, i]`` is kept instead of layer 0's aggregation (aggregated every step),
    each layer keeps its input's mask (``n_o f_i / 8`` bytes) and its aggregation, and at the peak one layer's
    masked input (``n_o f_i`` values) and a mask drawn at a layer's whole width (``n_o F`` bytes, on a GPU) are
    alive (R-MAT SCALE 20, 2x2x2, dropout 0.5: the estimate 1.02-1.09 of every rank's peak beyond its start)."""
    n, entries = int(meta["num_nodes"]), int(meta["num_edges"]) + int(meta["num_nodes"])
    dims = [int(meta["feature_dim"])] + [hidden] * (layers - 1) + [int(meta["num_classes"])]

    def spans(layer: int) -> tuple[int, int, int, int]:
        outer, inner, depth = roles(layer)
        return (_length(block_range(n, shape.of(depth), coords[depth])),
                _length(block_range(n, shape.of(outer), coords[outer])),
                _length(block_range(dims[layer], shape.of(inner), coords[inner])),
                _length(block_range(dims[layer + 1], shape.of(outer), coords[outer])))

    block_entries = []
    graph = 0
    for rotation in range(min(layers, 3)):
        n_depth, n_outer, _, _ = spans(rotation)
        count = int(entries * (n_depth / max(n, 1)) * (n_outer / max(n, 1)))
        block_entries.append(count)
        graph += count * (itemsize + INDEX_BYTES) + (n_depth + 1) * INDEX_BYTES
    n_depth, n_outer, f_inner, _ = spans(0)
    aggregation = n_depth * terms * f_inner * itemsize
    if dropout:
        aggregation = n_outer * f_inner * itemsize  # X[o, i], aggregated anew every step
    kept = masks = widest = parameters = drawn = 0
    for layer in range(layers):
        rows, _, f_in, f_out = spans(layer)
        if dropout:
            inputs = _length(block_range(n, shape.of(roles(layer)[0]), coords[roles(layer)[0]]))
            kept += _bits(inputs * f_in)  # its mask, for the backward
            drawn = max(drawn, inputs * dims[layer] + inputs * f_in * itemsize)  # drawn whole, and its product
        if layer > 0 or dropout:
            kept += rows * terms * f_in * itemsize
        if layer < layers - 1:
            masks += _bits(rows * f_out)
        widest = max(widest, rows * max(terms * f_in, f_out) * itemsize)
        parameters += (terms * f_in * f_out + f_out) * itemsize * OPTIMIZER_COPIES
    training = {"runtime": RUNTIME_BYTES, "graph": graph, "input": aggregation, "activations": kept + masks,
                "transient": int(TRANSIENT_COPIES * widest) + drawn, "parameters": parameters}
    x_block = n_outer * f_inner * itemsize
    reading = graph + x_block + READ_BYTES_PER_ENTRY * max(block_entries, default=0) + RUNTIME_BYTES
    if reading > sum(training.values()):
        return Estimate({"runtime": RUNTIME_BYTES, "graph": graph, "input": x_block,
                         "reading": READ_BYTES_PER_ENTRY * max(block_entries, default=0)})
    return Estimate(training)


def check_grid_memory(comm: Communicator, meta: dict[str, Any], shape: GridShape, coords: dict[str, int],
                      layers: int, hidden: int, itemsize: int, terms: int = 1,
                      dropout: bool = False) -> dict[str, Any]:
    """Every rank's :func:`grid_memory`, printed (rank 0, one line), and a :class:`ResourceError` raised on every
    rank (said once) where the ranks of a node together need more than its ``MemAvailable`` (collective).
    Returns the figures: ``estimate_per_rank``, ``rss_at_start_per_rank``."""
    estimate = grid_memory(meta, shape, coords, layers, hidden, itemsize, terms, dropout)
    everyone = comm.allgather_object({**node_memory(), "estimate": estimate.parts})
    totals = [sum(entry["estimate"].values()) for entry in everyone]
    biggest, worst = memory_verdict(comm, everyone, totals)
    if worst is not None:
        host, ranks, need, available = worst
        raise said_once(ResourceError(
            f"not enough memory: the {len(ranks)} rank(s) on {host} need about {size(need)} but {size(available)} "
            f"is available (largest rank {biggest.describe()}); use more nodes or a smaller --hidden"))
    return {"estimate_per_rank": totals, "estimate_parts_per_rank": [entry["estimate"] for entry in everyone],
            "rss_at_start_per_rank": [entry["rss_at_start"] for entry in everyone]}
