"""The process grid in the performance model: one GCN epoch on an ``X x Y x Z`` grid, priced beside the 1D plans.

``cost predict --plans grid:X,Y,Z`` prices one grid, ``grid:auto`` every factorisation ``X * Y * Z = P`` (and
keeps the fastest). The algorithm is :mod:`sparse_dist.grid_gcn`'s (Plexus's): every exchange is an allreduce
along one axis of the grid, and what a rank moves is closed-form in the grid's shape, its coordinates, ``N`` and
the widths, whatever the graph.

**Bytes**: per rank, :func:`sparse_dist.grid_gcn.layer_bytes` summed over the layers (roles rotating per layer,
widths ``F -> hidden ... -> classes``, layer 0 without the backward allreduces its input needs no gradient for,
and without its aggregation, computed once before the first step like 1D's ``--input-exchange once``)
plus :func:`sparse_dist.grid_gcn.loss_bytes` of the last layer: the same functions the trainer's counters are
checked against. The busiest rank is the one with the most bytes over every phase (a ring allreduce's rank
receives what it sends).

**Seconds**: each allreduce at :func:`sparse_dist.cost.allreduce_time` of its largest block on its axis. Ranks
are placed ``rank = x + X (y + Y z)``, ``ranks_per_node`` consecutive ranks a node, so an axis of stride ``t``
(``x``: 1, ``y``: ``X``, ``z``: ``X Y``) has ``min(s, max(1, q // t))`` of its ``s`` ranks on one node; all ``q``
ranks of a node run their own axis's allreduce at once and share the node's NICs (:class:`AxisNetwork`).
Compute at the 1D plans' calibrated rates (or, for ``train --grid auto``, the probes of
:mod:`runners.grid_probes`): a block of ``Â`` holds ``(nnz + N) / (|d| |o|)`` entries (the self-loops included),
assuming a random permutation of the nodes balances the blocks (the grid reads no partition); the SpMM multiplies
it by ``H[o, i]`` (``f_i`` columns) forward and, from layer 1, by ``dT`` in the backward; the dense work of a layer
is ``n_d f_i f'_o`` (1D's ``rows * F_in * F_out`` on the grid's blocks); the elementwise work :data:`OUTPUT_PASSES`
(:data:`LOSS_PASSES` for the logits) passes over the output block ``n_d f'_o``, priced where the rates have an
elementwise rate (a probe's; a 1D calibration run's dense time holds its own passes).
GCN and SAGE (``terms``: SAGE's aggregation, its gradient, its weights and its dense work are twice GCN's
columns, :mod:`sparse_dist.grid_sage`); exact, or with the step's messages coded (``codec``): the grid has no
sampling or staleness.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, fields

from runners.perf.cost_model import Rates, cores_per_rank, shared_memory_slowdown
from sparse_dist.cost import Network, allreduce_time
from sparse_dist.grid import AXES, GridShape, roles
from sparse_dist.compress import Codec
from sparse_dist.grid_gcn import Collective, layer_collectives, loss_bytes, loss_collectives, step_bytes
from sparse_dist.grid_links import MESSAGES, allreduce_message_bytes
from sparse_dist.grid_sage import TERMS as SAGE_TERMS

GRID_PLAN = "grid:"
AUTO = "auto"
PHASES = ("forward", "loss", "backward", "grad_allreduce")
"""The busiest rank's bytes by phase: the layers' forward and backward allreduces, the loss's (counted in the
trainer's ``forward``) and the gradient allreduces."""
OUTPUT_PASSES = 5
"""Elementwise passes over a hidden layer's output block ``n_d x f'_o`` a step (:mod:`sparse_dist.grid_gcn`): the
bias's add, the ReLU's compare and fill, its mask on the gradient, the bias gradient's sum. Every replica of the
block (over ``inner``) makes them, so a grid that replicates wide outputs over many ranks pays them on each."""
LOSS_PASSES = 8
"""The same over the last layer's logits block: the bias, the row maxima, the shift, two exponentials, the sums, the
gradient's copy and its scale (:class:`sparse_dist.grid_gcn.GridCrossEntropy`)."""


