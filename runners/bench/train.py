"""``sparse-dist bench train``: full training epochs of sparse-dist, next to PyG on the same graph.

Data: a prepared directory (``--data``), or ``--synthetic NODES``: rank 0
makes the planted-class graph exactly as ``sparse-dist prepare synthetic``
does (:func:`runners.data.datasets.planted_classes`, then
:func:`runners.data.shards.write_shards` with ``P`` block parts) into a
temporary directory under ``--scratch`` (which every rank must see), every
rank loads its part, and rank 0 removes the directory at the end.

First, rank 0 loads all parts and trains the same model on the whole graph
with the peer (``--peer``: PyG, :mod:`runners.bench.pyg_peer`, the default;
DGL, :mod:`runners.bench.train_dgl`) on the same device, with the threads of
all ranks, while the other ranks sleep in a non-spinning barrier; where the
peer's library does not import, or it has no layer of ``--layer-kind``, the
peer is skipped and the report says why. Then every rank trains with
:class:`algorithms.train.Trainer`. The peer's figures are under its name
(``pyg`` or ``dgl``), or ``{name}_skipped`` says why it did not run.

Each run does ``--warmup`` untimed epochs, then ``--epochs`` timed ones.
An epoch's time is measured around the trainer's step after a device
synchronisation and a barrier (so on CUDA the queued tail of the step is
counted); ``epoch_s`` is the median over timed epochs of the slowest rank.
The breakdown columns are, for each epoch, the slowest rank's trainer
figures (``local_spmm``, ``exchange``, ``exchange_wait``, ``allreduce``, ``allreduce_wait``: own seconds and
the wait for late partners, as in the results file, and, where the trainer
reports them, ``dropout`` and ``optimizer``), ``dense`` the rest of that
rank's epoch; each column is its median over epochs, so the columns need
not add up to ``epoch_s`` exactly (the JSON keeps every epoch's split).

Memory, per rank, over the timed epochs only: on CUDA the peak of
``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``; on
the CPU the peak resident set (``VmHWM``), reset by writing ``5`` to
``/proc/self/clear_refs`` just before the timed epochs, next to the
resident set at that moment (``before``) so the increase is visible. Where
the reset is refused or ``/proc`` is missing the peak is since process
start, and the report says so. Both include what the process already held
(Python, torch, the graph); rank 0 also keeps what the PyG run left behind
in its allocator and its imported modules.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from algorithms.layers import layer_type
from algorithms.model import MODEL_KINDS
from algorithms.train import LocalGraph, TrainConfig, Trainer
from runners.bench.train_peers import PEER_MAKERS, PEERS, peer_key
from runners.data.datasets import planted_classes
from runners.results import print_report
from runners.argtypes import add_renamed, at_least, probability
from runners.argtypes import seed as seed_number
from runners.train_flags import add_attention_arguments, attention_problem
from runners.data.shards import load_local_graph, write_shards
from sparse_dist.comm import Communicator, default_threads_per_rank, mpi_vendor_details
from sparse_dist.devices import rank_device, shared_gpu_note, synchronize
from sparse_dist.hostmem import freed_memory_state, huge_page_state
from sparse_dist.plans import PLAN_NAMES

TIME_PARTS = ("local_spmm", "exchange", "exchange_wait", "allreduce", "allreduce_wait", "masks", "dropout",
              "optimizer")  # "dense" is the rest
OPTIONAL_PARTS = ("masks", "dropout", "optimizer")  # shown only when the trainer reports them


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", help="dataset directory made by `sparse-dist prepare`")
    source.add_argument("--synthetic", type=at_least(2), metavar="NODES",
                        help="planted-class synthetic graph of NODES nodes (as `prepare synthetic`)")
    parser.add_argument("--degree", type=at_least(1), default=15, help="synthetic: out-edges per node")
    parser.add_argument("--features", type=at_least(1), default=128, help="synthetic: feature width")
    parser.add_argument("--classes", type=at_least(2), default=47, help="synthetic: number of classes")
    parser.add_argument("--scratch", default=None,
                        help="synthetic: directory for the temporary shards, visible to every rank "
                             "(default: the system temporary directory)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one GPU per rank, cuda:(rank mod visible GPUs)")
    add_renamed(parser, "--layer-kind", "--model", dest="model", choices=MODEL_KINDS, default="gcn",
                help="the kind of every layer (default: %(default)s; --model is its old name)")
    parser.add_argument("--layers", type=at_least(1), default=3)
    parser.add_argument("--hidden", type=at_least(1), default=128, help="hidden width (gat: per head)")
    parser.add_argument("--dropout", type=probability, default=0.5)
    add_attention_arguments(parser, {"heads": 1, "output_heads": 1, "attention_dropout": 0.0})
    parser.add_argument("--plan", choices=PLAN_NAMES, default="p2p")
    parser.add_argument("--epochs", type=at_least(1), default=10, help="timed epochs")
    parser.add_argument("--warmup", type=at_least(0), default=2, help="untimed epochs before the timed ones")
    parser.add_argument("--threads", type=at_least(0), default=0,
                        help="torch threads per rank (default: cores / ranks); the PyG peer gets threads * P")
    parser.add_argument("--seed", type=seed_number, default=0, help="seed, >= 0 (default: %(default)s)")
    parser.add_argument("--peer", choices=PEERS, default="pyg",
                        help="the single-process system beside sparse-dist on the whole graph: pyg (GCNConv on a "
                             "torch.sparse_csr Â, SAGEConv, GATConv), dgl (GraphConv with Â's edge weights, "
                             "SAGEConv; the optional extra dgl) or none (default: %(default)s)")
    parser.add_argument("--no-pyg", action="store_true", help="skip the peer (the same as --peer none)")
    parser.add_argument("--dropout-baseline", action="store_true",
                        help="also time sparse-dist with dropout 0 in the same run and print what dropout costs")

    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def check_arguments(args: argparse.Namespace) -> str | None:
    """Flag combinations argparse cannot check (refused before MPI starts)."""
    if args.no_pyg:
        args.peer = "none"
    if args.peer == "dgl":
        from runners.bench.minibatch_dgl import dgl_problem
        from runners.bench.train_dgl import dgl_mirror_problem

        problem = dgl_mirror_problem(args.model) or dgl_problem()
        if problem:
            return problem
    if args.synthetic is not None and args.classes > args.features:
        return (f"--classes {args.classes} is more than --features {args.features}: the synthetic graph plants "
                f"each class in its own features; give --features {args.classes} or more")
    return attention_problem(args)


# ------------------------------------------------------------------ memory
def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes, or None where there is no such file or field."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _max_rss_since_start() -> int:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


class PeakMemory:
    """Peak memory of this process over one phase: CUDA allocations on a GPU, else the resident set."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.before: int | None = None
        self.reset = False
        self.note: str | None = None

    def start(self) -> None:
        """Record the current figure and reset the peak to it."""
        if self.device.type == "cuda":
            synchronize(self.device)
            self.before = int(torch.cuda.memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
            self.reset = True
            return
        try:
            with open("/proc/self/clear_refs", "w") as handle:
                handle.write("5")  # Linux >= 4.0: VmHWM := current RSS
            self.reset = True
        except OSError as exc:
            self.note = f"peak RSS not reset ({exc.strerror or exc}): it is the peak since process start"
        # Read after the reset: RSS may shrink between a read and the reset, and the peak starts from the
        # RSS at the reset, so "before" is never above it.
        self.before = _status_bytes("VmRSS")

    def stop(self) -> dict[str, Any]:
        """``kind``, ``before`` and ``peak`` in bytes, whether the peak was reset, and a note if not."""
        if self.device.type == "cuda":
            synchronize(self.device)
            peak: int | None = int(torch.cuda.max_memory_allocated(self.device))
            kind = "cuda_allocated"
        else:
            kind = "rss"
            peak = _status_bytes("VmHWM") if self.reset else None
            if peak is None:
                peak = _max_rss_since_start()
                self.reset = False
                self.note = self.note or "no /proc/self/status: peak RSS since process start (getrusage)"
            elif self.before is not None:
                # The kernel syncs each thread's RSS counters lazily (every 64 page events), so a VmHWM read
                # can lag a VmRSS read by a few pages (a fresh clone saw 184 KiB); the timed epochs' peak is
                # at least the resident set they started from.
                peak = max(peak, self.before)
        return {"kind": kind, "before": self.before, "peak": peak, "reset": self.reset, "note": self.note}


# ------------------------------------------------------------------ timing
def _split(parts: dict[str, float] | None, wall: float) -> dict[str, float]:
    """An epoch's seconds: ``total`` (measured here), the trainer's parts, ``dense`` the rest."""
    if parts is None:
        return {"total": wall}
    out = {"total": wall, **{key: float(parts.get(key, 0.0)) for key in TIME_PARTS}}
    out["dense"] = max(wall - sum(out[key] for key in TIME_PARTS), 0.0)
    return out


def time_epochs(step: Callable[[], tuple[float, dict[str, float] | None]], device: torch.device, warmup: int,
                epochs: int, barrier: Callable[[], None]) -> dict[str, Any]:
    """Run ``warmup`` untimed then ``epochs`` timed calls of ``step`` (returns loss and time parts or None).

    ``barrier`` is called before each timed epoch (``comm.barrier`` for a
    collective step, a no-op for a single process). Returns this rank's
    per-epoch times, losses and peak memory over the timed epochs.
    """
    for _ in range(warmup):
        step()
    probe = PeakMemory(device)
    synchronize(device)
    barrier()
    probe.start()
    times, losses = [], []
    for _ in range(epochs):
        synchronize(device)
        barrier()
        start = time.perf_counter()
        loss, parts = step()
        synchronize(device)
        times.append(_split(parts, time.perf_counter() - start))
        losses.append(loss)
    return {"times": times, "losses": losses, "memory": probe.stop()}


def summarise(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Slowest rank per epoch, medians over epochs, memory per rank, the final loss."""
    epochs = len(per_rank[0]["times"])
    slowest = [max((run["times"][k] for run in per_rank), key=lambda t: t["total"]) for k in range(epochs)]
    medians = {key: statistics.median(t[key] for t in slowest) for key in slowest[0]}
    return {"epoch_s": medians["total"], "breakdown": medians, "per_epoch_slowest": slowest,
            "memory_per_rank": [run["memory"] for run in per_rank], "final_loss": per_rank[0]["losses"][-1],
            "losses": per_rank[0]["losses"]}


def _epoch_bytes(per_rank: list[list[dict[str, dict[str, int]]]]) -> dict[str, dict[str, int]]:
    """Per phase, the bytes sent in one timed epoch: the largest rank's (``max``) and all ranks' (``total``),
    medians over the timed epochs."""
    phases = per_rank[0][0].keys() if per_rank and per_rank[0] else []
    out = {}
    for phase in phases:
        sent = [[epochs[k][phase]["sent"] for epochs in per_rank] for k in range(len(per_rank[0]))]
        out[phase] = {"max": int(statistics.median(max(s) for s in sent)),
                      "total": int(statistics.median(sum(s) for s in sent))}
    return out


# ------------------------------------------------------------------ runs
def _config(args: argparse.Namespace, meta: dict[str, Any], dropout: float | None = None) -> TrainConfig:
    """The run's hyper-parameters: the flags ``bench train`` shares with ``train`` by name (the others at
    :class:`TrainConfig`'s defaults), ``--warmup`` epochs before the timed ones, features normalised as
    ``sparse-dist train --feature-norm auto`` does; ``dropout`` (the baseline's 0) replaces both dropouts."""
    overrides = {} if dropout is None else {"dropout": dropout, "attention_dropout": dropout}
    return TrainConfig.from_args(args, epochs=args.warmup + args.epochs,
                                 feature_norm=meta.get("feature_norm", "row"), **overrides)


def _prepare_synthetic(comm: Communicator, args: argparse.Namespace) -> tuple[str, Path | None]:
    """Rank 0 writes the synthetic graph as ``P`` shards; returns (directory, scratch to remove on rank 0).

    Collective; the other ranks sleep meanwhile. Every rank must then see
    the directory, else every rank raises.
    """
    path, scratch = None, None
    if comm.rank == 0:
        scratch = Path(tempfile.mkdtemp(prefix="sparse-dist-bench-", dir=args.scratch))
        data = planted_classes(nodes=args.synthetic, classes=args.classes, degree=args.degree,
                               features=args.features, seed=args.seed)
        write_shards(data, scratch / "data", comm.size, "block", args.seed)
        path = str(scratch / "data")
        del data
        gc.collect()
    comm.idle_barrier()
    path = comm.allgather_object(path)[0]
    seen = (Path(path) / "meta.json").is_file()
    comm.raise_if_any(None if seen else f"cannot see {path}, written by rank 0; pass --scratch DIR on a "
                                        f"file system every rank shares", RuntimeError)
    return path, scratch


def _whole_graph(comm: Communicator, data_dir: str, wanted: bool) -> LocalGraph | None:
    """Every part of ``data_dir`` merged into one graph on rank 0 when ``wanted`` (collective; others get None)."""
    alone = comm.split(comm.rank, 0)
    try:
        return load_local_graph(alone, data_dir, 1, 1) if wanted and comm.rank == 0 else None
    finally:
        alone.free()


def run_peer(comm: Communicator, args: argparse.Namespace, data_dir: str, device: torch.device,
             threads: int) -> dict[str, Any]:
    """Rank 0 trains the peer (``--peer``) with ``threads * P`` threads; the others sleep (collective).

    Returns the summary on every rank, or ``{"skipped": reason}``.
    """
    problem, make = PEER_MAKERS[args.peer]
    error = problem(args.model) if comm.rank == 0 else None
    whole = _whole_graph(comm, data_dir, error is None)
    outcome: dict[str, Any] | None = None
    if comm.rank == 0:
        if error is not None:
            outcome = {"skipped": error}
        else:
            assert whole is not None
            torch.set_num_threads(threads * comm.size)
            try:
                peer = make(whole, _config(args, whole.extra["meta"]), device)
                run = time_epochs(lambda: (peer.train_epoch(), None), device, args.warmup, args.epochs,
                                  lambda: None)
                outcome = {**summarise([run]), "threads": threads * comm.size, "device": str(device),
                           "notes": peer.notes}
                del peer
            finally:
                torch.set_num_threads(threads)
        del whole
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    comm.idle_barrier()
    return comm.allgather_object(outcome)[0]


def run_sparse_dist(comm: Communicator, args: argparse.Namespace, data_dir: str,
                    device: torch.device, dropout: float | None = None) -> dict[str, Any]:
    """Every rank trains its part with :class:`Trainer` (collective); returns the summary everywhere."""
    graph = load_local_graph(comm, data_dir, comm.size, 1)
    meta = graph.extra["meta"]
    trainer = Trainer(comm, graph, _config(args, meta, dropout), device)
    reported: set[str] = set()
    moved: list[dict[str, dict[str, int]]] = []

    def step() -> tuple[float, dict[str, float]]:
        record = trainer.train_epoch()
        reported.update(record["time"])
        moved.append(record["bytes"])
        return record["loss"], record["time"]

    run = time_epochs(step, device, args.warmup, args.epochs, comm.barrier)
    run["bytes"] = moved[args.warmup:]
    gathered = comm.allgather_object(run)
    summary = summarise(gathered)
    summary["bytes_per_epoch"] = _epoch_bytes([r["bytes"] for r in gathered])
    summary["reported_parts"] = [key for key in OPTIONAL_PARTS if key in reported]
    summary["dataset"] = {key: meta[key] for key in ("name", "num_nodes", "num_edges", "feature_dim",
                                                     "num_classes", "num_parts")}
    return summary


def run(comm: Communicator, args: argparse.Namespace) -> dict[str, Any]:
    """The whole benchmark (collective); the result dict on every rank."""
    device = rank_device(comm, args.device)
    threads = args.threads or default_threads_per_rank()
    torch.set_num_threads(threads)
    scratch = None
    try:
        if args.data:
            data_dir = args.data
        else:
            data_dir, scratch = _prepare_synthetic(comm, args)
        notes = [note for note in (shared_gpu_note(comm, device),) if note]
        skipped = "--no-pyg" if args.no_pyg else "--peer none"
        peer = {"skipped": skipped} if args.peer == "none" else run_peer(comm, args, data_dir, device, threads)
        ours = run_sparse_dist(comm, args, data_dir, device)
        baseline = (run_sparse_dist(comm, args, data_dir, device, dropout=0.0)
                    if args.dropout_baseline and args.dropout > 0 else None)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    result: dict[str, Any] = {
        "config": {key: value for key, value in vars(args).items() if key not in ("func", "command", "bench")},
        "world_size": comm.size, "threads_per_rank": threads, "device": args.device,
        "devices": comm.allgather_object(str(device)), "dataset": ours.pop("dataset"),
        "environment": {**mpi_vendor_details(), "torch": torch.__version__, "huge_pages": huge_page_state(),
                        "freed_memory": freed_memory_state()},
        "notes": notes, "sparse_dist": ours, "peer": args.peer,
    }
    if baseline is not None:
        baseline.pop("dataset")
        result["sparse_dist_dropout0"] = baseline
        result["dropout_cost"] = ours["epoch_s"] / baseline["epoch_s"]
    name = peer_key(args.peer)
    if "skipped" in peer:
        result[f"{name}_skipped"] = peer["skipped"]
    else:
        result[name] = peer
        mine = max(m["peak"] for m in ours["memory_per_rank"])
        result["ratio"] = {"epoch_time": ours["epoch_s"] / peer["epoch_s"],
                           "peak_memory": mine / peer["memory_per_rank"][0]["peak"]}
    return result


# ------------------------------------------------------------------ report
def _mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e6:.1f}"


def report(result: dict[str, Any]) -> str:
    """Human-readable table of a :func:`run` result."""
    cfg, data, ours = result["config"], result["dataset"], result["sparse_dist"]
    size = result["world_size"]
    heads = (f" x {cfg['heads']} heads (output {cfg['output_heads']}), attention dropout {cfg['attention_dropout']}"
             if layer_type(cfg["model"]).takes_options else "")
    lines = [f"bench train on {result['device']}: {cfg['model']} {cfg['layers']} layers, "
             f"hidden {cfg['hidden']}{heads}, "
             f"dropout {cfg['dropout']}, plan {cfg['plan']}, seed {cfg['seed']}; {data['name']}: "
             f"{data['num_nodes']} nodes, {data['num_edges']} edges, {data['feature_dim']} features, "
             f"{data['num_classes']} classes",
             f"P={size} x {result['threads_per_rank']} threads; {cfg['warmup']} warm-up + {cfg['epochs']} timed "
             f"epochs; times: median over timed epochs of the slowest rank (s)"]
    lines += result["notes"]
    name = peer_key(result["peer"])
    peer = result.get(name)
    if peer is None:
        lines.append(f"{name} peer skipped: {result[f'{name}_skipped']}")
    else:
        lines.append(f"{name} peer: one process on {peer['device']} with {peer['threads']} threads, same model, "
                     f"graph, features and initial weights; its dropout RNG differs, so losses differ")
        lines += [f"{name} note: {note}" for note in peer["notes"]]
    parts = ["local_spmm", "exchange", "exchange_wait", "allreduce", "allreduce_wait", *ours["reported_parts"],
             "dense"]
    width = {p: max(11, len(p) + 1) for p in parts}
    memory_kind = "peak CUDA allocated" if result["device"] == "cuda" else "peak RSS"
    lines.append(f"{'run':<17}{'epoch_s':>9}" + "".join(f"{p:>{width[p]}}" for p in parts)
                 + f"{'before_MB':>11}{'peak_MB/rank':>14}{f't/{name}':>7}{f'mem/{name}':>8}{'final_loss':>11}")
    rows = []
    if peer is not None:
        memory = peer["memory_per_rank"][0]
        rows.append(f"{name:<17}{peer['epoch_s']:>9.4f}" + "".join(f"{'-':>{width[p]}}" for p in parts)
                    + f"{_mb(memory['before']):>11}{_mb(memory['peak']):>14}{'1.00':>7}{'1.00':>8}"
                    f"{peer['final_loss']:>11.4f}")
    memory = ours["memory_per_rank"]
    before = max((m["before"] for m in memory if m["before"] is not None), default=None)
    ratio = result.get("ratio")
    rows.append(f"{f'sparse-dist P={size}':<17}{ours['epoch_s']:>9.4f}"
                + "".join(f"{ours['breakdown'][p]:>{width[p]}.4f}" for p in parts)
                + f"{_mb(before):>11}{_mb(max(m['peak'] for m in memory)):>14}"
                + (f"{ratio['epoch_time']:>7.2f}{ratio['peak_memory']:>8.2f}" if ratio else f"{'-':>7}{'-':>8}")
                + f"{ours['final_loss']:>11.4f}")
    base = result.get("sparse_dist_dropout0")
    if base is not None:
        rows.append(f"{'  same, dropout 0':<17}{base['epoch_s']:>9.4f}"
                    + "".join(f"{base['breakdown'][p]:>{width[p]}.4f}" for p in parts)
                    + f"{_mb(max((m['before'] or 0) for m in base['memory_per_rank'])):>11}"
                    + f"{_mb(max(m['peak'] for m in base['memory_per_rank'])):>14}"
                    + (f"{base['epoch_s'] / peer['epoch_s']:>7.2f}{'':>8}" if peer is not None else f"{'-':>7}{'':>8}")
                    + f"{base['final_loss']:>11.4f}")
    lines += rows
    if base is not None:
        share = {key: ours["breakdown"].get(key, 0.0) / ours["epoch_s"] for key in ("masks", "dropout")}
        lines.append(f"dropout {cfg['dropout']} costs {result['dropout_cost']:.3f}x the epoch without dropout "
                     f"(same run); share of the epoch: making masks {share['masks']:.1%}, applying them "
                     f"(forward and backward) {share['dropout']:.1%}")
    moved = ours.get("bytes_per_epoch", {})
    if moved:
        shown = ", ".join(f"{phase} {moved[phase]['max'] / 1e6:.3f}" for phase in ("forward", "backward",
                                                                                  "grad_allreduce") if phase in moved)
        lines.append(f"sparse-dist bytes sent per epoch, largest rank (MB): {shown}")
    lines.append(f"host memory: {result['environment']['huge_pages']} (the whole process, the peer included)")
    lines.append(f"{memory_kind} per sparse-dist rank over the timed epochs (before -> peak, MB): "
                 + "; ".join(f"rank {r} {_mb(m['before'])} -> {_mb(m['peak'])}" for r, m in enumerate(memory))
                 + " (before_MB and peak_MB/rank columns: max over ranks)")
    for r, m in enumerate(memory):
        if m["note"]:
            lines.append(f"note: rank {r}: {m['note']}")
    if peer is not None and peer["memory_per_rank"][0]["note"]:
        lines.append(f"note: {name}: {peer['memory_per_rank'][0]['note']}")
    return "\n".join(lines)


def main(comm: Communicator, args: argparse.Namespace) -> int:
    result = run(comm, args)
    print_report(comm.rank, report(result) if comm.rank == 0 else "", result, args.json)
    return 0
