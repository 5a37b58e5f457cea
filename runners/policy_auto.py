"""``train --policy auto``: the sampling and compression with the least predicted time to accuracy on this link
and these cores, chosen at set-up, before the trainer is built, and run guarded.

**What it measures** (collective, about a second plus the compute probes' 0.6 s of warm-up; every rank enters in
the same order):

* the link: chains of broadcasts of 8 bytes and 256 KiB over the replica column (the ranks that exchange rows),
  root alternating, the slowest rank's median of three; ``alpha`` from the small ones, ``beta`` from the large
  ones with MPICH's broadcast formulas, as ``sparse-dist bench network`` fits them. Under ``sparse-dist
  emulate`` that is the emulated link;
* the cores (on the run's device: a GPU where the run trains on one), on up to 16,384 of this rank's own
  rows: the local SpMM (those rows times its own columns, at the hidden width), and layer 0's dense work
  (dropout, ``X W``, ReLU, forward and backward), timed while every rank times its own, so oversubscribed
  cores count, after a barrier and before the link, each warmed up first (:data:`WARM_UP_SECONDS`); the median
  rank's rates (one rank's probe can run 10x slow for a second on oversubscribed cores, and the slowest rank's
  would price every step by that);
* each codec's cost: encoding with error feedback and decoding a block of rows at the hidden width (int4 for
  ``adaptive``, the width its hidden rows take; :mod:`sparse_dist.compress`);
* the workload: each rank's rows, its entries with local and remote columns and ``|B_ij|`` from its adjacency
  rows (one allgather); ``|B_j|`` only for a plan that sends it (one allreduce of a byte a column).

**What it predicts**: per candidate, the cost model's step (:func:`runners.perf.cost_model.predict_epoch`:
compute, exchange and gradient allreduce) plus the codec's seconds for the values the busiest rank codes, and
the cycle with the run's evaluation schedule (:func:`~runners.perf.cost_model.predict_cycle`); the time to
accuracy is that cycle times the candidate's epochs to accuracy against exact's (:data:`EPOCH_FACTORS`,
measured, multiplied across axes). The plan stays the one given (``p2p`` by default; ``cover`` needs its
covers, computed by the run itself, so auto refuses it; ``sparse-dist cost predict`` ranks plans).

**Candidates**: sampling ``none``, ``bns:keep=0.1``, ``psc:budget=0.1`` crossed with compression ``none``,
``int8,feedback``, ``adaptive,feedback`` (those the plan runs), each evaluated on the run's plan and from the
receptive field (``--evaluation-plan field``: no exchange an evaluation, the field's compute,
:mod:`runners.perf.field_cost`) where the model takes it, ``--evaluation-plan`` was left as it is, and every
rank's field, bounded from above, fits :data:`FIELD_SHARE` of its free memory. Left out, by measurement: ``pipe`` (guarded
pipe at P = 4 on the 200k synthetic never reached 0.69 validation accuracy, and it cannot be steered),
``fp16`` (25 epochs to 0.69 against exact's 15 at P = 4), ``dgs`` (its step is 1.7x exact's), ``sancus``
(broadcast plans only, slower than ``p2p`` here).

The choice is the same on every rank (computed from agreed figures); rank 0 prints it and the runner-up, one
line each, and the results file's set-up record holds every candidate's prediction.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from algorithms.policies import AxisSpec, PolicySpec, RunShape
from algorithms.layers import layer_type
from algorithms.training.config import TrainConfig, evaluation_plan_refusal
from algorithms.training.graph import LocalGraph
from runners.bench.network import broadcast_seconds, fit_alpha_beta
from runners.perf.cost_model import (ExpectedTraffic, ModelShape, Rates, predict_cycle, predict_epoch,
                                     predict_evaluation)
from runners.perf.field_cost import field_memory, predict_field_evaluation
from runners.perf.workload import Workload, entry_counts
from sparse_dist.comm import Communicator
from sparse_dist.compress import Codec
from sparse_dist.cost import Network
from sparse_dist.csr import csr_tensor
from sparse_dist.plans import plan_class

SAMPLES = ("none", "bns:keep=0.1", "psc:budget=0.1")
CODECS = ("none", "int8,feedback", "adaptive,feedback")
# epochs to 0.69 validation accuracy against exact's on the 200k synthetic (METIS), P = 2 and 4 (docs/results.md:
# "Guarded time to accuracy at 1 Gbit/s", "Adaptive bit widths"): bns 16 and 15 against 15 and 15, psc 15 and 18,
# int8 with feedback 18 and 16, adaptive 16 at P = 4. A sampled, compressed run multiplies its axes' factors.
EPOCH_FACTORS = {"none": 1.0, "bns:keep=0.1": 1.03, "psc:budget=0.1": 1.10, "int8,feedback": 1.13,
                 "adaptive,feedback": 1.07}
_SMALL, _LARGE = 8, 1 << 18  # the large size above MPICH's short broadcast (12 KiB): 0.8 MiB over 3 repeats
_PROBE_ROWS = 16_384  # rows of this rank the compute probes multiply (a 100k-row rank's full probe took 1.8 s)
_CODEC_PROBE_ROWS = 4096
WARM_UP_SECONDS = 0.3
"""How long each compute probe runs untimed first. R-MAT SCALE 18 at P = 4 (four ranks on two cores, 200 Mbit/s
emulated): probed cold and after the link's broadcasts, the local SpMM ran at 0.5-0.9e8 entry-columns a second
(six runs) where the same probe warmed for 0.3 s and before the link ran at 7.0-9.3e8, and auto printed steps of
7.1-7.7 s for steps that took 1.5-1.7 s (docs/results.md, "What `--policy auto` predicts")."""


@dataclass(frozen=True)
class Candidate:
    """One configuration and what the model predicts for it (seconds)."""

    sample: str
    compress: str
    step: float
    cycle: float
    factor: float
    evaluation: str = "same"  # --evaluation-plan: on the run's plan ("same"), the user's "cover", or "field"

    @property
    def time_to_accuracy(self) -> float:
        """Predicted seconds to accuracy in units of exact's epochs to it."""
        return self.cycle * self.factor

    @property
    def text(self) -> str:
        flags = [f"--sample {self.sample}" if self.sample != "none" else "",
                 f"--compress {self.compress}" if self.compress != "none" else "",
                 f"--evaluation-plan {self.evaluation}" if self.evaluation != "same" else ""]
        return " ".join(flag for flag in flags if flag) or "exact"

    def line(self, exact: "Candidate") -> str:
        return (f"{self.text}: step {self.step:.3g} s, cycle {self.cycle:.3g} s x {self.factor:.2f} (its epochs to "
                f"accuracy against exact's) = {self.time_to_accuracy / exact.time_to_accuracy:.2f}x exact's time")

    def record(self) -> dict[str, Any]:
        return {"sample": self.sample, "compress": self.compress, "evaluation_plan": self.evaluation,
                "step": self.step, "cycle": self.cycle, "epochs_factor": self.factor,
                "time_to_accuracy": self.time_to_accuracy}