def is_grid_plan(name: str) -> bool:
    return name.startswith(GRID_PLAN)


def split_plans(text: str) -> list[str]:
    """``--plans``' items: comma-separated, a ``grid:`` item keeping the numbers after it (``p2p,grid:4,4,4``)."""
    items: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if items and is_grid_plan(items[-1]) and piece.isdigit():
            items[-1] += "," + piece
        else:
            items.append(piece)
    return items


def parse_grid_plan(text: str) -> GridShape | None:
    """``grid:X,Y,Z`` (or ``grid:XxYxZ``): its shape; ``grid:auto``: None; else a ValueError in one sentence."""
    body = text[len(GRID_PLAN):]
    if body == AUTO:
        return None
    try:
        values = [int(piece) for piece in body.replace("x", ",").split(",")]
    except ValueError:
        values = []
    if len(values) != 3 or min(values) < 1:
        raise ValueError(f"plan {text}: expected grid:X,Y,Z with three positive integers (or grid:auto)")
    return GridShape(*values)


def grid_shapes(text: str, ranks: int) -> list[GridShape]:
    """The grids a ``grid:`` plan asks for at ``ranks``: its one shape, or every factorisation for ``grid:auto``."""
    shape = parse_grid_plan(text)
    if shape is None:
        return factorisations(ranks)
    if shape.size != ranks:
        raise ValueError(f"plan {text}: X * Y * Z = {shape.size}, not P = {ranks}")
    return [shape]


