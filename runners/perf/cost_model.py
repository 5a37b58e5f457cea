"""Performance model: epoch time and bytes per rank of one configuration at any P, without running it.

Epoch time = slowest rank's compute + exchange + gradient allreduce (no
overlap assumed, so it is an upper estimate where MPI progresses in the
background), except for a pipelined policy (``pipe``), whose exchange overlaps
the compute: max(compute, exchange) + allreduce. Compression (``--compress``)
scales every exchanged row to the bytes its codec sends. The cycle (a step and
its evaluation, what time-to-accuracy adds up) adds an exact forward after the
step or beside the next one (:func:`predict_evaluation`, :func:`predict_cycle`).

**Workload** (:class:`Workload`): rows, nonzeros (local / remote columns)
and the boundary matrix ``|B_ij|`` per row group. Either measured exactly
from a prepared dataset (:func:`workload_from_shards`, merging shards as a
run would) or expected values for a partition model
(:func:`workload_analytic`): every node has the graph's mean degree ``d``
and each neighbour lies outside its part with probability ``cut``, spread
evenly over ``k`` neighbouring parts (``random``: ``cut = (P-1)/P``,
``k = P-1``). Then ``E|B_ij| = n_j (1 - (1 - cut/k)^d)`` for a neighbouring
part and ``E|B_j| = n_j (1 - (1 - cut)^d)``; because ``1 - (1-q)^d`` is
concave in ``d``, a skewed degree distribution gives fewer boundary rows,
so this is an upper estimate. The ``cover`` plan's rows per pair depend on the graph itself (a minimum
vertex cover of each block, :func:`pair_counts`), so it is priced from shards only
(``workload_from_shards(..., covers=True)``); an analytic workload refuses it.

**Compute** (:class:`Rates`, per core): local SpMM costs
``nnz * width`` per multiply (forward, and transpose where the layer needs
a gradient; sampled remote columns count ``p`` times); everything else
("dense": weight multiplies, dropout, loss, optimiser) costs
``rows * sum_l F_in*F_out``. Both rates come from a measured calibration
run; a rank's speed is its rate times its cores, ``min(threads,
cores_per_node / ranks_per_node)`` (linear in cores: optimistic for many
threads). On one node MPI copies through shared memory with the ranks'
cores, so oversubscription (more threads than cores) slows the exchanges
by the same factor.

**Network** (:class:`Network`, alpha-beta): ``alpha`` seconds per message,
``beta`` seconds per byte, on-node (``intra``) and off-node (``inter``);
off-node bandwidth is shared by the ranks of a node behind each NIC.
MPICH's algorithms: broadcast of ``m`` bytes over ``g`` ranks is binomial,
``ceil(log2 g) (alpha + m beta)``, below 12 KiB and scatter + ring allgather,
``(ceil(log2 g) + g - 1) alpha + 2 (g-1)/g m beta``, above; reduce is
costed as a broadcast; allreduce is recursive doubling below 2 KiB and
Rabenseifner, ``2 ceil(log2 g) alpha + 2 (g-1)/g m beta``, above;
alltoallv costs ``alpha`` per peer plus ``beta`` times the larger of the
bytes sent and received. SANCUS rules ``a`` and ``h`` add one small
allgather of flags per layer.

**Policies**: BNS sampling keeps a fraction ``p`` of boundary rows
(expected bytes scale by ``p``); a staleness policy sends a fraction
``active`` of the forward blocks (``sancus-e:eps=E``: ``1/(E+1)``; the
data-dependent rules take it from a measured run or an assumption).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from algorithms.layers import layer_type
from algorithms.policies import AxisSpec, PolicySpec
from runners.data.partition import BoundaryAccumulator
from runners.data.shards import part_file, read_meta
from sparse_dist.layout import Grid, RowLayout
from sparse_dist.compress import Codec
from sparse_dist.cover_sets import konig_cover
from sparse_dist.csr import entry_rows
from sparse_dist.cost import Network, allreduce_time, bcast_time, log2_steps
from sparse_dist.plans import plan_class
from sparse_dist.predict import predict_spmm_bytes

@dataclass(frozen=True)
class Rates:
    """Per-core compute rates from a calibration run."""

    spmm: float   # nnz * width per core-second
    dense: float  # rows * sum(F_in * F_out) per core-second
    source: str = ""
    policy: float = 0.0  # the policy's own compute (dgs's explanation): unsampled nnz * width per core-second


@dataclass(frozen=True)
class ModelShape:
    """What a training epoch computes: layer widths, model kind, element size, and how layers exchange.

    ``input_once``: layer 0 reads X's halo kept since the start and exchanges nothing
    (:mod:`algorithms.static_input`); ``receiver_dropout``: exchanges carry pre-dropout rows, so every
    exchanging layer aggregates first (width ``F_in``).
    """

    dims: tuple[int, ...]
    kind: str = "gcn"
    itemsize: int = 4
    input_once: bool = False
    receiver_dropout: bool = False

    @property
    def exchanges(self) -> list[tuple[int, bool]]:
        """Per exchanging layer: (width exchanged, whether the transpose runs too), as :mod:`algorithms.model`
        orders them. Layer 0's transpose runs only where it multiplies by ``W`` first (``X`` needs no gradient)."""
        out = []
        for layer, (f_in, f_out) in enumerate(zip(self.dims[:-1], self.dims[1:])):
            if layer == 0 and self.input_once:
                continue
            transform_first = f_out < f_in and not self.receiver_dropout
            out.append((f_out if transform_first else f_in, layer > 0 or transform_first))
        return out

    @property
    def spmm_passes(self) -> int:
        """Columns the local SpMMs of one epoch multiply (forward, and transposes), over all layers: a layer
        that exchanges nothing (layer 0 from its halo) multiplies its local and halo columns all the same."""
        whole = ModelShape(self.dims, self.kind, self.itemsize, False, self.receiver_dropout).exchanges
        if self.input_once and whole:
            f_in, f_out = self.dims[0], self.dims[1]
            whole[0] = (min(f_in, f_out), f_out < f_in)
        return sum(width * (2 if backward else 1) for width, backward in whole)

    @property
    def evaluation_exchanges(self) -> list[int]:
        """Widths of the evaluation's forward exchanges: :attr:`exchanges` without dropout (each layer transforms
        first where that narrows), exact and uncompressed."""
        return [width for width, _ in replace(self, receiver_dropout=False).exchanges]

    @property
    def evaluation_widths(self) -> list[int]:
        """Per layer, the width an evaluation's forward multiplies by ``Â``: its exchange width, and for layer 0
        with X's halo kept its local and halo columns at the same width, or 0 where the layer sees its input
        only through the product ``Â_ext X`` kept since the first evaluation."""
        widths = replace(self, input_once=False, receiver_dropout=False).evaluation_exchanges
        if self.input_once and widths and layer_type(self.kind).input_only_through_product:
            widths[0] = 0
        return widths

    @property
    def dense_work_per_row(self) -> int:
        factor = layer_type(self.kind).weight_matrices
        return factor * sum(a * b for a, b in zip(self.dims[:-1], self.dims[1:]))

    @property
    def parameters(self) -> int:
        factor = layer_type(self.kind).weight_matrices
        return sum(factor * a * b + b for a, b in zip(self.dims[:-1], self.dims[1:]))


