"""``sparse-dist bench minibatch``: sparse-dist's distributed mini-batch training next to a named peer.

One command, one run, ratios from that run. Under ``mpiexec -n P``:

1. Every rank trains with :class:`algorithms.minibatch.MinibatchTrainer` (``--fanouts``, ``--batch-size`` B
   per rank, so a global batch of ``P * B`` seeds a step; ``--sampler`` picks the sampling kernel, numba by
   default): ``--warmup`` untimed epochs, then ``--epochs`` timed ones. An epoch's time is the slowest
   rank's; throughput is training seeds per second over the median timed epoch; the step breakdown (sample,
   fetch, compute, allreduce, allreduce_wait, wait) is the slowest rank's median per part. Test accuracy: the exact
   full-graph evaluation after the last epoch.
2. Rank 0 trains the peer on the whole graph with ``threads * P`` threads while the other ranks sleep in a
   non-spinning barrier; the same number of epochs, timed the same way; then its test accuracy from a
   full-graph forward. ``--peer pyg`` (default): PyG's ``NeighborLoader`` + ``SAGEConv``
   (:mod:`runners.bench.minibatch_peer`; with a numpy sampling kernel where pyg-lib and torch-sparse are
   missing, as on this project's index, and the report says so). ``--peer dgl``: DGL 2.1's compiled
   ``NeighborSampler`` + ``SAGEConv`` (:mod:`runners.bench.minibatch_dgl`, the optional extra ``dgl``),
   whose sampler is also timed alone (one loader pass per timed epoch, no training). ``--peer none`` (or
   ``--no-pyg``) skips the peer.

Each system's ``sample`` seconds per epoch: sparse-dist's the breakdown's (the slowest rank's median); a
peer's the time its training loop waited for the loader's next batch. The peers mirror SAGE only
(``--layer-kind sage``, the default); with ``gcn`` the peer is skipped with the reason. ``--peer dgl``
without dgl installed is refused before MPI starts, in one sentence.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import statistics
from typing import Any

import torch

from algorithms.layers import layer_type
from algorithms.minibatch import MinibatchTrainer
from algorithms.minibatch.config import MinibatchConfig, parse_fanouts
from algorithms.model import MODEL_KINDS
from algorithms.train import TrainConfig
from runners.argtypes import at_least, probability
from runners.argtypes import seed as seed_number
from runners.bench.minibatch_peer import PEER_KINDS, peer_problem
from runners.results import print_report
from runners.data.shards import load_local_graph
from runners.minibatch_flags import add_sampler_argument, sampler_problem
from sparse_dist.comm import Communicator, default_threads_per_rank, mpi_vendor_details

STEP_PARTS = ("sample", "fetch", "compute", "allreduce", "allreduce_wait", "wait")
PEERS = ("pyg", "dgl", "none")
MINIBATCH_KINDS: tuple[str, ...] = tuple(kind for kind in MODEL_KINDS if not layer_type(kind).takes_operator)
"""The layer kinds mini-batch training runs: those that see the exchange only as a product (attention, which
needs the exchanged rows themselves, does not; :func:`algorithms.minibatch.minibatch_problem`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="dataset directory made by `sparse-dist prepare`")
    parser.add_argument("--layer-kind", dest="model", choices=MINIBATCH_KINDS, default="sage",
                        help=f"the peers mirror {', '.join(PEER_KINDS)} only (default: %(default)s)")
    parser.add_argument("--layers", type=at_least(1), default=3)
    parser.add_argument("--hidden", type=at_least(1), default=128)
    parser.add_argument("--dropout", type=probability, default=0.5)
    parser.add_argument("--lr", type=float, default=0.003, help="Adam learning rate (default: %(default)s)")
    parser.add_argument("--fanouts", default="15,10,5",
                        help="neighbours per hop, hop 1 (the seeds') first, 'all' keeps every one; one per layer "
                             "(default: %(default)s)")
    parser.add_argument("--batch-size", type=at_least(1), default=512,
                        help="seeds per rank per step; the peer's batch is P times this (default: %(default)s)")
    parser.add_argument("--feature-cache", type=at_least(0), default=0, help="remote input rows each rank keeps")
    parser.add_argument("--prefetch", type=at_least(0), default=0, help="batches sampled and fetched ahead")
    parser.add_argument("--sample-batches", type=at_least(1), default=1, metavar="K",
                        help="batches sampled together, one round of exchanges per hop (default: %(default)s)")
    parser.add_argument("--epochs", type=at_least(1), default=3, help="timed epochs")
    parser.add_argument("--warmup", type=at_least(0), default=1, help="untimed epochs before the timed ones")
    parser.add_argument("--threads", type=at_least(0), default=0,
                        help="torch threads per rank (default: cores / ranks); the peer (PyG or DGL) gets threads * P")
    parser.add_argument("--seed", type=seed_number, default=0, help="seed, >= 0 (default: %(default)s)")
    parser.add_argument("--peer", choices=PEERS, default="pyg",
                        help="the single-process system beside sparse-dist: pyg (NeighborLoader + SAGEConv; numpy "
                             "sampling kernel where pyg-lib is missing), dgl (DGL's compiled NeighborSampler + "
                             "SAGEConv; the optional extra dgl) or none (default: %(default)s)")
    parser.add_argument("--no-pyg", action="store_true", help="skip the peer (the same as --peer none)")
    add_sampler_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def check_arguments(args: argparse.Namespace) -> str | None:
    """Flag combinations argparse cannot check (refused before MPI starts)."""
    try:
        args.fanout_list = parse_fanouts(args.fanouts)
    except ValueError as exc:
        return f"--fanouts: {exc}"
    if len(args.fanout_list) != args.layers:
        return f"--fanouts has {len(args.fanout_list)} entries for --layers {args.layers}: give one per layer"
    if args.no_pyg:
        args.peer = "none"
    if args.peer == "dgl" and args.model in PEER_KINDS:
        from runners.bench.minibatch_dgl import dgl_problem

        problem = dgl_problem()
        if problem:
            return problem
    return sampler_problem(args.sampler)