def factorisations(ranks: int) -> list[GridShape]:
    """Every ordered ``X x Y x Z`` with ``X * Y * Z = ranks``."""
    divisors = [d for d in range(1, ranks + 1) if ranks % d == 0]
    return [GridShape(x, y, ranks // (x * y)) for x in divisors for y in divisors if (ranks // x) % y == 0]


GRID_TERMS = {"gcn": 1, "sage": SAGE_TERMS}
"""The layer kinds the grid runs, and the aggregated terms each multiplies (:mod:`sparse_dist.grid_sage`)."""


def grid_terms(kind: str) -> int:
    """:data:`GRID_TERMS` of ``kind``; a ValueError in one sentence for a kind the grid does not run."""
    if kind not in GRID_TERMS:
        raise ValueError(f"the process grid runs {' and '.join(GRID_TERMS)} layers, not {kind}; use a 1D plan "
                         f"(p2p) for {kind}")
    return GRID_TERMS[kind]


def rank_bytes(shape: GridShape, coords: dict[str, int], nodes: int, dims: tuple[int, ...],
               itemsize: int, terms: int = 1, input_once: bool = True, codec: Codec | None = None) -> dict[str, int]:
    """Bytes the rank at ``coords`` sends (and receives) in one epoch, by phase (:data:`PHASES`); ``terms``: see
    :func:`sparse_dist.grid_gcn.layer_collectives`; ``input_once``: layer 0's aggregation computed once a run
    (without dropout), not in every epoch; ``codec``: the step's messages coded."""
    step = step_bytes(shape, coords, nodes, dims, itemsize, terms, input_once, codec)
    loss = loss_bytes(shape, coords, len(dims) - 2, nodes, itemsize)
    return {"forward": step["forward"] - loss, "loss": loss, "backward": step["backward"],
            "grad_allreduce": step["grad_allreduce"]}


def busiest_rank_bytes(shape: GridShape, nodes: int, dims: tuple[int, ...], itemsize: int,
                       terms: int = 1, input_once: bool = True, codec: Codec | None = None) -> dict[str, int]:
    """:func:`rank_bytes` of the rank with the most bytes over every phase.

    A rank's bytes depend on its coordinate along an axis through the blocks split over it (longer below
    ``length % s``) and its chunk of the rings along it (smaller, so more bytes, at higher coordinates): within a
    run of coordinates whose blocks have the same lengths every term grows with the coordinate, so the last
    coordinate of each run, on every axis, holds the maximum."""
    candidates = [_run_ends(shape.of(axis), (nodes, *dims)) for axis in AXES]
    best: dict[str, int] = {}
    for x, y, z in itertools.product(*candidates):
        found = rank_bytes(shape, {"x": x, "y": y, "z": z}, nodes, dims, itemsize, terms, input_once, codec)
        if not best or sum(found.values()) > sum(best.values()):
            best = found
    return best


def all_ranks_bytes(shape: GridShape, nodes: int, dims: tuple[int, ...], itemsize: int,
                    terms: int = 1) -> dict[str, int]:
    """:func:`rank_bytes` summed over every rank of the grid."""
    out = dict.fromkeys(PHASES, 0)
    for z, y, x in itertools.product(range(shape.z), range(shape.y), range(shape.x)):
        for phase, value in rank_bytes(shape, {"x": x, "y": y, "z": z}, nodes, dims, itemsize, terms).items():
            out[phase] += value
    return out


def _run_ends(size: int, lengths: tuple[int, ...]) -> list[int]:
    """The last coordinate of each run of equal block lengths along an axis of ``size`` ranks, for every length
    split over it (the first ``length % size`` blocks are one longer)."""
    return sorted({size - 1} | {length % size - 1 for length in lengths if length % size})


@dataclass(frozen=True)
class AxisNetwork(Network):
    """The network as one axis of a grid sees it: its ranks ``stride`` apart (module docstring).

    ``ranks``: the job's ranks (how many share a node). An axis of ``s`` ranks with ``m`` on one node runs on
    node at ``m >= s``; else off node for the share ``(s - m) / (s - 1)`` of its bytes, at ``beta_inter`` times
    the node's ranks over its NICs (each of them is in an allreduce of its own along the same axis)."""

    stride: int = 1
    ranks: int = 1

    def link(self, group_size: int) -> tuple[float, float]:
        node = min(self.ranks_per_node, self.ranks)
        together = min(group_size, max(1, node // self.stride))
        if together >= group_size:
            return self.alpha_intra, self.beta_intra
        off_node = (group_size - together) / (group_size - 1)
        return self.alpha_inter, max(self.beta_intra, self.beta_inter * node / self.nics_per_node * off_node)

    @classmethod
    def of(cls, net: Network, shape: GridShape, axis: str) -> "AxisNetwork":
        stride = {"x": 1, "y": shape.x, "z": shape.x * shape.y}[axis]
        return cls(**{f.name: getattr(net, f.name) for f in fields(Network)}, stride=stride, ranks=shape.size)


@dataclass(frozen=True)
class GridEpoch:
    """One epoch on one grid: the busiest rank's bytes by phase, and the slowest rank's seconds."""

    shape: GridShape
    bytes: dict[str, int]
    compute_spmm: float
    compute_dense: float
    exchange: float         # the layers' forward and backward allreduces and the loss's
    allreduce: float        # the gradient allreduces
    compute_elementwise: float = 0.0  # the bias, ReLU and loss passes over the rank's output blocks

    @property
    def compute(self) -> float:
        return self.compute_spmm + self.compute_dense + self.compute_elementwise

    @property
    def epoch(self) -> float:
        return self.compute + self.exchange + self.allreduce

    @property
    def plan(self) -> str:
        return f"{GRID_PLAN}{self.shape}"

    @property
    def exchange_bytes(self) -> int:
        """The busiest rank's bytes outside the gradient allreduce (the 1D plans' exchange)."""
        return self.bytes["forward"] + self.bytes["loss"] + self.bytes["backward"]


def predict_grid_epoch(shape: GridShape, nodes: int, nnz: int, dims: tuple[int, ...], itemsize: int, rates: Rates,
                       net: Network, threads: int = 1, terms: int = 1, input_once: bool = True,
                       codec: Codec | None = None) -> GridEpoch:
    """One epoch of widths ``dims`` on ``shape`` (module docstring; ``terms``: GCN 1, SAGE 2): the slowest
    rank's, whose blocks are the longest on every axis (coordinates 0). ``input_once``: layer 0's aggregation
    computed once a run (False: in every epoch, as with dropout). ``codec``: the step's messages coded
    (``train --grid ... --compress F``, :mod:`sparse_dist.grid_links`): a coded allreduce is two alltoallvs, priced
    as ``2 (s - 1)`` latencies and its coded bytes at beta; its coding's compute is not priced."""
    ranks = shape.size
    axis_net = {axis: AxisNetwork.of(net, shape, axis) for axis in AXES}
    first = dict.fromkeys(AXES, 0)

    def one(sent: Collective) -> float:
        group = shape.of(sent.axis)
        if codec is None or MESSAGES[sent.message] is None or group == 1:
            return allreduce_time(sent.numel * itemsize, group, axis_net[sent.axis])
        alpha, beta = axis_net[sent.axis].link(group)
        coded = allreduce_message_bytes(codec, sent.message, group, first[sent.axis], sent.rows, sent.width, itemsize)
        return 2 * (group - 1) * alpha + coded * beta

    def seconds(collectives: list[Collective], phases: tuple[str, ...]) -> float:
        return sum(one(sent) for sent in collectives if sent.phase in phases)

    spmm = dense = passes = exchange = gradients = 0.0
    last = len(dims) - 2
    for layer in range(len(dims) - 1):
        outer, inner, depth = roles(layer)
        n_depth = _longest(nodes, shape.of(depth))
        f_inner, f_out = _longest(dims[layer], shape.of(inner)), _longest(dims[layer + 1], shape.of(outer))
        entries = _longest(nnz + nodes, shape.of(depth) * shape.of(outer))
        once = layer == 0 and input_once
        spmm += entries * f_inner * (2 if layer > 0 else 1) if not once else 0  # layer 0: no input gradient
        dense += n_depth * terms * f_inner * f_out
        passes += n_depth * f_out * (LOSS_PASSES if layer == last else OUTPUT_PASSES)
        collectives = layer_collectives(shape, first, layer, nodes, dims[layer], dims[layer + 1], layer > 0,
                                        aggregated_once=once, terms=terms)
        exchange += seconds(collectives, ("forward", "backward"))
        gradients += seconds(collectives, ("grad_allreduce",))
    exchange += seconds(loss_collectives(shape, first, len(dims) - 2, nodes), ("forward",))
    slowdown = shared_memory_slowdown(net, ranks, threads)
    cores = cores_per_rank(net, ranks, threads)
    return GridEpoch(shape, busiest_rank_bytes(shape, nodes, dims, itemsize, terms, input_once, codec),
                     spmm / (rates.spmm * cores),
                     dense / (rates.dense * cores), exchange * slowdown, gradients * slowdown,
                     passes / (rates.elementwise * cores) if rates.elementwise > 0 else 0.0)


def _longest(length: int, parts: int) -> int:
    """The longest of ``parts`` blocks of ``length`` (the first)."""
    return -(-length // parts)


def choose_grid(ranks: int, candidates: list[GridShape], nodes: int, nnz: int, dims: tuple[int, ...], itemsize: int,
                rates: Rates, net: Network, threads: int = 1, terms: int = 1,
                input_once: bool = True, codec: Codec | None = None) -> list[GridEpoch]:
    """Every candidate priced (:func:`predict_grid_epoch`), fastest first (then fewest bytes of the busiest rank,
    then the shape)."""
    priced = [predict_grid_epoch(shape, nodes, nnz, dims, itemsize, rates, net, threads, terms, input_once,
                                 codec) for shape in candidates]
    return sorted(priced, key=lambda e: (e.epoch, sum(e.bytes.values()), (e.shape.x, e.shape.y, e.shape.z)))


__all__ = ["AUTO", "AxisNetwork", "GRID_PLAN", "GRID_TERMS", "GridEpoch", "LOSS_PASSES", "OUTPUT_PASSES", "PHASES",
           "all_ranks_bytes", "busiest_rank_bytes", "choose_grid", "factorisations", "grid_shapes", "grid_terms",
           "is_grid_plan", "parse_grid_plan", "predict_grid_epoch", "rank_bytes", "split_plans"]
