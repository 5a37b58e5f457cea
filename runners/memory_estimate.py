"""The memory ``train`` needs on each rank, estimated before any shard is read from ``meta.json`` and the flags.

:func:`train_memory` estimates the bytes a run adds to what the process holds when it starts (interpreter,
torch, MPI) as the sum of these parts (the names it prints):

* ``runtime``: library code and kernels paged in at first use, the same on every rank at every ``P``.
* ``graph``: per stored entry of the rank's rows, the CSR as loaded, normalised and as the operator's blocks
  and torch tensors, both directions (:data:`GRAPH_BYTES_PER_EDGE`, measured), and three int64 per row.
* ``features``: the float32 rows as loaded and the compute-dtype tensor.
* ``halo``: layer 0's halo (the rows of other groups its rows read): where it is fetched once (``once``, or
  ``auto`` where :func:`fetched_once` says the run takes it) its rows of ``X``; and the exchanges' rows of the
  halo's size alive at the peak, at the widest exchanged width (:data:`HALO_EXCHANGE_COPIES`). Its rows are
  :func:`halo_rows`, from ``prepare``'s statistics; on power-law graphs a rank's halo can be several times its
  own rows (hubs).
* ``evaluation``: the product of layer 0 an evaluation keeps (a layer that sees its input only through it, GCN).
* ``activations``: layer 0's dropped-out input and mask, and per layer the arrays of its width autograd keeps
  and their gradients (:data:`ACTIVATION_COPIES`), plus a layer's per-entry values (attention).
* ``parameters``: the parameters, their gradients and Adam's two moments.
* ``compiled kernels``: numba and the compiled dropout passes, where a rank's run loads them at set-up (CPU,
  dropout on, a layer input of at least :data:`~sparse_dist.dropout_kernel.MIN_ENTRIES` entries or enough epochs
  of smaller ones: :func:`sparse_dist.dropout_kernel.loads_at_set_up`).
* ``buffers``: a staleness rule's caches (send and receive side, every layer).
* ``residuals``: error feedback's residuals (``--compress ...,feedback``), one per exchanging layer and direction
  of the rows it sends: the forward's of the rows its boundary sends, the backward's of the gradients of its halo
  rows, both taken at the halo's size (a row read by several ranks is sent, and kept, once for each).
* ``kept by the heap``: where a rank's row arrays are small enough to be heap blocks (:data:`HEAP_BLOCK_BYTES`),
  glibc keeps them when they are freed and the next epoch's peak comes on top: a share of the halo and
  activations (:data:`HEAP_KEPT_SHARE`). This is the coarse part: how much the heap keeps depends on the order
  of allocations, and measured ranks in this regime ranged from nothing kept to about 0.8 of those parts.

When set-up's float64 copies of the features outweigh the training parts, they are the peak instead
(``features at set-up``). Every width and count of a layer is its layer kind's own answer
(:func:`model_figures`): nothing here names a layer, a policy or a plan.
:func:`runners.resources.check_train_resources` (collective) prints it and refuses a run its nodes cannot hold.

How it was checked: peak RSS (``ru_maxrss``) minus the RSS at start, per rank, GCN 3 x 128, float32, 3
epochs, ``--input-exchange auto``, exact p2p. Since forward flights forget their receive buffers
(:meth:`sparse_dist.exchange.Flight.forget_rows`; the peak fell 7-27%), the halo's copies and the heap's share
were fitted again on R-MAT SCALE 20 (1,048,576 vertices, 31M entries, 128 features; metis-train, P = 1, 2, 4, 8)
and SCALE 18 (262,144 vertices; METIS, metis-train and random, P = 1, 2, 4, 8): SCALE 20 0.95 to 1.11 of the
measured peak on all 15 ranks (``--input-exchange per-epoch`` at P = 4: 1.08 to 1.12); R-MAT SCALE 21 (not
fitted on; metis-train, P = 1, 2, 4, 8, and ``bns:keep=0.1`` at P = 4): 1.01 to 1.14. SCALE 18: 0.59 to 1.22, four
of 43 ranks under 0.75, all METIS at P = 8, where a rank's row arrays are heap blocks and two ranks of the same
estimate measured 0.45 and 0.65 GiB (and one rank 0.57 and 0.65 GiB in two runs): the heap's share is the coarse
part. Before that change the same parts (with five halo copies and a heap share of 0.42) held 0.89 to 1.15 on
SCALE 20 with METIS, metis-train and random parts, ``bns:keep=0.1`` and ``--plan cover``, 0.76 to 1.25 on SCALE
18 and the 200k uniform graph, and 0.65 to 0.89 on SCALE 16 at P = 8 (8,000 rows a rank), where per-rank fixed
costs the runtime part does not count weigh more; those runs were not repeated. ``tests/cli/test_resources.py``
checks Cora and a 50k planted graph at P = 2 within 25%. The residuals part (not fitted): the 200k synthetic in 2
METIS parts, P = 2, GCN 3 x 128, ``--input-exchange once``, 4 epochs, two runs each: ``int8,feedback`` raised the
peak by 112-150 MiB a rank over no compression, of which the part counts 68-74 (the codec's work buffers and coded
messages are the rest); the estimate was 0.93-0.94 of the peak with it, 0.85-0.88 without it (2026-12-03).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from algorithms.layers import LayerOptions, layer_type
from algorithms.model import LayerFigures, layer_figures
from algorithms.policies.spec import AxisSpec
from algorithms.static_input import evaluations
from sparse_dist.dropout_kernel import loads_at_set_up
from sparse_dist.compress import Codec

GIB = 1 << 30

RUNTIME_BYTES = 32 << 20
"""What a rank's resident set grows by for any graph: library code and kernels paged in at their first use (torch
2.13 CPU wheel, Cora: about 31 MiB beyond the graph and features. It was 90 MiB while ``torch.optim.Adam``'s
first step imported ``torch._dynamo``; :mod:`algorithms.optim` no longer does)."""
COMPILED_KERNEL_BYTES = 88 << 20
"""What loading the compiled dropout passes (:mod:`sparse_dist.dropout_kernel`: numba, llvmlite and the kernels
from numba's cache) adds to a rank's peak, where a run loads them (:func:`loads_at_set_up`) on the CPU: 82
to 93 MiB on the 50k planted graph at P = 2 (two runs each with and without them, GCN 3 epochs)."""
GRAPH_BYTES_PER_EDGE = 30
"""A rank's stored entries at the peak, per entry: the CSR as loaded, the normalised rows, the operator's blocks
and the torch tensors of both directions (the transposes made at the first backward), less what set-up frees
before the epochs. Measured, not counted copy by copy: the resident set before the first epoch grows by 25-33
bytes per entry (R-MAT SCALE 18 at P = 1, 2, 4, 8), whether the entry's column is the rank's own or remote, and
a least-squares fit of the peak over the R-MAT ranks gives 25-30."""
HALO_EXCHANGE_COPIES = 2
"""Rows of the exchanged width per halo row alive at the peak (the backward of layer 1, the first exchanging layer
after a static input): the gradient of the rows this rank received, on its way back, and what its owners send back
for its own boundary rows (about as many rows on these graphs). The forward's receive buffer is gone by then: a
flight forgets its rows once they are multiplied (:meth:`sparse_dist.exchange.Flight.forget_rows`). Where layer
0's input is fetched once its rows of ``X`` are kept besides (``F_0`` columns). Fitted on R-MAT SCALE 20
(metis-train, P = 2, 4, 8; with :data:`HEAP_KEPT_SHARE` the estimate is 0.95 to 1.11 of the peak,
``--input-exchange per-epoch`` at P = 4 1.08 to 1.12)."""
MERGED_HALO_SHARE = 0.6
"""A row group merged from several prepared parts needs fewer halo rows than its parts together: the rows its own
parts hold and the rows several of them read count once (R-MAT SCALE 20, 8 parts in 2 and 4 groups, METIS,
metis-train and random: the halo was 0.54-0.9 of the parts' sum)."""
HEAP_BLOCK_BYTES = 32 << 20
"""glibc's largest dynamic mmap threshold (64-bit): a block up to this size, once one as large was freed, comes
from the heap, and a freed heap block stays in the resident set."""
HEAP_KEPT_SHARE = 0.25
"""Share of an epoch's halo and activation arrays the heap still holds when the next epoch's peak comes, where
they are heap blocks (measured 0 to about 0.8 by rank: R-MAT SCALE 18 and the 200k synthetic graph at P = 4, 8;
0.25 since forward flights forget their receive buffers, fitted on R-MAT SCALE 18 at P = 2, 4, 8)."""
SETUP_BYTES_PER_FEATURE = 20
"""Bytes per feature value while set-up normalises: float32 as loaded, a float64 copy, float64 row-normalised."""
KEPT_FEATURE_COPIES = 1
"""Feature copies kept while training besides the compute-dtype tensor: the float32 array as loaded."""
INPUT_DROPOUT_COPIES = 2
"""Layer 0's input under dropout: the dropped-out copy and its mask (compute dtype)."""
ACTIVATION_COPIES = 3
"""Arrays of each layer's output width kept or made per epoch (dense product, SpMM result, activation, and
their gradients, not all alive at once)."""
OPTIMIZER_COPIES = 4
"""A parameter, its gradient and Adam's two moments."""


@dataclass(frozen=True)
class Estimate:
    """Bytes by what needs them at the peak; :attr:`total` is their sum."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        shown = ", ".join(f"{name} {size(value)}" for name, value in self.parts.items() if value)
        return f"{size(self.total)} ({shown})"


def size(count: float) -> str:
    """Bytes as a short human figure: ``512 KiB``, ``3.2 GiB``."""
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"


def group_counts(meta: dict[str, Any], groups: int, group: int) -> dict[str, int] | None:
    """Rows, edges and boundary rows (an upper bound: the sum over its parts) of row group ``group``; None when the
    parts cannot be split over ``groups`` (the shard reader says why)."""
    parts = int(meta["num_parts"])
    if groups < 1 or parts % groups:
        return None
    per_group = parts // groups
    first, last = group * per_group, (group + 1) * per_group
    stats = meta.get("partition_stats", {})
    offsets = meta["row_offsets"]
    edges = stats.get("edges")
    boundary = stats.get("boundary_nodes")
    rows = int(offsets[last] - offsets[first])
    if groups == 1:  # one row group holds every row: no boundary
        return {"rows": rows, "edges": int(meta["num_edges"]), "boundary": 0}
    return {"rows": rows,
            "edges": int(sum(edges[first:last])) if edges else int(meta["num_edges"] * rows / max(meta["num_nodes"], 1)),
            "boundary": int(sum(boundary[first:last])) if boundary else rows}


def model_figures(model: str, features: int, hidden: int, layers: int, classes: int, heads: int = 1,
                  output_heads: int = 1) -> list[LayerFigures]:
    """Each layer of the run's model as its layer kind declares it (:func:`algorithms.model.layer_figures`):
    widths as computed, parameters, exchange widths."""
    dims = [features] + [hidden] * (layers - 1) + [classes]
    return layer_figures(model, dims, LayerOptions(heads=heads or 1, output_heads=output_heads or 1))


def axis_policy(axis: str, spec: Any) -> Any:
    """The policy object of an axis given parsed (:class:`AxisSpec`) or as text; None for none."""
    if spec is None:
        return None
    parsed = spec if isinstance(spec, AxisSpec) else AxisSpec.parse(axis, str(spec))
    return parsed.policy


def train_memory(meta: dict[str, Any], *, rank: int, world_size: int, replication: int, model: str, hidden: int,
                 layers: int, dtype: str, heads: int = 1, output_heads: int = 1, input_exchange: str = "auto",
                 stale: str = "none", epochs: int = 1, eval_every: int = 1, dropout: float = 0.0,
                 device: str = "cpu", compress: str = "none") -> Estimate | None:
    """Peak bytes ``sparse-dist train`` adds on ``rank`` beyond the process at start; None if the dataset's parts
    cannot be split over the run's row groups. ``epochs`` and ``eval_every`` decide what ``auto`` makes of
    layer 0's input (:func:`fetched_once`); ``dropout`` and ``device`` whether the compiled dropout passes load
    (:data:`COMPILED_KERNEL_BYTES`); ``compress`` (``--compress``'s text) whether error feedback keeps residuals."""
    if replication < 1 or world_size % replication:
        return None
    counts = group_counts(meta, world_size // replication, rank // replication)
    if counts is None:
        return None
    rows, edges, boundary = counts["rows"], counts["edges"], counts["boundary"]
    groups = world_size // replication
    itemsize = 8 if dtype == "float64" else 4
    features = int(meta["feature_dim"])
    figures = model_figures(model, features, hidden, layers, int(meta["num_classes"]), heads, output_heads)
    parameters = sum(figure.parameters for figure in figures)
    widest = max(figure.owner[0] for figure in figures)  # exchanged
    stale_layers = layers if axis_policy("stale", stale) is not None else 0  # a rule keeps both sides
    once = fetched_once(input_exchange, figures[0], epochs, evaluations(epochs, eval_every))
    halo = halo_rows(meta, groups, rank // replication, counts)
    training = {
        "features": rows * features * (4 * KEPT_FEATURE_COPIES + itemsize),
        # layer 0's halo rows of X kept (once), and the exchanges' rows of the halo's size at the peak
        "halo": halo * ((features if once else 0) + HALO_EXCHANGE_COPIES * widest) * itemsize,
        # evaluations keep layer 0's product A X where the halo is fetched once and the layer sees its input only
        # through that product (GCN)
        "evaluation": (rows * features * itemsize if layer_type(model).input_only_through_product
                       and once else 0),
        "activations": (INPUT_DROPOUT_COPIES * rows * features + ACTIVATION_COPIES * rows * sum(
            figure.width for figure in figures)) * itemsize + edges * max(figure.edge_values for figure in figures)
                       * itemsize,
        "parameters": OPTIMIZER_COPIES * parameters * itemsize,
        "buffers": 2 * stale_layers * boundary * widest * itemsize,  # a staleness rule's caches, both sides
    }
    codec = Codec.parse(compress)
    if codec is not None and codec.residual_copies:  # error feedback: the rows' and the gradients' residuals
        exchanging = figures[1:] if once else figures
        training["residuals"] = codec.residual_copies * halo * sum(f.owner[0] for f in exchanging) * itemsize
    if rows * max(features, *(figure.width for figure in figures)) * itemsize <= HEAP_BLOCK_BYTES:
        # an epoch's row arrays are heap blocks that glibc keeps when freed: the next epoch's peak adds to them
        training["kept by the heap"] = int(HEAP_KEPT_SHARE * (training["halo"] + training["activations"]))
    setup = SETUP_BYTES_PER_FEATURE * rows * features
    fixed = {"runtime": RUNTIME_BYTES, "graph": GRAPH_BYTES_PER_EDGE * edges + 3 * 8 * rows}
    if dropout > 0 and device == "cpu" and loads_at_set_up((rows + halo) * max(features, *(f.width for f in figures)),
                                                            epochs):
        fixed["compiled kernels"] = COMPILED_KERNEL_BYTES  # such a run loads the compiled dropout passes
    if setup > sum(training.values()):  # set-up's float64 copies are the peak: say so
        parts = {**fixed, "features at set-up": setup}
    else:
        parts = {**fixed, **training}
    return Estimate(parts)


def fetched_once(input_exchange: str, first: LayerFigures, epochs: int, evaluations: int) -> bool:
    """Whether layer 0's halo is fetched once: ``once``, or ``auto`` where that moves no more bytes than exchanging
    layer 0 every epoch would under p2p (the same halo rows each time: ``F_0`` columns once against the layer's
    exchanged width per training forward, backward where it returns, and evaluation;
    :func:`algorithms.static_input.choose_input_exchange` decides the same way from the plan's byte model)."""
    if input_exchange != "auto":
        return input_exchange == "once"
    width, returns = first.owner
    return first.fan_in <= (epochs * (1 + int(returns)) + evaluations) * width


def halo_rows(meta: dict[str, Any], groups: int, group: int, counts: dict[str, int]) -> int:
    """Rows of other row groups that row group ``group`` reads (layer 0's halo), from ``prepare``'s statistics.

    ``prepare``'s p2p byte prediction is every part's halo once (4 bytes a value), shared out over the parts in
    proportion to their cut edges; a group of several parts takes :data:`MERGED_HALO_SHARE` of its parts' sum,
    and never more than the other parts' boundary rows (the only rows a halo can hold). Without those statistics,
    the group's boundary rows (``counts``)."""
    if groups < 2:
        return 0
    stats = meta.get("partition_stats", {})
    cut, boundary = stats.get("cut_edges"), stats.get("boundary_nodes")
    predicted = stats.get("predicted_forward_bytes_per_feature", {}).get("p2p")
    if not (cut and boundary and predicted and sum(cut)):
        return counts["boundary"]
    per_group = int(meta["num_parts"]) // groups
    mine = range(group * per_group, (group + 1) * per_group)
    share = 1.0 if per_group == 1 else MERGED_HALO_SHARE
    parts_halo = int(predicted) // 4 * sum(cut[i] for i in mine) / sum(cut)
    others = sum(boundary) - sum(boundary[i] for i in mine)
    return int(min(share * parts_halo, others))
