"""``sparse-dist bench minibatch``: sparse-dist's distributed mini-batch training next to PyG's ``NeighborLoader``.

One command, one run, ratios from that run. Under ``mpiexec -n P``:

1. Every rank trains with :class:`algorithms.minibatch.MinibatchTrainer` (``--fanouts``, ``--batch-size`` B
   per rank, so a global batch of ``P * B`` seeds a step): ``--warmup`` untimed epochs, then ``--epochs``
   timed ones. An epoch's time is the slowest rank's; throughput is training seeds per second over the
   median timed epoch; the step breakdown (sample, fetch, compute, allreduce, wait) is the slowest rank's
   median per part. Test accuracy: the exact full-graph evaluation after the last epoch.
2. Rank 0 trains the peer (:mod:`runners.bench.minibatch_peer`: ``NeighborLoader`` + ``SAGEConv``, the same
   fanouts, a batch of ``P * B`` seeds, the same initial weights and optimiser) on the whole graph with
   ``threads * P`` threads while the other ranks sleep in a non-spinning barrier; the same number of
   epochs, timed the same way; then its test accuracy from a full-graph forward.

The peer mirrors SAGE only (``--layer-kind sage``, the default); with ``gcn`` it is skipped with the
reason. ``--no-pyg`` skips it. The report says which neighbour-sampling kernel the peer used.
"""

from __future__ import annotations

import argparse
import gc
import statistics
from typing import Any

import torch

from algorithms.minibatch import MinibatchTrainer
from algorithms.minibatch.config import MinibatchConfig, parse_fanouts
from algorithms.train import TrainConfig
from runners.argtypes import at_least, probability
from runners.argtypes import seed as seed_number
from runners.results import print_report
from runners.data.shards import load_local_graph
from sparse_dist.comm import Communicator, default_threads_per_rank, mpi_vendor_details

STEP_PARTS = ("sample", "fetch", "compute", "allreduce", "wait")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="dataset directory made by `sparse-dist prepare`")
    parser.add_argument("--layer-kind", dest="model", choices=("sage", "gcn"), default="sage",
                        help="the PyG peer mirrors sage only (default: %(default)s)")
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
                        help="torch threads per rank (default: cores / ranks); the PyG peer gets threads * P")
    parser.add_argument("--seed", type=seed_number, default=0, help="seed, >= 0 (default: %(default)s)")
    parser.add_argument("--no-pyg", action="store_true", help="skip the PyG peer")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def check_arguments(args: argparse.Namespace) -> str | None:
    """Flag combinations argparse cannot check (refused before MPI starts)."""
    try:
        args.fanout_list = parse_fanouts(args.fanouts)
    except ValueError as exc:
        return f"--fanouts: {exc}"
    if len(args.fanout_list) != args.layers:
        return f"--fanouts has {len(args.fanout_list)} entries for --layers {args.layers}: give one per layer"
    return None


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
                                sample_batches=args.sample_batches)
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
    finally:
        trainer.close()
    epoch_s = statistics.median(r["total"] for r in slowest)
    cache = comm.allgather_object((needed, hits))  # remote input rows needed, and found in the cache
    total_needed = sum(n for n, _ in cache)
    return {"epoch_s": epoch_s, "seeds_per_s": seeds / epoch_s, "steps": steps, "seeds": seeds,
            "breakdown": _median_parts([{k: v for k, v in r.items() if k != "total"} for r in slowest]),
            "test_acc": test_acc, "cache_hit_rate": (sum(h for _, h in cache) / total_needed) if total_needed else None,
            "dataset": {key: meta[key] for key in ("name", "num_nodes", "num_edges", "feature_dim", "num_classes")}}


