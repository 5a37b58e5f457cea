"""``sparse-dist cost node-split``: how many ranks a node, and how many threads each, train a graph fastest.

For every split ``r x t`` of a node's cores (:func:`runners.perf.node_split.node_splits`) on ``--job-nodes`` nodes,
the cost model's epoch (:func:`runners.perf.cost_model.predict_epoch`: compute, exchange, gradient allreduce) with
the calibration study's per-core rates scaled by the split's efficiency, probed on this machine
(:mod:`runners.node_split_probe`), so the command runs on a node like the job's (a compute node, inside the allocation:
the Slurm templates show how). The workload at each P is the prepared dataset's own partition (``--data``, the P
that divide its parts) or the partition model of ``--graph`` / ``--nodes`` (:func:`runners.perf.workload
.workload_analytic`). Prints the table, fastest first, and the launch line of the fastest split.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Callable

from algorithms.model import MODEL_KINDS
from runners.argtypes import at_least, fraction
from runners.data.shards import read_meta
from runners.perf.calibration import GRAPHS, add_network_arguments, graph_sizes, network_from, study_rates
from runners.perf.cost_model import ExpectedTraffic, ModelShape, Workload, workload_analytic, workload_from_shards
from runners.perf.node_split import NodeSplit, SplitEpoch, efficiency_of, node_splits, predict_splits
from runners.study.collect import ResultsError
from sparse_dist.cost import Network
from sparse_dist.plans import PLAN_NAMES


def add_node_split_arguments(modes: argparse._SubParsersAction) -> None:
    """The ``splits`` mode of ``sparse-dist cost``."""
    splits = modes.add_parser("node-split", help="ranks x threads a node: the split the cost model trains fastest, "
                                               "each split's efficiency probed on this machine")
    splits.add_argument("--data", default=None, help="a prepared dataset: its sizes and its partition's workload "
                                                      "at each P that divides its parts")
    splits.add_argument("--graph", choices=sorted(GRAPHS), default=None, help="a known graph's sizes (no --data)")
    splits.add_argument("--nodes", type=at_least(1), help="graph nodes, >= 1 (instead of --graph)")
    splits.add_argument("--nnz", type=at_least(0), help="nonzeros of the symmetrised adjacency (with --nodes)")
    splits.add_argument("--features", type=at_least(1), help="input feature width (with --nodes)")
    splits.add_argument("--classes", type=at_least(1), help="number of classes (with --nodes)")
    splits.add_argument("--cut", type=fraction, default=None,
                         help="edge-cut fraction of the partition model (default: random, (P-1)/P; not with --data)")
    splits.add_argument("--hidden", type=at_least(1), default=128, help="hidden width (default: %(default)s)")
    splits.add_argument("--layers", type=at_least(1), default=3, help="layers (default: %(default)s)")
    splits.add_argument("--model", choices=MODEL_KINDS, default="gcn", help="layer kind (default: %(default)s)")
    splits.add_argument("--plan", choices=PLAN_NAMES, default="p2p", help="exchange plan, exact "
                                                                          "(default: %(default)s)")
    splits.add_argument("--job-nodes", type=at_least(1), default=1,
                         help="nodes of the job: P = job nodes x ranks a node (default: %(default)s)")
    splits.add_argument("--calibrate-from", required=True,
                         help="a study's output directory; its smallest exact p2p run gives the per-core rates")
    add_network_arguments(splits, "shm")


def _graph(args: argparse.Namespace) -> tuple[str, dict[str, int]]:
    """The graph's name and sizes (nodes, nnz, features, classes) from ``--data`` or the size flags."""
    if args.data:
        meta = read_meta(args.data)
        return str(meta["name"]), {"nodes": int(meta["num_nodes"]), "nnz": 0, "features": int(meta["feature_dim"]),
                                   "classes": int(meta["num_classes"]), "parts": int(meta["num_parts"])}
    return args.graph or "graph", graph_sizes(args, "cost node-split: give --data, --graph or")