@dataclass(frozen=True)
class Measured:
    """The set-up's measurements, the same on every rank."""

    alpha: float
    beta: float
    rates: Rates
    codec_seconds: dict[str, float]  # per value coded (encode with feedback, decode)

    def record(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "beta": self.beta, "gb_per_s": 1e-9 / self.beta, "spmm_rate": self.rates.spmm,
                "dense_rate": self.rates.dense, "codec_seconds_per_value": self.codec_seconds}


def auto_problem(args: Any) -> str | None:
    """Why ``--policy auto`` cannot run with these flags (before MPI starts), or None."""
    if args.policy != "auto":
        return None
    given = [flag for flag, value in (("--sample", str(args.sample)), ("--stale", str(args.stale)),
                                      ("--compress", args.compress)) if value != "none"]
    if given:
        return f"--policy auto chooses the sampling and compression itself; leave {' and '.join(given)} out"
    if plan_class(args.plan).pair_counted:
        return (f"--policy auto prices the plan's bytes before the run, which --plan {args.plan} knows only from the "
                f"covers the run computes; use p2p, sparse-bcast or dense-bcast")
    if args.minibatch is not None:
        return "--policy auto is for full-graph training (mini-batch runs exchange no boundary rows to save)"
    return None


def choose(comm: Communicator, col_comm: Communicator, graph: LocalGraph, config: TrainConfig, threads: int,
           device: torch.device | str = "cpu",
           free_per_rank: float | None = None) -> tuple[TrainConfig, dict[str, Any], list[str]]:
    """The configuration to run, the set-up record's ``policy_auto`` and the two lines rank 0 prints
    (collective over ``comm``; ``col_comm`` is the replica column, the ranks that exchange rows).
    ``free_per_rank``: the bytes a rank may add beyond the run's estimate, the same on every rank
    (:func:`runners.resources.free_memory_per_rank`); None: evaluations from the receptive field are not
    weighed."""
    measured = measure(comm, col_comm, graph, config, threads, torch.device(device))
    work = workload(col_comm, graph, config.plan)
    room = FIELD_SHARE * free_per_rank if free_per_rank is not None else None
    candidates = rank_candidates(work, model_shape(graph, config), config, measured, threads,
                                 nodes=graph.layout.n_rows, field_room=room)
    best, runner_up, exact = candidates[0], candidates[1], _exact(candidates)
    chosen = replace(config, sample=AxisSpec.parse("sample", best.sample), compress=best.compress,
                     evaluation_plan=best.evaluation)
    lines = [f"policy auto: chose {best.line(exact)}",
             f"policy auto: runner-up {runner_up.line(exact)} (link {measured.alpha * 1e6:.0f} us, "
             f"{1e-9 / measured.beta:.3g} GB/s)"]
    record = {"chosen": best.record(), "measured": measured.record(),
              "candidates": [candidate.record() for candidate in candidates]}
    return chosen, record, lines