def _config(args: argparse.Namespace, meta: dict[str, Any]) -> TrainConfig:
    return TrainConfig.from_args(args, epochs=args.warmup + args.epochs, feature_norm=meta.get("feature_norm", "row"))


def _median_parts(records: list[dict[str, float]]) -> dict[str, float]:
    return {part: statistics.median(r[part] for r in records) for part in records[0]}


def run_sparse_dist(comm: Communicator, args: argparse.Namespace) -> dict[str, Any]:
    """Every rank trains its part (collective); the summary on every rank."""
    graph = load_local_graph(comm, args.data, comm.size, 1)
    meta = graph.extra["meta"]
    minibatch = MinibatchConfig(fanouts=tuple(args.fanout_list), batch_size=args.batch_size,
                                feature_cache=args.feature_cache, prefetch=args.prefetch,
                                sample_batches=args.sample_batches, sampler=args.sampler)
    trainer = MinibatchTrainer(comm, graph, _config(args, meta), minibatch)
    try:
        slowest: list[dict[str, float]] = []
        hits = needed = 0
        for epoch in range(args.warmup + args.epochs):
            comm.barrier()
            record = trainer.train_epoch()
            times = comm.allgather_object({part: record["time"][part] for part in ("total", *STEP_PARTS)})
            if epoch >= args.warmup:
                slowest.append({part: max(t[part] for t in times) for part in times[0]})
                needed += record["feature_cache"]["needed"]
                hits += record["feature_cache"]["hits"]
        scores = trainer.evaluate()
        test_acc = scores.get("test_acc", scores.get("test_f1"))  # multi-label datasets report F1
        seeds = int(trainer.train_ids.size)
        steps = trainer.steps_per_epoch
        kernel = trainer.sampler.kernel
    finally:
        trainer.close()
    epoch_s = statistics.median(r["total"] for r in slowest)
    cache = comm.allgather_object((needed, hits))  # remote input rows needed, and found in the cache
    total_needed = sum(n for n, _ in cache)
    return {"epoch_s": epoch_s, "seeds_per_s": seeds / epoch_s, "steps": steps, "seeds": seeds, "sampler": kernel,
            "breakdown": _median_parts([{k: v for k, v in r.items() if k != "total"} for r in slowest]),
            "test_acc": test_acc, "cache_hit_rate": (sum(h for _, h in cache) / total_needed) if total_needed else None,
            "dataset": {key: meta[key] for key in ("name", "num_nodes", "num_edges", "feature_dim", "num_classes")}}