@dataclass(frozen=True)
class ExpectedTraffic:
    """What a communication policy is expected to do to one epoch's exchanges."""

    sample_p: float = 1.0
    active: float = 1.0
    agreement: bool = False      # one allgather of flags per layer (sancus-a, sancus-h)
    skip_backward: bool = False  # stale blocks' gradients are dropped too
    overlapped: bool = False     # pipelined: the exchange runs while layers compute (pipe)
    codec: Codec | None = None   # compressed rows (``--compress``)

    def row_scale(self, width: int, itemsize: int) -> float:
        """Bytes a row of ``width`` travels as, over its uncompressed bytes."""
        return 1.0 if self.codec is None else self.codec.row_bytes(width) / (width * itemsize)

    @staticmethod
    def of(policy: PolicySpec, active: float | None = None, codec: Codec | None = None) -> "ExpectedTraffic":
        """From a parsed policy; ``active`` overrides (and, for a data-dependent rule, supplies) the share
        of forward blocks sent."""
        sampler = policy.sample.build()
        p = float(sampler.p) if sampler is not None else 1.0
        rule = policy.stale.build()
        if rule is None:
            return ExpectedTraffic(p, codec=codec)
        if rule.pipelined:  # every flight is sent, later: the exact bytes, overlapped from tau = 1 on
            return ExpectedTraffic(p, overlapped=rule.overlaps, codec=codec)
        if active is None:
            active = rule.scheduled_share()
            if active is None:
                raise ValueError(f"{policy.stale}: the share of active broadcasts is data-dependent; give it (--active)")
        return ExpectedTraffic(p, active, agreement=rule.agreement, skip_backward=bool(rule.skip_backward),
                               codec=codec)

    @staticmethod
    def from_specs(sample: str, stale: str, active: float | None = None) -> "ExpectedTraffic":
        """From ``--sample`` / ``--stale`` texts (parsed by :class:`algorithms.policies.AxisSpec`)."""
        return ExpectedTraffic.of(PolicySpec(AxisSpec.parse("sample", sample), AxisSpec.parse("stale", stale)), active)