def rank_candidates(work: Workload, shape: ModelShape, config: TrainConfig, measured: Measured,
                    threads: int, nodes: int = 0, field_room: float | None = None) -> list[Candidate]:
    """Every candidate the plan runs, least predicted time to accuracy first (ties: the listed order), each with
    its evaluations on the run's plan and, where :func:`field_evaluations_allowed`, from the receptive field."""
    net = Network("measured", measured.alpha, measured.beta, measured.alpha, measured.beta, ranks_per_node=1,
                  cores_per_node=threads)
    evaluations = {}
    if config.evaluation_plan != "field":  # "same", or the user's "cover" (priced on --plan: its covers are unknown)
        evaluations[config.evaluation_plan] = predict_evaluation(work, shape, config.plan, measured.rates, net,
                                                                 config.replication, threads)
    if field_evaluations_allowed(work, shape, config, nodes, field_room):
        evaluations["field"] = predict_field_evaluation(work, shape, measured.rates, net, nodes, threads)
    run = RunShape(plan=config.plan, replication=config.replication, model=config.model,
                   dropout_side=config.dropout_side, input_exchange=config.input_exchange)
    out = []
    for sample in SAMPLES:
        policy = PolicySpec(AxisSpec.parse("sample", sample), AxisSpec("stale"))
        if policy.refusal(run) is not None:
            continue
        shape = replace(shape, input_once=layer0_once(policy, config))
        plain = predict_epoch(work, shape, config.plan, ExpectedTraffic.of(policy), measured.rates, net,
                              config.replication, threads)
        # the busiest rank encodes what it sends and decodes what it receives: half of both, at the measured
        # seconds of one value's encoding and decoding
        coded_values = plain.exchange_bytes_max_rank / shape.itemsize / 2
        for compress in CODECS:
            codec = Codec.parse(compress)
            step = predict_epoch(work, shape, config.plan, ExpectedTraffic.of(policy, codec=codec), measured.rates,
                                 net, config.replication, threads)
            coding = coded_values * measured.codec_seconds.get(compress, 0.0)
            step = replace(step, compute_dense=step.compute_dense + coding)
            factor = EPOCH_FACTORS[sample] * EPOCH_FACTORS[compress]
            for plan, evaluation in evaluations.items():
                cycle = predict_cycle(step, evaluation, config.overlap_evaluation, every=max(1, config.eval_every))
                out.append(Candidate(sample, compress, step.epoch, cycle, factor, plan))
    return sorted(out, key=lambda candidate: candidate.time_to_accuracy)


FIELD_SHARE = 0.5
"""The share of a rank's free memory (its node's available memory beyond the run's estimates, split over the
node's ranks) that the receptive field's bound (:func:`runners.perf.field_cost.field_memory`) may take for
``auto`` to consider it: the bound is above what the field holds (1.9x on the 200k synthetic), and the rest is
the run's margin."""


def field_evaluations_allowed(work: Workload, shape: ModelShape, config: TrainConfig, nodes: int,
                              field_room: float | None) -> bool:
    """Whether ``auto`` weighs evaluations from the receptive field: the user left ``--evaluation-plan`` to it (or
    asked for the field), the model and plan take it, and every rank's field, bounded from above with references
    kept (the guard reads them), fits ``field_room`` bytes (None: unknown, not weighed)."""
    if config.evaluation_plan not in ("same", "field") or nodes <= 0 or config.replication != 1:
        return False
    if evaluation_plan_refusal("field", config.model, layer_type(config.model).takes_operator) is not None:
        return False
    if config.evaluation_plan == "field":
        return True  # asked for: priced as it will run
    return field_room is not None and float(field_memory(work, shape, nodes, references=True).max()) <= field_room