def run_peer(comm: Communicator, args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """Rank 0 trains the PyG peer; the others sleep (collective). ``{"skipped": reason}`` where it cannot."""
    outcome: dict[str, Any] | None = None
    skip = "--no-pyg" if args.no_pyg else ("the peer mirrors SAGE only" if args.model != "sage" else None)
    if skip is None and comm.rank == 0:
        try:
            import torch_geometric  # noqa: F401
        except ImportError as exc:
            skip = f"torch_geometric is not importable ({exc})"
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
            from runners.bench.minibatch_peer import PygMinibatchPeer

            torch.set_num_threads(threads * comm.size)
            try:
                peer = PygMinibatchPeer(whole, _config(args, whole.extra["meta"]), args.fanout_list,
                                        comm.size * args.batch_size)
                epochs = [peer.train_epoch() for _ in range(args.warmup + args.epochs)][args.warmup:]
                epoch_s = statistics.median(e["seconds"] for e in epochs)
                outcome = {"epoch_s": epoch_s, "seeds_per_s": int(peer.train_ids.numel()) / epoch_s,
                           "steps": epochs[0]["steps"], "test_acc": peer.test_accuracy(),
                           "sampler": peer.sampler_name, "threads": threads * comm.size, "notes": peer.notes}
                del peer
            finally:
                torch.set_num_threads(threads)
        del whole
        gc.collect()
    comm.idle_barrier()
    return comm.allgather_object(outcome)[0]


def run(comm: Communicator, args: argparse.Namespace) -> dict[str, Any]:
    """The whole benchmark (collective); the result dict on every rank."""
    threads = args.threads or default_threads_per_rank()
    torch.set_num_threads(threads)
    ours = run_sparse_dist(comm, args)
    peer = run_peer(comm, args, threads)
    result: dict[str, Any] = {
        "config": {key: value for key, value in vars(args).items() if key not in ("func", "command", "bench")},
        "world_size": comm.size, "threads_per_rank": threads, "dataset": ours.pop("dataset"),
        "environment": {**mpi_vendor_details(), "torch": torch.__version__}, "sparse_dist": ours}
    if "skipped" in peer:
        result["pyg_skipped"] = peer["skipped"]
    else:
        result["pyg"] = peer
        result["ratio"] = {"throughput": ours["seeds_per_s"] / peer["seeds_per_s"],
                           "test_acc_difference": ours["test_acc"] - peer["test_acc"]}
    return result


def report(result: dict[str, Any]) -> str:
    """The human-readable table rank 0 prints."""
    config, ours = result["config"], result["sparse_dist"]
    data = result["dataset"]
    lines = [f"bench minibatch: {data['name']} ({data['num_nodes']} nodes), {config['model']} "
             f"{config['layers']} layers hidden {config['hidden']}, fanouts {config['fanouts']}, "
             f"batch {config['batch_size']} per rank x P={result['world_size']}, "
             f"{config['warmup']} warm-up + {config['epochs']} timed epochs, "
             f"{result['threads_per_rank']} thread(s) per rank",
             f"{'system':<34}{'epoch s':>9}{'seeds/s':>11}{'steps':>7}{'test acc':>10}"]
    lines.append(f"{'sparse-dist P=' + str(result['world_size']):<34}{ours['epoch_s']:>9.3f}"
                 f"{ours['seeds_per_s']:>11.0f}{ours['steps']:>7}{ours['test_acc']:>10.4f}")
    if "pyg" in result:
        peer = result["pyg"]
        lines.append(f"{'PyG NeighborLoader, 1 process':<34}{peer['epoch_s']:>9.3f}{peer['seeds_per_s']:>11.0f}"
                     f"{peer['steps']:>7}{peer['test_acc']:>10.4f}")
        lines.append(f"throughput ratio sparse-dist / PyG: {result['ratio']['throughput']:.2f}x "
                     f"(PyG sampler: {peer['sampler']}; {peer['threads']} threads)")
        lines.extend(f"note: {note}" for note in peer["notes"])
    else:
        lines.append(f"PyG peer skipped: {result['pyg_skipped']}")
    parts = ", ".join(f"{part} {ours['breakdown'][part]:.3f}" for part in STEP_PARTS)
    lines.append(f"sparse-dist step breakdown (slowest rank, median epoch, s): {parts}")
    if config["feature_cache"] and ours["cache_hit_rate"] is not None:
        lines.append(f"feature cache hit rate: {ours['cache_hit_rate']:.3f}")
    return "\n".join(lines)


def main(comm: Communicator, args: argparse.Namespace) -> int:
    result = run(comm, args)
    print_report(comm.rank, report(result) if comm.rank == 0 else "", result, args.json)
    return 0