@dataclass
class Workload:
    """Per row group: rows, nonzeros with local / remote columns, and ``|B_ij|``, ``|B_j|``."""

    name: str
    rows: np.ndarray
    nnz_local: np.ndarray
    nnz_remote: np.ndarray
    boundary: np.ndarray            # G x G, boundary[i, j] = |B_ij| (expected values allowed)
    union: np.ndarray               # |B_j|
    exact: bool = True
    notes: list[str] = field(default_factory=list)
    cover: np.ndarray | None = None  # G x G, |C_ij| + |R_ij| of the cover plan (from shards only, where asked)

    def pairs_for(self, plan: str) -> np.ndarray | None:
        """The rows per pair a ``pair_counted`` plan's byte model needs (None for the others)."""
        if not plan_class(plan).pair_counted:
            return None
        if self.cover is None:
            raise ValueError(f"{self.name}: the {plan} plan's bytes depend on the graph's covers; they are known "
                             f"only for a prepared dataset (workload_from_shards(..., covers=True))")
        return self.cover

    @property
    def groups(self) -> int:
        return int(self.rows.size)


def _merged_groups(data_dir: Path, groups: int) -> tuple[dict, int, np.ndarray]:
    """A prepared dataset's meta, its parts per row group and the groups' first rows (``groups + 1``)."""
    meta = read_meta(data_dir)
    if meta["num_parts"] % groups:
        raise ValueError(f"{data_dir}: {meta['num_parts']} parts cannot be merged into {groups} row groups")
    per_group = meta["num_parts"] // groups
    return meta, per_group, np.asarray(meta["row_offsets"][::per_group], dtype=np.int64)


def workload_from_shards(data_dir: str | Path, groups: int, self_loops: bool = True,
                         covers: bool = False) -> Workload:
    """Exact statistics of a prepared dataset run on ``groups`` row groups (its shards merged as a run does);
    ``covers``: also the cover plan's rows per pair (:func:`pair_counts`, a matching per pair)."""
    data_dir = Path(data_dir)
    meta, per_group, offsets = _merged_groups(data_dir, groups)
    accumulator = BoundaryAccumulator(offsets)
    nnz_local = np.zeros(groups, dtype=np.int64)
    nnz_remote = np.zeros(groups, dtype=np.int64)
    for g in range(groups):
        columns, loops = [], 0
        for index in range(g * per_group, (g + 1) * per_group):
            with np.load(data_dir / part_file(index), allow_pickle=False) as archive:
                indices, indptr = archive["indices"].astype(np.int64), archive["indptr"]
            first = meta["row_offsets"][index]
            rows_of = np.repeat(np.arange(indptr.size - 1) + first, np.diff(indptr))
            loops += int(np.unique(rows_of[indices == rows_of]).size)
            columns.append(indices)
        merged = np.concatenate(columns) if columns else np.empty(0, np.int64)
        accumulator.add_part(g, merged, 0)
        inside = (merged >= offsets[g]) & (merged < offsets[g + 1])
        missing_loops = (offsets[g + 1] - offsets[g] - loops) if self_loops else 0
        nnz_local[g] = int(inside.sum()) + missing_loops
        nnz_remote[g] = int((~inside).sum())
    union = np.bincount(accumulator._owner(np.flatnonzero(accumulator.needed)), minlength=groups)
    cover = pair_counts(data_dir, groups).cover if covers else None
    return Workload(meta["name"], np.diff(offsets), nnz_local, nnz_remote, accumulator.counts.copy(), union,
                    cover=cover)


# ---------------------------------------------------------------- the cover plan's pairs (single process)
# Per pair of row groups: |B_ij| (p2p's rows) and the cover's |C_ij| + |R_ij| (sparse_dist.cover_sets), one row
# group's rows in memory at a time; the input of the cover plan's byte model here and in ``sparse-dist cost bytes``.