def _exact(candidates: list[Candidate]) -> Candidate:
    """The exact configuration every line compares with: no sampling, no compression, evaluated on the run's
    plan (from the field where only the field is priced)."""
    plain = [c for c in candidates if c.sample == "none" and c.compress == "none"]
    return next((c for c in plain if c.evaluation == "same"), plain[0])


def model_shape(graph: LocalGraph, config: TrainConfig) -> ModelShape:
    """The widths the run's model exchanges, layer 0 every epoch (:func:`rank_candidates` prices each candidate
    with layer 0 as it will run)."""
    dims = tuple([graph.features.shape[1]] + [config.hidden] * (config.layers - 1) + [graph.num_classes])
    return ModelShape(dims, kind=config.model, itemsize=4 if config.dtype == "float32" else 8,
                      options=config.layer_options())


def layer0_once(policy: PolicySpec, config: TrainConfig) -> bool:
    """Whether layer 0 will read X's halo fetched once: unless asked per epoch or the sampler feeds layer 0
    itself (psc's feature cache); ``auto`` takes ``once`` where it moves fewer bytes over the run, which it
    does for any run of more than a few epochs (X's boundary rows once against layer 0's rows every epoch)."""
    sampler = policy.sample.policy
    return config.input_exchange != "per-epoch" and not (sampler is not None and sampler.feeds_layer0)


# ------------------------------------------------------------------ measurements
def measure(comm: Communicator, col_comm: Communicator, graph: LocalGraph, config: TrainConfig,
            threads: int, device: torch.device = torch.device("cpu")) -> Measured:
    """The cores and the codecs, then the link (collective over ``comm``: the link's figures agreed as the slowest
    rank's, the rates and codec costs as the median rank's). The compute probes come first, all ranks together
    after a barrier, each warmed up for :data:`WARM_UP_SECONDS`: after the link's broadcasts, ranks still waiting
    in them spin beside the others' probes, and a cold probe runs several times slower than the step it prices."""
    comm.idle_barrier()  # the ranks that loaded their shards first sleep instead of spinning
    spmm, dense = _compute_seconds(graph, config, col_comm.rank, device)
    codec = {text: _codec_seconds(text, config.hidden, device) for text in CODECS if text != "none"}
    alpha, beta = link(col_comm) if col_comm.size > 1 else (0.0, 1e-12)
    per_core = [units / seconds / threads if seconds > 0 else 1e12 for seconds, units in (spmm, dense)]
    local = np.array([alpha, beta, *per_core, *codec.values()], dtype=np.float64)
    gathered = comm.allgather_array(local)
    slowest, median = gathered.max(axis=0), np.median(gathered, axis=0)
    rates = Rates(spmm=float(median[2]), dense=float(median[3]), source="measured at set-up by --policy auto")
    return Measured(float(slowest[0]), float(slowest[1]), rates, dict(zip(codec, map(float, median[4:]))))


def link(comm: Communicator, repeats: int = 3) -> tuple[float, float]:
    """``(alpha, beta)`` of ``comm`` from chains of broadcasts, fitted as ``sparse-dist bench network`` fits
    them (:mod:`runners.bench.network`); collective."""
    rows = [(size, broadcast_seconds(comm, size, chain, repeats)) for size, chain in ((_SMALL, 20), (_LARGE, 3))]
    alpha, beta = fit_alpha_beta(rows, comm.size, large_from=_LARGE)
    return alpha, max(beta, 1e-12)


def _compute_seconds(graph: LocalGraph, config: TrainConfig, group: int,
                     device: torch.device = torch.device("cpu")) -> tuple[tuple[float, float], tuple[float, float]]:
    """``((seconds, nnz * width), (seconds, rows * F_in * F_out))`` of this rank's local SpMM (row group
    ``group``: its rows times its own columns) and layer 0's dense work (median of three after one untimed)."""
    rows = graph.rows[:_PROBE_ROWS]
    lo = int(graph.layout.offsets[group])
    local = rows[:, lo:lo + graph.rows.shape[0]].tocsr()
    width = config.hidden
    matrix = csr_tensor(torch.from_numpy(local.indptr.astype(np.int64)),  # torch's beta notices silenced
                        torch.from_numpy(local.indices.astype(np.int64)),
                        torch.ones(local.nnz, dtype=torch.float32), local.shape).to(device)
    dense = torch.randn(local.shape[1], width, device=device)
    spmm = median_seconds(lambda: torch.sparse.mm(matrix, dense), device, warm_up=WARM_UP_SECONDS)
    features = torch.from_numpy(np.asarray(graph.features[:_PROBE_ROWS], dtype=np.float32)).to(device)
    weight = torch.randn(features.shape[1], width, requires_grad=True, device=device)

    def layer() -> None:
        out = torch.relu(torch.nn.functional.dropout(features, config.dropout, training=True) @ weight)
        out.sum().backward()

    dense_seconds = median_seconds(layer, device, warm_up=WARM_UP_SECONDS)
    return ((spmm, float(local.nnz) * width),
            (dense_seconds, float(features.shape[0]) * features.shape[1] * width))


