"""What ``sparse-dist cost`` reads before it predicts: known graphs' sizes, the network's figures from the command
line, and per-core compute rates calibrated on a study's measured run.

A calibration run is a study row (``results.csv``) of an exact ``p2p`` run without compression; its local SpMM and
dense seconds, divided into the work the model gives that run, are the rates (:func:`calibrate`). The smallest P
(then the largest graph) of a study is the one ``cost predict`` and ``cost layouts`` take
(:func:`study_rates`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from algorithms.policies import PolicySpec
from runners.argtypes import at_least, non_negative, positive
from runners.data.shards import read_meta
from runners.perf.cost_model import (ExpectedTraffic, ModelShape, Rates, Workload, cores_per_rank, predict_epoch,
                                     workload_from_shards)
from runners.study.collect import ResultsError, read_csv
from sparse_dist.cost import NETWORKS, Network
from sparse_dist.plans import PointToPointPlan

# Public figures of OGB graphs (symmetrised nonzeros = twice the undirected edges).
GRAPHS: dict[str, dict[str, int]] = {
    "ogbn-papers100M": {"nodes": 111_059_956, "nnz": 2 * 1_615_685_872, "features": 128, "classes": 172},
    "ogbn-products": {"nodes": 2_449_029, "nnz": 2 * 61_859_140, "features": 100, "classes": 47},
    "ogbn-arxiv": {"nodes": 169_343, "nnz": 2 * 1_166_243, "features": 128, "classes": 40},
}
ITEMSIZE = {"float32": 4, "float64": 8}


def add_network_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    """``--network`` and its overrides (alpha, bandwidth, ranks and cores per node, emulated machine cores)."""
    parser.add_argument("--network", choices=sorted(NETWORKS), default=default,
                        help=f"alpha-beta preset (default: {default}); see runners/perf/cost_model.py")
    parser.add_argument("--alpha", type=non_negative, help="override alpha (s) on and off node, >= 0")
    parser.add_argument("--beta-gbs", type=positive, help="override bandwidth (GB/s) on and off node, > 0")
    parser.add_argument("--ranks-per-node", type=at_least(1), help="override ranks per node, >= 1")
    parser.add_argument("--cores-per-node", type=at_least(1), help="override cores per node, >= 1")
    parser.add_argument("--machine-cores", type=at_least(1),
                        help="the runs' emulated nodes all shared this many cores of one machine (`sparse-dist "
                             "emulate`), >= 1: a rank computes with at most this / P cores")


def network_from(args: argparse.Namespace) -> Network:
    """The preset of ``--network`` with the command line's overrides (``shm``: this machine's cores)."""
    net = NETWORKS[args.network]
    if net.name == "shm":
        net = replace(net, cores_per_node=os.cpu_count() or 1)
    changes: dict[str, Any] = {}
    if args.alpha is not None:
        changes.update(alpha_intra=args.alpha, alpha_inter=args.alpha)
    if args.beta_gbs is not None:
        changes.update(beta_intra=1 / (args.beta_gbs * 1e9), beta_inter=1 / (args.beta_gbs * 1e9))
    if args.ranks_per_node:
        changes["ranks_per_node"] = args.ranks_per_node
    if args.cores_per_node:
        changes["cores_per_node"] = args.cores_per_node
    if args.machine_cores:
        changes["machine_cores"] = args.machine_cores
    return replace(net, **changes) if changes else net


def graph_sizes(args: argparse.Namespace, refusal: str) -> dict[str, int]:
    """``nodes``, ``nnz``, ``features`` and ``classes`` from ``--graph`` (a known graph) and the flags of those
    names, which win; a :class:`ResultsError` (``refusal`` and the missing flags) where one is missing."""
    sizes = dict(GRAPHS[args.graph]) if args.graph else {}
    for key in ("nodes", "nnz", "features", "classes"):
        if getattr(args, key) is not None:
            sizes[key] = getattr(args, key)
    missing = [key for key in ("nodes", "nnz", "features", "classes") if key not in sizes]
    if missing:
        raise ResultsError(f"{refusal} --{' --'.join(missing)}")
    return sizes


def run_shape(row: dict[str, Any], meta: dict[str, Any]) -> ModelShape:
    """The layer widths, model kind and element size a run trained with (from its study row)."""
    dims = [meta["feature_dim"]] + [int(row["hidden"])] * (int(row["layers"]) - 1) + [meta["num_classes"]]
    return ModelShape(tuple(dims), kind=str(row["model"]), itemsize=ITEMSIZE[str(row["dtype"])],
                      input_once=str(row.get("input_exchange") or "per-epoch") == "once",
                      receiver_dropout=str(row.get("receiver_dropout") or "False") == "True")


def calibrate(row: dict[str, Any], work: Workload, shape: ModelShape, net: Network, policy: ExpectedTraffic) -> Rates:
    """Per-core rates that reproduce one measured run's local SpMM and dense time."""
    cores = cores_per_rank(net, int(row["world_size"]), int(row["threads_per_rank"] or 1))
    unit = Rates(spmm=1.0, dense=1.0, policy=1.0)
    replication = int(row["replication"])
    probe = predict_epoch(work, shape, row["plan"], policy, unit, net, replication, int(row["threads_per_rank"] or 1))
    # probe.compute_* are the work units of the slowest rank divided by cores: rate = units / measured seconds
    own = float(row.get("t_policy") or 0.0)  # results.csv files older than the column: none
    return Rates(spmm=probe.compute_spmm / float(row["t_local_spmm"]),
                 dense=probe.compute_dense / float(row["t_dense"]),
                 source=f"{row['run']} ({cores:g} core(s) a rank)",
                 policy=probe.compute_policy / own if own > 0 else 0.0)


def run_data_dir(results: Path, row: dict[str, Any]) -> Path:
    """The prepared dataset a run trained on: the path it recorded, or the study's own ``data/`` copy of
    that directory when the study was moved."""
    recorded = Path(str(row["data"]))
    moved = results / "data" / recorded.name
    return recorded if recorded.is_dir() or not moved.is_dir() else moved


def study_rates(study: Path) -> tuple[Rates, dict[str, Any], list[dict[str, Any]]]:
    """Rates from a study's calibration run (module docstring), that run's row and all the study's rows; a
    :class:`ResultsError` in one sentence where the study has no exact uncompressed p2p run."""
    rows = read_csv(study / "results.csv")
    calibration = [r for r in rows if r["plan"] == PointToPointPlan.name and PolicySpec.parse(r["policy"]).is_exact
                   and (r.get("compress") or "none") == "none"]
    if not calibration:
        raise ResultsError(f"{study}: no exact p2p run to calibrate the compute rates on")
    base = min(calibration, key=lambda r: (r["world_size"], -float(r["nodes"] or 0)))
    here = replace(NETWORKS["shm"], cores_per_node=os.cpu_count() or 1)
    base_dir = run_data_dir(study, base)
    rates = calibrate(base, workload_from_shards(base_dir, int(base["world_size"]) // int(base["replication"])),
                      run_shape(base, read_meta(base_dir)), here, ExpectedTraffic())
    return rates, base, rows


__all__ = ["GRAPHS", "ITEMSIZE", "add_network_arguments", "calibrate", "graph_sizes", "network_from", "run_data_dir",
           "run_shape", "study_rates"]