@dataclass
class PairCounts:
    """``boundary[i, j] = |B_ij|`` (p2p's rows) and ``cover[i, j] = |C_ij| + |R_ij|`` of one partition."""

    layout: RowLayout
    boundary: np.ndarray
    cover: np.ndarray
    pre_aggregated: np.ndarray  # |R_ij|: rows sent as partial sums
    seconds: float              # covers' (matchings') time on this process


def _group_rows(data_dir: Path, meta: dict, first: int, last: int) -> sp.csr_matrix:
    """Parts ``first..last-1`` stacked: their CSR rows with global column ids."""
    pieces = []
    for index in range(first, last):
        with np.load(data_dir / part_file(index), allow_pickle=False) as archive:
            indptr, indices = archive["indptr"], archive["indices"].astype(np.int64)
        pieces.append(sp.csr_matrix((np.ones(indices.size), indices, indptr),
                                    shape=(indptr.size - 1, int(meta["num_nodes"]))))
    return sp.vstack(pieces, format="csr") if pieces else sp.csr_matrix((0, int(meta["num_nodes"])))


def pair_counts(data_dir: str | Path, groups: int) -> PairCounts:
    """Boundary and cover counts of a prepared dataset on ``groups`` row groups (its parts merged)."""
    data_dir = Path(data_dir)
    meta, per_group, offsets = _merged_groups(data_dir, groups)
    layout = RowLayout.from_counts([int(c) for c in np.diff(offsets)])
    boundary = np.zeros((groups, groups), dtype=np.int64)
    cover = np.zeros((groups, groups), dtype=np.int64)
    pre = np.zeros((groups, groups), dtype=np.int64)
    seconds = 0.0
    for g in range(groups):
        rows = _group_rows(data_dir, meta, g * per_group, (g + 1) * per_group)
        owners = np.searchsorted(offsets, rows.indices, side="right") - 1
        row_of_entry = entry_rows(rows.indptr)
        for j in range(groups):
            if j == g:
                continue
            keep = owners == j
            if not keep.any():
                continue
            cols = rows.indices[keep] - offsets[j]
            block = sp.csr_matrix((np.ones(cols.size), (row_of_entry[keep], cols)),
                                  shape=(rows.shape[0], int(offsets[j + 1] - offsets[j])))
            boundary[g, j] = np.unique(cols).size
            began = time.perf_counter()
            found = konig_cover(block)
            seconds += time.perf_counter() - began
            cover[g, j], pre[g, j] = found.size, found.rows.size
    return PairCounts(layout, boundary, cover, pre, seconds)