def _codec_seconds(text: str, width: int, device: torch.device = torch.device("cpu")) -> float:
    """Seconds a value of ``text``'s codec costs to encode (with its feedback) and decode, at ``width``."""
    codec = Codec.parse(text)
    assert codec is not None
    coded = codec.at(1, "rows") if not codec.adapts else Codec("int4", feedback=codec.feedback)
    rows = torch.randn(_CODEC_PROBE_ROWS, width, generator=torch.Generator().manual_seed(0)).to(device)

    def both() -> None:
        coded.decode(coded.send(rows, (0, "rows", 0), rows.shape[0], None), width, torch.float32)

    return median_seconds(both, device) / rows.numel()


def median_seconds(work: Any, device: torch.device = torch.device("cpu"), repeats: int = 3,
                   warm_up: float = 0.0) -> float:
    """The median wall time of ``work`` (its kernels waited for on a GPU) after it ran untimed once, and again
    until ``warm_up`` seconds have passed."""
    def waited() -> None:
        work()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    started = time.perf_counter()
    waited()
    while time.perf_counter() - started < warm_up:
        waited()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        waited()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def workload(col_comm: Communicator, graph: LocalGraph, plan: str) -> Workload:
    """The run's :class:`Workload` from every rank's adjacency rows (collective over the replica column): rows,
    entries with local columns (plus the self-loops normalisation adds where a row lacks one) and remote ones,
    ``|B_ij|`` (row ``i`` from group ``i``'s rows), ``|B_j|`` where the plan sends it."""
    offsets = np.asarray(graph.layout.offsets, dtype=np.int64)
    groups, me = col_comm.size, col_comm.rank
    lo, hi = int(offsets[me]), int(offsets[me + 1])
    rows = graph.rows.tocsr()
    columns = np.asarray(rows.indices, dtype=np.int64)
    distinct = np.unique(columns[(columns < lo) | (columns >= hi)])
    owner = np.searchsorted(offsets, distinct, side="right") - 1
    mine = np.concatenate([[rows.shape[0], *entry_counts(columns, rows.indptr, lo, lo, hi)],
                           np.bincount(owner, minlength=groups)])
    table = col_comm.allgather_array(mine.astype(np.int64))
    boundary = table[:, 3:]
    union = boundary.max(axis=0)  # a lower bound; exact below where the plan's bytes depend on it
    if plan_class(plan).sends_union:  # |B_j|: the rows of j some group needs, one byte a column
        needed = torch.zeros(int(offsets[-1]), dtype=torch.uint8)
        needed[torch.from_numpy(distinct)] = 1
        col_comm.allreduce_(needed, "other", op="max")
        wanted = np.flatnonzero(needed.numpy())
        union = np.bincount(np.searchsorted(offsets, wanted, side="right") - 1, minlength=groups)
    return Workload("run", table[:, 0], table[:, 1], table[:, 2], boundary, union)

def with_checkpoint_policies(config: TrainConfig, recorded: Any) -> TrainConfig:
    """``config`` with the sampling, staleness, compression and evaluation plan a checkpoint's configuration holds
    (a resumed ``--policy auto`` run keeps its first leg's choice); as it is where the checkpoint holds none."""
    if not isinstance(recorded, dict):
        return config
    evaluation = str(recorded.get("evaluation_plan", config.evaluation_plan))
    try:
        if evaluation_plan_refusal(evaluation, config.model, layer_type(config.model).takes_operator) is not None:
            return config
        return replace(config, sample=AxisSpec.parse("sample", str(recorded.get("sample", "none"))),
                       stale=AxisSpec.parse("stale", str(recorded.get("stale", "none"))),
                       compress=str(Codec.parse(str(recorded.get("compress", "none"))) or "none"),
                       evaluation_plan=evaluation)
    except ValueError:
        return config  # the fingerprint check then says what differs