def node_split(args: argparse.Namespace) -> int:
    """``cost node-split``: the table of the module docstring."""
    name, sizes = _graph(args)
    net = network_from(args)
    cores = net.cores_per_node
    here = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cores > here:
        raise ResultsError(f"cost node-split: a node of {cores} cores cannot be probed on this machine's {here}; "
                           f"run it on a node like the job's (--cores-per-node at most {here})")
    rates, base, _ = study_rates(Path(args.calibrate_from))
    calibration = NodeSplit(int(base.get("ranks_on_node") or base["world_size"]), int(base["threads_per_rank"] or 1))
    if calibration.ranks_per_node * calibration.threads > here:
        raise ResultsError(f"cost node-split: the calibration run {base['run']} used {calibration} ranks x threads, "
                           f"more than this machine's {here} cores")
    shape = ModelShape(tuple([sizes["features"]] + [args.hidden] * (args.layers - 1) + [sizes["classes"]]),
                       kind=args.model)
    cache: dict[int, Workload | None] = {}

    def workload(ranks: int) -> Workload | None:
        if ranks not in cache:
            if args.data:
                cache[ranks] = workload_from_shards(args.data, ranks) if sizes["parts"] % ranks == 0 else None
            else:
                cache[ranks] = workload_analytic(name, sizes["nodes"], sizes["nnz"], ranks, args.cut)
        return cache[ranks]

    degree = _mean_degree(sizes, workload)
    from runners.node_split_probe import split_seconds  # torch: only for this mode
    candidates = node_splits(cores)
    seconds, alone = split_seconds(sorted(set(candidates) | ({calibration} - {NodeSplit(1, 1)})), degree, args.hidden)
    efficiencies = efficiency_of(seconds, alone, calibration)
    priced = predict_splits(args.job_nodes, cores, workload, shape, args.plan, ExpectedTraffic(), rates, net,
                             {split: efficiencies[split] for split in candidates})
    if not priced:
        raise ResultsError(f"cost node-split: no split of {cores} cores gives a P that divides {args.data}'s parts")
    _print(name, sizes, args, net, rates.source, calibration, degree, priced)
    return 0


def _mean_degree(sizes: dict[str, int], workload: Callable[[int], Workload | None]) -> int:
    """The graph's mean nonzeros a row (the probe's SpMM), from its sizes or its one-group workload."""
    if sizes["nnz"]:
        return max(round(sizes["nnz"] / sizes["nodes"]), 1)
    whole = workload(1)
    entries = float(whole.nnz_local.sum() + whole.nnz_remote.sum()) if whole is not None else 0.0
    return max(round(entries / sizes["nodes"]), 1)


def _print(name: str, sizes: dict[str, int], args: argparse.Namespace, net: Network, source: str,
           calibration: NodeSplit, degree: int, priced: list[SplitEpoch]) -> None:
    print(f"graph {name}: {sizes['nodes']:,} nodes, mean degree {degree}; {args.model.upper()} {args.layers} layers, "
          f"hidden {args.hidden}; plan {args.plan}, exact; {args.job_nodes} node(s) of {net.cores_per_node} cores, "
          f"network {net.name}")
    print(f"compute rates per core from {source} (split {calibration}); each split's efficiency (per core, "
          f"against that split's) probed on this machine: its ranks at once, SpMM and dense parts")
    print(f"{'ranks x threads':<17}{'P':>5}{'eff SpMM':>10}{'eff dense':>10}{'compute s':>11}{'exchange s':>11}"
          f"{'allreduce s':>12}{'epoch s':>9}")
    for index, epoch in enumerate(priced):
        p = epoch.prediction
        print(f"{str(epoch.split):<17}{epoch.ranks:>5}{epoch.efficiency.spmm:>10.2f}{epoch.efficiency.dense:>10.2f}"
              f"{p.compute_spmm + p.compute_dense:>11.3f}{p.exchange:>11.3f}{p.allreduce:>12.4f}{p.epoch:>9.3f}"
              + ("  <- fastest" if index == 0 else ""))
    best = priced[0]
    runner_up = f", {priced[1].prediction.epoch / best.prediction.epoch:.2f}x faster than {priced[1].split}" \
        if len(priced) > 1 else ""
    print(f"fastest: {best.split.ranks_per_node} rank(s) a node x {best.split.threads} thread(s) "
          f"(srun --ntasks-per-node={best.split.ranks_per_node} --cpus-per-task={best.split.threads}; predicted "
          f"{best.prediction.epoch:.3f} s an epoch{runner_up})")


__all__ = ["add_node_split_arguments", "node_split"]