def _peer_skip(comm: Communicator, args: argparse.Namespace) -> str | None:
    """Why the peer does not run (decided on rank 0), or None."""
    if args.peer == "none":
        return "--peer none" if not args.no_pyg else "--no-pyg"
    problem = peer_problem(args.model)
    if problem:
        return problem
    if comm.rank == 0:
        module = "torch_geometric" if args.peer == "pyg" else "dgl"
        try:
            importlib.import_module(module) if module == "torch_geometric" else _import_dgl()
        except ImportError as exc:
            return f"{module} is not importable ({exc})"
    return None


def _import_dgl() -> None:
    from runners.bench.minibatch_dgl import import_dgl

    import_dgl()


def _make_peer(args: argparse.Namespace, whole: Any, world_size: int) -> Any:
    config = _config(args, whole.extra["meta"])
    if args.peer == "dgl":
        from runners.bench.minibatch_dgl import DglMinibatchPeer

        return DglMinibatchPeer(whole, config, args.fanout_list, world_size * args.batch_size)
    from runners.bench.minibatch_peer import PygMinibatchPeer

    return PygMinibatchPeer(whole, config, args.fanout_list, world_size * args.batch_size)


def run_peer(comm: Communicator, args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """Rank 0 trains the peer; the others sleep (collective). ``{"skipped": reason}`` where it cannot."""
    outcome: dict[str, Any] | None = None
    skip = _peer_skip(comm, args)
    alone = comm.split(comm.rank, 0)
    try:
        whole = load_local_graph(alone, args.data, 1, 1) if skip is None and comm.rank == 0 else None
    finally:
        alone.free()
    if comm.rank == 0:
        if skip is None and whole.multilabel:
            skip = "the peer's loss is single-label cross-entropy; this dataset is multi-label"
        if skip is not None:
            outcome = {"skipped": skip}
        else:
            torch.set_num_threads(threads * comm.size)
            try:
                peer = _make_peer(args, whole, comm.size)
                epochs = [peer.train_epoch() for _ in range(args.warmup + args.epochs)][args.warmup:]
                epoch_s = statistics.median(e["seconds"] for e in epochs)
                outcome = {"epoch_s": epoch_s, "seeds_per_s": int(peer.train_ids.numel()) / epoch_s,
                           "sample_s": statistics.median(e["sample"] for e in epochs),
                           "steps": epochs[0]["steps"], "test_acc": peer.test_accuracy(),
                           "sampler": peer.sampler_name, "threads": threads * comm.size, "notes": peer.notes}
                if hasattr(peer, "sample_epoch"):  # the sampler alone, as often as the timed epochs
                    outcome["sample_only_s"] = statistics.median(peer.sample_epoch() for _ in range(args.epochs))
                del peer
            finally:
                torch.set_num_threads(threads)
        del whole
        gc.collect()
    comm.idle_barrier()
    return comm.allgather_object(outcome)[0]


def run(comm: Communicator, args: argparse.Namespace) -> dict[str, Any]:
    """The whole benchmark (collective); the result dict on every rank. The peer's figures are under its
    name (``pyg`` or ``dgl``), or ``{name}_skipped`` says why it did not run."""
    threads = args.threads or default_threads_per_rank()
    torch.set_num_threads(threads)
    ours = run_sparse_dist(comm, args)
    peer = run_peer(comm, args, threads)
    name = "pyg" if args.peer == "none" else args.peer
    result: dict[str, Any] = {
        "config": {key: value for key, value in vars(args).items() if key not in ("func", "command", "bench")},
        "world_size": comm.size, "threads_per_rank": threads, "dataset": ours.pop("dataset"),
        "environment": {**mpi_vendor_details(), "torch": torch.__version__}, "sparse_dist": ours, "peer": args.peer}
    if "skipped" in peer:
        result[f"{name}_skipped"] = peer["skipped"]
    else:
        result[name] = peer
        result["ratio"] = {"throughput": ours["seeds_per_s"] / peer["seeds_per_s"],
                           "sample": ours["breakdown"]["sample"] / peer["sample_s"] if peer["sample_s"] else None,
                           "test_acc_difference": ours["test_acc"] - peer["test_acc"]}
    return result


PEER_LABELS = {"pyg": "PyG NeighborLoader", "dgl": "DGL NeighborSampler"}


def _peer_label(name: str, peer: dict[str, Any]) -> str:
    """The peer's row name: the system, and for PyG which sampling kernel it ran (numpy where pyg-lib is missing)."""
    if name == "pyg":
        kernel = "numpy kernel" if peer["sampler"].startswith("numpy") else peer["sampler"]
        return f"PyG ({kernel}), 1 process"
    return f"{PEER_LABELS[name]}, 1 process"


def report(result: dict[str, Any]) -> str:
    """The human-readable table rank 0 prints."""
    config, ours = result["config"], result["sparse_dist"]
    data = result["dataset"]
    lines = [f"bench minibatch: {data['name']} ({data['num_nodes']} nodes), {config['model']} "
             f"{config['layers']} layers hidden {config['hidden']}, fanouts {config['fanouts']}, "
             f"batch {config['batch_size']} per rank x P={result['world_size']}, "
             f"{config['warmup']} warm-up + {config['epochs']} timed epochs, "
             f"{result['threads_per_rank']} thread(s) per rank",
             f"{'system':<40}{'epoch s':>9}{'sample s':>10}{'seeds/s':>11}{'steps':>7}{'test acc':>10}"]
    name = f"sparse-dist P={result['world_size']} ({ours['sampler']} sampler)"
    lines.append(f"{name:<40}{ours['epoch_s']:>9.3f}{ours['breakdown']['sample']:>10.3f}"
                 f"{ours['seeds_per_s']:>11.0f}{ours['steps']:>7}{ours['test_acc']:>10.4f}")
    peer_name = "pyg" if result["peer"] == "none" else result["peer"]
    if peer_name in result:
        peer = result[peer_name]
        lines.append(f"{_peer_label(peer_name, peer):<40}{peer['epoch_s']:>9.3f}{peer['sample_s']:>10.3f}"
                     f"{peer['seeds_per_s']:>11.0f}{peer['steps']:>7}{peer['test_acc']:>10.4f}")
        if "sample_only_s" in peer:
            lines.append(f"{peer_name} sampler alone (one loader pass, no training): {peer['sample_only_s']:.3f} s "
                         f"an epoch")
        ratio = result["ratio"]
        sample = f"; sampling seconds sparse-dist / {peer_name}: {ratio['sample']:.2f}x" if ratio["sample"] else ""
        lines.append(f"throughput ratio sparse-dist / {peer_name}: {ratio['throughput']:.2f}x{sample} "
                     f"(peer sampler: {peer['sampler']}; {peer['threads']} threads)")
        lines.extend(f"note: {note}" for note in peer["notes"])
    else:
        lines.append(f"peer skipped: {result[peer_name + '_skipped']}")
    parts = ", ".join(f"{part} {ours['breakdown'][part]:.3f}" for part in STEP_PARTS)
    lines.append(f"sparse-dist step breakdown (slowest rank, median epoch, s): {parts}")
    if config["feature_cache"] and ours["cache_hit_rate"] is not None:
        lines.append(f"feature cache hit rate: {ours['cache_hit_rate']:.3f}")
    return "\n".join(lines)


def main(comm: Communicator, args: argparse.Namespace) -> int:
    result = run(comm, args)
    print_report(comm.rank, report(result) if comm.rank == 0 else "", result, args.json)
    return 0