def workload_analytic(name: str, nodes: int, nnz: int, groups: int, cut: float | None = None,
                      neighbour_parts: int | None = None) -> Workload:
    """Expected statistics of an ``nnz``-entry graph on ``groups`` equal row groups (see the module doc)."""
    rows = np.full(groups, nodes // groups, dtype=np.int64)
    rows[: nodes % groups] += 1
    degree = nnz / nodes
    if cut is None:
        cut = (groups - 1) / groups
    k = min(neighbour_parts or groups - 1, groups - 1)
    boundary = np.zeros((groups, groups))
    union = np.zeros(groups)
    if groups > 1:
        q = cut / k
        reach = 1.0 - (1.0 - q) ** degree
        for i in range(groups):
            for step in range(1, k + 1):
                j = (i + step) % groups
                boundary[i, j] = rows[j] * reach
        union = rows * (1.0 - (1.0 - cut) ** degree)
    remote = np.round(rows * degree * (cut if groups > 1 else 0.0)).astype(np.int64)
    local = np.round(rows * degree).astype(np.int64) - remote + rows
    notes = [f"expected boundary of a partition with edge cut {cut:.3f} over {k} neighbouring part(s), "
             f"every node of mean degree {degree:.1f} (upper estimate)"]
    return Workload(name, rows, local, remote, boundary, union, exact=False, notes=notes)


@dataclass
class Prediction:
    """Predicted figures of one epoch: seconds, and exchange bytes (all ranks' sent; the busiest rank's
    sent + received; the most one rank receives)."""

    ranks: int
    plan: str
    compute_spmm: float
    compute_dense: float
    exchange: float
    allreduce: float
    exchange_bytes_total: float
    exchange_bytes_max_rank: float
    exchange_bytes_max_recv: float
    notes: list[str] = field(default_factory=list)
    overlapped: bool = False  # pipe: the exchange hides behind the compute where it is shorter
    compute_policy: float = 0.0  # the policy's own compute, an epoch on average (dgs's explanation)

    @property
    def epoch(self) -> float:
        compute = self.compute_spmm + self.compute_dense + self.compute_policy
        if self.overlapped:
            return max(compute, self.exchange) + self.allreduce
        return compute + self.exchange + self.allreduce


EVALUATION_DENSE_SHARE = 1.0 / 3.0
"""The evaluation's share of a training step's dense work: its forward GEMM, of the step's three per layer
(forward, and the backward's two)."""


@dataclass(frozen=True)
class EvaluationCost:
    """One evaluation (exact forward, no dropout, every split's metrics): the slowest rank's compute, and its
    forward exchanges' seconds on the link (exact rows, uncompressed, whatever the training policy)."""

    compute: float
    exchange: float
    hides_beside_step: bool = True  # its exchanges travel while a step beside it computes (the plan's)


def predict_evaluation(work: Workload, shape: ModelShape, plan: str, rates: Rates, net: Network,
                       replication: int = 1, threads: int = 1) -> EvaluationCost:
    """An evaluation of ``shape`` on ``work.groups * replication`` ranks.

    Compute: the forward's SpMMs over every (unsampled) entry at :attr:`ModelShape.evaluation_widths` at the
    step's SpMM rate, and its GEMMs at :data:`EVALUATION_DENSE_SHARE` of the step's dense work at its rate.
    (An evaluation's turns beside a step are no measure of its compute: they also wait for its exchanges.)"""
    groups, c = work.groups, replication
    grid = Grid(groups * c, c)
    cores = cores_per_rank(net, groups * c, threads)
    spmm = float(np.max(work.nnz_local + work.nnz_remote)) * sum(shape.evaluation_widths) / c / (rates.spmm * cores)
    dense = float(np.max(work.rows)) * shape.dense_work_per_row * EVALUATION_DENSE_SHARE / (rates.dense * cores)
    exchange = sum(_exchange_time(work, grid, plan, width * shape.itemsize, 1.0, net, "forward")
                   for width in shape.evaluation_exchanges)
    return EvaluationCost(spmm + dense, exchange, plan_class(plan).progresses_unattended)


def predict_cycle(step: Prediction, evaluation: EvaluationCost, alongside: bool, every: int = 1) -> float:
    """Seconds from one epoch's row to the next: a step and, every ``every`` epochs, an evaluation.

    After its step (``alongside`` False) an evaluation adds its compute and its exchanges. Beside the next
    step (``--overlap-evaluation``) it shares the rank's core and the node's link with that step. Its compute
    does not hide (one core a rank: the turns). Its exchanges hide in the step's compute where the plan's
    posted exchanges travel on their own (``p2p``); the cycle is then the longer of the step plus that compute
    and everything that crosses the link (the step's exchanges and allreduce, the evaluation's exchanges) plus
    that compute: the bound of a link-bound run (200 Mbit/s) and of ``pipe``, whose step leaves its flights to
    the evaluation's turns. A broadcast plan's evaluation exchanges wait for its turns (measured at 1 Gbit/s
    and 200 Mbit/s: its turns took the evaluation's compute plus its exchanges' link time), so they add to
    the cycle as after the step."""
    if not alongside or not evaluation.hides_beside_step:
        evaluated = step.epoch + evaluation.compute + evaluation.exchange
    else:
        on_link = step.exchange + step.allreduce + evaluation.exchange
        evaluated = max(step.epoch + evaluation.compute, on_link + evaluation.compute)
    return ((every - 1) * step.epoch + evaluated) / every


def cores_per_rank(net: Network, ranks: int, threads: int) -> float:
    """Cores one rank computes with: its threads, or its share of the node when oversubscribed."""
    share = net.cores_per_node / min(net.ranks_per_node, ranks)
    if net.machine_cores is not None:  # emulated nodes on one machine: its cores are all the ranks get
        share = min(share, net.machine_cores / ranks)
    return min(float(threads), share)


def predict_epoch(work: Workload, shape: ModelShape, plan: str, policy: ExpectedTraffic, rates: Rates, net: Network,
                  replication: int = 1, threads: int = 1) -> Prediction:
    """One epoch of ``plan`` with ``policy`` on ``work.groups * replication`` ranks."""
    groups, c = work.groups, replication
    ranks = groups * c
    grid = Grid(ranks, c)
    ranks_per_node = min(net.ranks_per_node, ranks)
    cores = cores_per_rank(net, ranks, threads)
    s = shape.itemsize
    sampled = policy.sample_p < 1.0

    # Compute: every rank of a row group multiplies its share of the row group's blocks.
    nnz = work.nnz_local + (policy.sample_p if sampled else 1.0) * work.nnz_remote
    passes = shape.spmm_passes
    spmm = float(np.max(nnz)) * passes / c / (rates.spmm * cores)
    # A policy's own compute (dgs's explanation: forward and backward passes over the unsampled blocks),
    # priced at the rate its calibration run gave it (an average epoch, so its schedule's share of epochs).
    units = float(np.max(work.nnz_local + work.nnz_remote)) * passes / c / cores
    policy_compute = units / rates.policy if rates.policy > 0 else 0.0
    dense = float(np.max(work.rows)) * shape.dense_work_per_row / (rates.dense * cores)

    # Bytes: the exact byte model scaled by the policy's expected fractions.
    layout = RowLayout.from_counts([int(r) for r in work.rows])
    keep = policy.sample_p if sampled else 1.0
    exchange = 0.0
    total_bytes = 0.0
    max_rank = np.zeros(ranks)
    received = np.zeros(ranks)
    for width, backward in shape.exchanges:
        backward_share = keep * (policy.active if policy.skip_backward else 1.0)
        fractions = [policy.active * keep] + ([backward_share] if backward else [])
        volume = predict_spmm_bytes(grid, layout, work.boundary, work.union, plan, width, s,
                                    pair_counts=work.pairs_for(plan))
        scale = policy.row_scale(width, s)  # compressed rows (the 1.5D completion is not compressed)
        for direction, fraction in zip(("forward", "backward"), fractions):
            per_rank = volume[direction].astype(float)
            if c > 1:  # the 1.5D partial-sum allreduce / block broadcast is not sampled or skipped
                extra = _replication_bytes(grid, layout, width, s, direction)
                per_rank = (per_rank - extra) * fraction * scale + extra
            else:
                per_rank = per_rank * fraction * scale
            total_bytes += float(per_rank[:, 0].sum())
            max_rank += per_rank.sum(axis=1)
            received += per_rank[:, 1]
            exchange += _exchange_time(work, grid, plan, width * s, fraction * scale, net, direction)
        if policy.agreement:
            exchange += log2_steps(groups) * net.link(groups)[0]
    grad_bytes = (shape.parameters + 1) * s
    allreduce = allreduce_time(grad_bytes, groups, net)
    if ranks <= net.ranks_per_node:
        # On one node MPI copies through shared memory with the ranks' own cores: oversubscribed cores
        # slow the copies (and the polling) as much as the compute.
        slowdown = max(1.0, ranks_per_node * threads / net.cores_per_node)
        exchange, allreduce = exchange * slowdown, allreduce * slowdown
    notes = list(work.notes)
    return Prediction(ranks, plan, spmm, dense, exchange, allreduce, total_bytes, float(max_rank.max()),
                      float(received.max()), notes, overlapped=policy.overlapped, compute_policy=policy_compute)


def _replication_bytes(grid: Grid, layout: RowLayout, width: int, itemsize: int, direction: str) -> np.ndarray:
    """The 1.5D part of :func:`predict_spmm_bytes` (no boundary traffic at all)."""
    zeros = np.zeros((grid.groups, grid.groups), dtype=np.int64)
    no_union = np.zeros(grid.groups, dtype=np.int64)
    return predict_spmm_bytes(grid, layout, zeros, no_union, "p2p", width, itemsize)[direction].astype(float)


def _exchange_time(work: Workload, grid: Grid, plan: str, row_bytes: int, fraction: float, net: Network,
                   direction: str) -> float:
    """One exchange: the plan's own alpha-beta cost, plus the 1.5D completion across the ``c`` replicas."""
    pairs = work.pairs_for(plan)
    seconds = plan_class(plan).exchange_seconds(work.rows, work.boundary if pairs is None else pairs, work.union, grid,
                                                row_bytes * fraction, net)
    if grid.replication > 1:
        widest = float(np.max(work.rows)) * row_bytes
        c = grid.replication
        seconds += allreduce_time(widest, c, net) if direction == "forward" else bcast_time(widest, c, net)
    return seconds
