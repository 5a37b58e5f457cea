"""Performance model: epoch time and bytes per rank of one configuration at any P, without running it.

Epoch time = slowest rank's compute + exchange + gradient allreduce (no
overlap assumed, so it is an upper estimate where MPI progresses in the
background), except for a pipelined policy (``pipe``), whose exchange overlaps
the compute: max(compute, exchange) + allreduce. Compression (``--compress``)
scales every exchanged row to the bytes its codec sends. The cycle (a step and
its evaluation, what time-to-accuracy adds up) adds an exact forward after the
step or beside the next one (:func:`predict_evaluation`, :func:`predict_cycle`).

**Workload** (:class:`~runners.perf.workload.Workload`, measured from shards or expected for a partition
model): :mod:`runners.perf.workload`.

**Process grids** (``cost predict --plans grid:X,Y,Z``, ``grid:auto``): :mod:`runners.perf.grid_model`, at the
same rates and network figures.

**Compute** (:class:`Rates`, per core): local SpMM costs
``nnz * width`` per multiply (forward, and transpose where the layer needs
a gradient; sampled remote columns count ``p`` times); everything else
("dense": weight multiplies, dropout, loss, optimiser) costs
``rows * sum_l dense_work_l``, each layer kind's own multiply-adds per row
(``weight_matrices * F_in * F_out`` for an SpMM layer; :meth:`algorithms.layers.GraphLayer.dense_work`). Both rates come from a measured calibration
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

from dataclasses import dataclass, field, replace

import numpy as np

from algorithms.layers import LayerOptions, layer_type
from algorithms.model import LayerFigures, layer_figures
from algorithms.policies import AxisSpec, PolicySpec
from runners.perf.workload import (PairCounts, Workload, pair_counts, workload_analytic,  # noqa: F401 (callers)
                                   workload_from_shards)
from sparse_dist.layout import Grid, RowLayout
from sparse_dist.compress import Codec
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
    elementwise: float = 0.0  # the grid's elementwise passes: values per core-second (0: not priced)


@dataclass(frozen=True)
class ModelShape:
    """What a training epoch computes: layer widths, model kind, element size, and how layers exchange.

    ``dims``: the model's ``dims`` (:class:`algorithms.model.GraphModel`); ``options`` its layer options. Every
    width, parameter count and dense work is the layer kind's own answer (:func:`algorithms.model.layer_figures`).
    ``input_once``: layer 0 reads X's halo kept since the start and exchanges nothing
    (:mod:`algorithms.static_input`); ``receiver_dropout``: exchanges carry pre-dropout rows, so every
    exchanging layer aggregates first (width ``F_in``).
    """

    dims: tuple[int, ...]
    kind: str = "gcn"
    itemsize: int = 4
    input_once: bool = False
    receiver_dropout: bool = False
    options: LayerOptions = LayerOptions()

    @property
    def layers(self) -> list[LayerFigures]:
        return layer_figures(self.kind, self.dims, self.options)

    @property
    def exchanges(self) -> list[tuple[int, bool]]:
        """Per exchanging layer: (width exchanged, whether the transpose runs too), as :mod:`algorithms.model`
        orders them. Layer 0's transpose runs only where the layer says so (an SpMM layer: where it multiplies
        by ``W`` first; ``X`` needs no gradient)."""
        out = []
        for layer, figures in enumerate(self.layers):
            if layer == 0 and self.input_once:
                continue
            width, returns = figures.receiver if self.receiver_dropout else figures.owner
            out.append((width, layer > 0 or returns))
        return out

    @property
    def spmm_passes(self) -> int:
        """Columns the local SpMMs of one epoch multiply (forward, and transposes), over all layers: a layer
        that exchanges nothing (layer 0 from its halo) multiplies its local and halo columns all the same."""
        whole = replace(self, input_once=False).exchanges
        if self.input_once and whole:
            whole[0] = self.layers[0].owner
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
        return sum(figures.dense_work for figures in self.layers)

    @property
    def parameters(self) -> int:
        return sum(figures.parameters for figures in self.layers)


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


def predict_cycle(step: Prediction, evaluation: EvaluationCost, alongside: bool, every: float = 1) -> float:
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


def shared_memory_slowdown(net: Network, ranks: int, threads: int) -> float:
    """How much slower a job's communication runs than the network's figures: on one node MPI copies through
    shared memory with the ranks' own cores, so oversubscribed cores slow the copies (and the polling) as much
    as the compute; 1 off node."""
    if ranks > net.ranks_per_node:
        return 1.0
    return max(1.0, min(net.ranks_per_node, ranks) * threads / net.cores_per_node)


def predict_epoch(work: Workload, shape: ModelShape, plan: str, policy: ExpectedTraffic, rates: Rates, net: Network,
                  replication: int = 1, threads: int = 1) -> Prediction:
    """One epoch of ``plan`` with ``policy`` on ``work.groups * replication`` ranks."""
    groups, c = work.groups, replication
    ranks = groups * c
    grid = Grid(ranks, c)
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
    slowdown = shared_memory_slowdown(net, ranks, threads)
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
