"""``sparse-dist cost``: predicted epoch time and bytes per rank, checked against a study or beyond it.

(``sparse-dist model`` is its old name, still accepted this release.)

* ``sparse-dist cost compare RESULTS_DIR``: for every run of a study,
  the prediction from the dataset's exact partition statistics, compute
  rates calibrated on the same configuration's smallest-P run, and the
  alpha-beta network model; prints measured vs predicted and the error,
  for the step and for the cycle (a step and its evaluation:
  :func:`runners.perf.cost_model.predict_cycle`), and writes ``model.csv``
  beside ``results.csv``.
* ``sparse-dist cost predict --graph ogbn-papers100M --ranks 64,256,1024``:
  the same model for a graph and P this machine cannot run, from the
  partition model of :mod:`runners.perf.cost_model` and rates calibrated on a
  study (``--calibrate-from RESULTS_DIR``); process grids too (``--plans grid:X,Y,Z`` or ``grid:auto``,
  :mod:`runners.perf.grid_model`), and a ranking of the exact plans per P with the one it picks.
* ``sparse-dist cost node-split --data DIR --calibrate-from RESULTS_DIR``: ranks x threads a node, each split's
  predicted epoch and the fastest (:mod:`runners.node_split_cmd`).
* ``sparse-dist cost bytes --data DIR --ranks 2,4,8``: the ``cover`` plan's exact bytes per epoch beside
  ``p2p``'s, per layer and direction, from the prepared dataset's covers (:func:`runners.perf.cost_model.pair_counts`; :func:`print_cover_table`).

Every assumption (network figures, placement, cores per rank, partition
model, active share of a staleness policy) is printed with the numbers.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from runners.argtypes import add_renamed, at_least, fraction, int_list
from runners.study.collect import ResultsError, read_csv, write_csv_rows
from algorithms.model import MODEL_KINDS
from algorithms.policies import AxisSpec, PolicySpec, policy_list_arg
from sparse_dist.compress import Codec
from sparse_dist.layout import Grid
from sparse_dist.accounting import ring_allreduce_bytes
from sparse_dist.predict import SENT, predict_halo_bytes, predict_spmm_bytes
from sparse_dist.plans import PLAN_NAMES, plan_class
from runners.perf.cost_model import (ModelShape, ExpectedTraffic, PairCounts, Prediction, Workload, pair_counts,
                                     predict_cycle, predict_epoch, predict_evaluation, workload_analytic,
                                     workload_from_shards)
from runners.data.shards import read_meta
from runners.node_split_cmd import add_node_split_arguments, node_split
from runners.perf.calibration import (GRAPHS, add_network_arguments, calibrate, graph_sizes, network_from, run_data_dir,
                                      run_shape, study_rates)
from runners.perf.grid_model import (PHASES, GridEpoch, all_ranks_bytes, choose_grid, grid_shapes, grid_terms,
                                     is_grid_plan, parse_grid_plan, split_plans)

DEFAULT_POLICIES = "exact,bns:keep=0.1,sancus-h:eps=0.05"
COMPARE_COLUMNS = ("run", "world_size", "plan", "policy", "compress", "calibration", "measured_epoch", "predicted_epoch",
                   "error", "predicted_compute", "predicted_exchange", "predicted_allreduce", "measured_bytes",
                   "predicted_bytes", "overlap_evaluation", "measured_cycle", "predicted_cycle", "cycle_error",
                   "predicted_eval_compute", "predicted_eval_exchange")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    modes = parser.add_subparsers(dest="mode", required=True)
    compare = modes.add_parser("compare", help="predicted vs measured for every run of a study")
    compare.add_argument("results", help="a study's output directory (holds results.csv)")
    add_network_arguments(compare, "shm")
    predict = modes.add_parser("predict", help="predictions for a graph and rank counts beyond this machine")
    predict.add_argument("--graph", choices=sorted(GRAPHS), default=None, help="a known graph's sizes")
    predict.add_argument("--nodes", type=at_least(1), help="number of nodes, >= 1 (instead of --graph)")
    predict.add_argument("--nnz", type=at_least(0),
                         help="nonzeros of the symmetrised adjacency, >= 0 (instead of --graph)")
    predict.add_argument("--features", type=at_least(1), help="input feature width, >= 1 (with --nodes)")
    predict.add_argument("--classes", type=at_least(1), help="number of classes, >= 1 (with --nodes)")
    predict.add_argument("--hidden", type=at_least(1), default=128, help="hidden width, >= 1 (default: %(default)s)")
    predict.add_argument("--layers", type=at_least(1), default=3, help="layers, >= 1 (default: %(default)s)")
    add_renamed(predict, "--layer-kind", "--model", dest="model", choices=MODEL_KINDS, default="gcn",
                help="the kind of every layer (default: %(default)s; --model is its old name)")
    predict.add_argument("--ranks", type=_rank_list, default="64,256,1024",
                         help="comma-separated P, each >= 1 (default: %(default)s)")
    predict.add_argument("--plans", type=_plan_list, default="dense-bcast,sparse-bcast,p2p",
                         help="comma-separated plans: 1D exchange plans, and process grids (GCN, exact) as "
                              "grid:X,Y,Z (X * Y * Z = each P) or grid:auto (every factorisation, the fastest "
                              "kept) (default: %(default)s)")
    predict.add_argument("--policies", default=None, type=policy_list_arg,
                         help="policies separated by ',' (or ';'); a policy's own parameters may use ',' too; "
                              "a run's two axes joined by '+' (bns:keep=0.1+sancus-e:eps=1) (default: "
                              f"{DEFAULT_POLICIES}, leaving out, with a note, a data-dependent staleness rule "
                              "that --calibrate-from has no measured run of and --active does not give)")
    predict.add_argument("--active", type=fraction, default=None,
                         help="share of forward broadcasts a data-dependent staleness rule sends "
                              "(default: measured in --calibrate-from's runs)")
    predict.add_argument("--cut", type=fraction, default=None,
                         help="edge-cut fraction of the partition (default: random partition, (P-1)/P)")
    predict.add_argument("--neighbour-parts", type=at_least(1), default=None,
                         help="parts the cut edges of one part spread over (default: all others)")
    predict.add_argument("--input-exchange", choices=("per-epoch", "once"), default="per-epoch",
                         help="layer 0: exchange dropout(X)W every epoch (default), or read X's halo fetched once "
                              "(the epoch figures then leave layer 0 out; the one-time halo is printed per P)")
    predict.add_argument("--calibrate-from", required=True,
                         help="a study's output directory; its P=1 exact p2p run gives the per-core rates")
    predict.add_argument("--threads", type=at_least(1), default=None, help="cores per rank (default: the network's "
                         "cores per node / ranks per node)")
    add_network_arguments(predict, "ib-hdr")
    moved = modes.add_parser("bytes", help="exact bytes per epoch of the cover plan beside p2p's, per layer")
    moved.add_argument("--data", required=True, help="a prepared dataset's directory (required)")
    moved.add_argument("--ranks", type=_rank_list, default="2,4,8",
                       help="comma-separated P (1D), each dividing the dataset's parts (default: %(default)s)")
    moved.add_argument("--hidden", type=at_least(1), default=16, help="hidden width, >= 1 (default: %(default)s)")
    moved.add_argument("--layers", type=at_least(1), default=2, help="layers, >= 1 (default: %(default)s)")
    moved.add_argument("--model", choices=("gcn", "sage"), default="gcn",
                       help="the kind of every layer (the cover plan refuses gat) (default: %(default)s)")
    moved.add_argument("--itemsize", type=at_least(1), default=4, help="bytes per value (default: %(default)s)")
    add_node_split_arguments(modes)


def _rank_list(text: str) -> str:
    """argparse type of ``--ranks``: comma-separated integers >= 1, kept as text."""
    return ",".join(map(str, int_list(1)(text)))


def _plan_list(text: str) -> str:
    """argparse type of ``--plans``: comma-separated plan names and ``grid:`` plans, kept as text."""
    plans = split_plans(text)
    for plan in filter(is_grid_plan, plans):
        try:
            parse_grid_plan(plan)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    unknown = [plan for plan in plans if plan not in PLAN_NAMES and not is_grid_plan(plan)]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown plan(s) {unknown}; expected names from {list(PLAN_NAMES)}, "
                                         f"grid:X,Y,Z or grid:auto")
    return ",".join(plans)


def _row_policy(row: dict[str, Any]) -> PolicySpec:
    """A study row's policy, parsed by the one policy parser."""
    return PolicySpec(AxisSpec.parse("sample", str(row["sample"] or "none")),
                      AxisSpec.parse("stale", str(row["stale"] or "none")))


def _policy_for(row: dict[str, Any], active: float | None = None) -> ExpectedTraffic:
    measured = row.get("broadcast_fraction")
    policy = _row_policy(row)
    if active is None and policy.caches:
        # one row group exchanges nothing, so the share does not matter there
        single = int(row["world_size"]) == int(row["replication"])
        active = 1.0 if single or measured in (None, "") else float(measured)
    return ExpectedTraffic.of(policy, active, Codec.parse(str(row.get("compress") or "none")))


def compare(args: argparse.Namespace) -> int:
    results = Path(args.results)
    rows = read_csv(results / "results.csv")
    sampled = [row for row in rows if str(row.get("mode") or "full") != "full"]
    rows = [row for row in rows if row not in sampled]
    if sampled:  # the model prices full-graph epochs; a mini-batch epoch's work is the sampler's
        print(f"note: {len(sampled)} mini-batch run(s) left out (the model prices full-graph epochs only)")
    if not rows:
        raise ResultsError(f"{results / 'results.csv'}: no finished full-graph runs to compare")
    net = network_from(args)
    out: list[dict[str, Any]] = []
    workloads: dict[tuple[str, int], Workload] = {}
    data_dirs = {row["run"]: run_data_dir(results, row) for row in rows}
    covers = any(plan_class(str(row["plan"])).pair_counted for row in rows)  # a cover run: its pairs' covers too
    print(f"network {net.name}: alpha {net.alpha_intra * 1e6:.2f} us, {1e-9 / net.beta_intra:.1f} GB/s, "
          f"{net.cores_per_node} cores a node"
          + (f", all nodes on {net.machine_cores} cores of one machine" if net.machine_cores else "")
          + f" ({net.note})")

    def work_of(row: dict[str, Any]) -> Workload:
        key = (str(data_dirs[row["run"]]), int(row["world_size"]) // int(row["replication"]))
        if key not in workloads:
            workloads[key] = workload_from_shards(*key, covers=covers)
        return workloads[key]

    def configuration(row: dict[str, Any]) -> tuple:
        return (row["dataset"], row["plan"], row["policy"], row.get("compress") or "none", row["replication"],
                row["hidden"], row["layers"], row.get("bandwidth") or "", row.get("variant") or "")

    for row in sorted(rows, key=lambda r: (*map(str, configuration(r)), r["world_size"])):
        base = min((r for r in rows if configuration(r) == configuration(row)), key=lambda r: r["world_size"])
        rates = calibrate(base, work_of(base), run_shape(base, read_meta(data_dirs[base["run"]])), net,
                          _policy_for(base))
        shape = run_shape(row, read_meta(data_dirs[row["run"]]))
        threads = int(row["threads_per_rank"] or 1)
        prediction = predict_epoch(work_of(row), shape, row["plan"], _policy_for(row), rates, net,
                                   int(row["replication"]), threads)
        evaluation = predict_evaluation(work_of(row), shape, row["plan"], rates, net, int(row["replication"]), threads)
        alongside = str(row.get("overlap_evaluation") or "False") == "True"
        cycle = predict_cycle(prediction, evaluation, alongside, float(row.get("eval_every") or 1))
        measured_cycle = float(row["cycle_time"]) if row.get("cycle_time") not in (None, "") else None
        out.append({"run": row["run"], "world_size": row["world_size"], "plan": row["plan"], "policy": row["policy"],
                    "compress": row.get("compress") or "none",
                    "calibration": base["run"] == row["run"], "measured_epoch": row["epoch_time"],
                    "predicted_epoch": prediction.epoch, "error": prediction.epoch / float(row["epoch_time"]) - 1.0,
                    "predicted_compute": prediction.compute_spmm + prediction.compute_dense,
                    "predicted_exchange": prediction.exchange, "predicted_allreduce": prediction.allreduce,
                    "measured_bytes": row["exchange_bytes"], "predicted_bytes": prediction.exchange_bytes_total,
                    "overlap_evaluation": alongside, "measured_cycle": measured_cycle, "predicted_cycle": cycle,
                    "cycle_error": cycle / measured_cycle - 1.0 if measured_cycle else None,
                    "predicted_eval_compute": evaluation.compute, "predicted_eval_exchange": evaluation.exchange})
    _print_compare(out)
    write_csv_rows(results / "model.csv", COMPARE_COLUMNS, out)
    print(f"wrote {results / 'model.csv'}")
    return 0


def _print_compare(out: list[dict[str, Any]]) -> None:
    print(f"{'P':>3} {'plan':<13}{'policy':<20}{'step s':>9}{'predicted':>10}{'error':>8}"
          f"{'cycle s':>9}{'predicted':>10}{'error':>8}{'bytes measured':>16}{'bytes predicted':>16}")
    for r in out:
        mark = "  (calibration)" if r["calibration"] else ""
        policy = r["policy"] + ("" if r.get("compress", "none") == "none" else f" +{r['compress']}")
        cycle = (f"{r['measured_cycle']:>9.4f}{r['predicted_cycle']:>10.4f}{r['cycle_error'] * 100:>7.1f}%"
                 if r.get("measured_cycle") else f"{'-':>9}{r['predicted_cycle']:>10.4f}{'-':>8}")
        print(f"{r['world_size']:>3} {r['plan']:<13}{policy:<20}{r['measured_epoch']:>9.4f}"
              f"{r['predicted_epoch']:>10.4f}{r['error'] * 100:>7.1f}%{cycle}{r['measured_bytes']:>16.0f}"
              f"{r['predicted_bytes']:>16.0f}{mark}")
    _print_errors("step, predicted runs", [abs(r["error"]) for r in out if not r["calibration"]])
    _print_errors("cycle (step and evaluation), every run", [abs(r["cycle_error"]) for r in out
                                                             if r.get("cycle_error") is not None])


def _print_errors(what: str, errors: list[float]) -> None:
    if errors:
        print(f"{what}: {len(errors)}, |error| mean {statistics.fmean(errors) * 100:.1f}%, "
              f"max {max(errors) * 100:.1f}%, within 20%: {sum(e <= 0.20 for e in errors)}/{len(errors)}, "
              f"within 25%: {sum(e <= 0.25 for e in errors)}/{len(errors)}")


def predict(args: argparse.Namespace) -> int:
    sizes = graph_sizes(args, "cost predict: give --graph or")
    net = network_from(args)
    threads = args.threads or max(net.cores_per_node // net.ranks_per_node, 1)
    plans = split_plans(args.plans)
    rank_counts = [int(x) for x in args.ranks.split(",")]
    grids = _grid_plans(plans, rank_counts, args.model)
    rates, _, rows = study_rates(Path(args.calibrate_from))
    shape = ModelShape(tuple([sizes["features"]] + [args.hidden] * (args.layers - 1) + [sizes["classes"]]),
                       kind=args.model, input_once=args.input_exchange == "once")
    if grids:  # the grid's elementwise passes, probed here (the probes import torch: only when a grid is priced)
        from runners.grid_probes import elementwise_rate
        rates = replace(rates, elementwise=elementwise_rate(args.hidden))
    name = args.graph or "graph"
    print(f"graph {name}: {sizes['nodes']:,} nodes, {sizes['nnz']:,} nonzeros, {sizes['features']} features, "
          f"{sizes['classes']} classes; {args.model.upper()} {args.layers} layers, hidden {args.hidden}, float32")
    print(f"network {net.name}: {net.note}; alpha {net.alpha_inter * 1e6:.1f} us off node / "
          f"{net.alpha_intra * 1e6:.1f} us on node, {1e-9 / net.beta_inter:.0f} / {1e-9 / net.beta_intra:.0f} GB/s, "
          f"{net.ranks_per_node} rank(s) a node, {threads} core(s) a rank")
    print(f"compute rates per core measured on this machine from {rates.source}: SpMM "
          f"{rates.spmm / 1e6:.0f} M nnz*col/s, dense {rates.dense / 1e9:.2f} G row*F_in*F_out/s "
          f"(scaled linearly to {threads} core(s): optimistic)"
          + (f"; the grid's elementwise passes {rates.elementwise / 1e9:.2f} G values/s, probed here"
             if rates.elementwise else ""))
    measured_active = _measured_active(rows)
    traffic = _expected_traffic(args.policies, args.active, measured_active)
    header = f"{'P':>5} {'plan':<18}{'policy':<20}{'GB recv/rank':>13}{'GB total':>10}" \
             f"{'compute s':>10}{'exchange s':>11}{'allreduce s':>12}{'epoch s':>9}"
    print(header)
    ranked: dict[int, list[tuple[str, float, float]]] = {}  # per P: (plan, GB of the busiest rank, epoch s)
    searched: dict[int, list[GridEpoch]] = {}
    for ranks in rank_counts:
        work = workload_analytic(name, sizes["nodes"], sizes["nnz"], ranks, args.cut, args.neighbour_parts)
        if shape.input_once:
            halo = predict_halo_bytes(Grid(ranks, 1), work.boundary, shape.dims[0], shape.itemsize)
            print(f"{ranks:>5} halo of X fetched once: {halo[:, 0].sum() / 1e9:.1f} GB sent by all ranks, "
                  f"{halo[:, 1].max() / 1e9:.3f} GB kept by the largest halo")
        ranked[ranks] = []
        for plan in (plan for plan in plans if not is_grid_plan(plan)):
            for policy_spec, policy in traffic:
                if policy_spec.refusal(plan):
                    continue
                result: Prediction = predict_epoch(work, shape, plan, policy, rates, net, 1, threads)
                print(f"{ranks:>5} {plan:<18}{policy_spec.text:<20}{result.exchange_bytes_max_recv / 1e9:>13.3f}"
                      f"{result.exchange_bytes_total / 1e9:>10.1f}"
                      f"{result.compute_spmm + result.compute_dense:>10.3f}{result.exchange:>11.3f}"
                      f"{result.allreduce:>12.5f}{result.epoch:>9.3f}")
                if policy_spec.is_exact:
                    gradients = ring_allreduce_bytes(shape.parameters + 1, ranks, ranks - 1, shape.itemsize)
                    ranked[ranks].append((plan, (result.exchange_bytes_max_recv + gradients) / 1e9, result.epoch))
        for plan in grids:
            priced = choose_grid(ranks, grid_shapes(plan, ranks), sizes["nodes"], sizes["nnz"], shape.dims,
                                 shape.itemsize, rates, net, threads, grid_terms(args.model))
            best = priced[0]
            label = plan if parse_grid_plan(plan) is not None else f"grid:auto={best.shape}"
            if parse_grid_plan(plan) is None:
                searched[ranks] = priced
            every_rank = all_ranks_bytes(best.shape, sizes["nodes"], shape.dims, shape.itemsize,
                                         grid_terms(args.model))
            print(f"{ranks:>5} {label:<18}{'exact':<20}{best.exchange_bytes / 1e9:>13.3f}"
                  f"{(sum(every_rank.values()) - every_rank['grad_allreduce']) / 1e9:>10.1f}"
                  f"{best.compute:>10.3f}{best.exchange:>11.3f}"
                  f"{best.allreduce:>12.5f}{best.epoch:>9.3f}")
            ranked[ranks].append((label, sum(best.bytes.values()) / 1e9, best.epoch))
    print("per epoch: GB recv/rank: the most exchange bytes one rank receives (forward + backward; a grid's "
          "allreduces and its loss's, a ring allreduce receiving what it sends); GB total: sent by all ranks; "
          "allreduce s: the gradients'. " + " ".join(work.notes))
    if grids:
        _print_grid_notes(searched, args.input_exchange == "once", args.model)
    _print_ranking(ranked)
    return 0


def _grid_plans(plans: list[str], rank_counts: list[int], kind: str) -> list[str]:
    """The ``grid:`` plans of ``--plans``, each checked against every P (a ResultsError in one sentence)."""
    grids = [plan for plan in plans if is_grid_plan(plan)]
    if grids:
        try:
            grid_terms(kind)
        except ValueError as exc:
            raise ResultsError(f"plan {grids[0]}: {exc}") from None
    for plan in grids:
        for ranks in rank_counts:
            try:
                grid_shapes(plan, ranks)
            except ValueError as exc:
                raise ResultsError(str(exc)) from None
    return grids


def _print_grid_notes(searched: dict[int, list[GridEpoch]], input_once: bool, kind: str, shown: int = 3) -> None:
    """What a grid row assumes, and ``grid:auto``'s fastest factorisations per P with the busiest rank's bytes."""
    print(f"grid: {kind.upper()}, exact, the allreduces of sparse_dist.grid_gcn (grid_sage); no partition: a random permutation of the "
          "nodes is assumed to balance A's blocks, (nnz + N) / (|d| |o|) entries each; ranks placed x + X (y + Y z); "
          "layer 0's aggregation A X is computed once before the first epoch (the grid has no input dropout), so "
          "the epoch figures leave it out" + ("" if input_once else " (1D's rows above exchange layer 0 every "
                                                                       "epoch: --input-exchange once compares alike)"))
    for ranks, priced in searched.items():
        print(f"grid:auto at P = {ranks}: {len(priced)} factorisation(s) X x Y x Z, the fastest "
              f"{min(shown, len(priced))} (GB of the busiest rank per epoch: {', '.join(PHASES)}):")
        for index, epoch in enumerate(priced[:shown]):
            phases = " ".join(f"{epoch.bytes[phase] / 1e9:.3f}" for phase in PHASES)
            compute = epoch.compute
            print(f"{ranks:>5} {str(epoch.shape):<12} GB {phases:<32} compute {compute:.3f} s, allreduces "
                  f"{epoch.exchange + epoch.allreduce:.3f} s, epoch {epoch.epoch:.3f} s"
                  + ("  <- chosen" if index == 0 else ""))


def _print_ranking(ranked: dict[int, list[tuple[str, float, float]]]) -> None:
    """Per P, the exact plans by predicted epoch time, and the pick."""
    if not any(ranked.values()):
        return
    print("ranking of the exact plans per P (GB: received by the busiest rank per epoch, every phase with the "
          "gradient allreduce):")
    for ranks, rows in ranked.items():
        for place, (plan, gigabytes, seconds) in enumerate(sorted(rows, key=lambda row: (row[2], row[1])), 1):
            mark = "  <- picked" if place == 1 else ""
            print(f"{ranks:>5} {place:>2}. {plan:<18}{gigabytes:>10.3f} GB{seconds:>10.3f} s{mark}")


def _expected_traffic(given: list[PolicySpec] | None, active: float | None,
                      measured: dict[str, float]) -> list[tuple[PolicySpec, ExpectedTraffic]]:
    """Each policy to predict with its traffic, decided before any row is printed.

    A data-dependent staleness rule needs its share of broadcasts (``--active``, or measured in the
    calibration study): named in ``--policies`` without one it is refused; among the defaults it is left
    out with a printed note, so the default command works from any study.
    """
    traffic = []
    for spec in given if given is not None else policy_list_arg(DEFAULT_POLICIES):
        try:
            traffic.append((spec, ExpectedTraffic.of(spec, active if active is not None
                                                     else measured.get(spec.stale.name))))
        except ValueError as exc:
            if given is not None:
                raise ResultsError(f"{exc} (the calibration study has no measured run of it)") from None
            print(f"note: {spec.text} left out: the calibration study has no measured run of it and its share "
                  f"of broadcasts is data-dependent (give --active, or calibrate from a study that ran it)")
    return traffic


def _measured_active(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean share of forward blocks sent, per staleness rule name, over a study's multi-group runs."""
    shares: dict[str, list[float]] = {}
    for row in rows:
        stale = _row_policy(row).stale
        if not stale.is_none and row["broadcast_fraction"] not in (None, "") \
                and int(row["world_size"]) > int(row["replication"]):
            shares.setdefault(stale.name, []).append(float(row["broadcast_fraction"]))
    for name, values in sorted(shares.items()):
        print(f"{name}: sends {statistics.fmean(values):.3f} of forward blocks (mean of {len(values)} measured "
              f"run(s) of the calibration study; --active overrides)")
    return {name: statistics.fmean(values) for name, values in shares.items()}


def main(comm: object, args: argparse.Namespace) -> int:
    if args.mode == "bytes":
        return cover_bytes(args)
    if args.mode == "node-split":
        return node_split(args)
    return compare(args) if args.mode == "compare" else predict(args)


def cover_bytes(args: argparse.Namespace) -> int:
    """``cost bytes``: the cover plan's exact bytes per epoch beside p2p's (every layer exchanging each epoch)."""
    meta = read_meta(args.data)
    dims = (int(meta["feature_dim"]),) + (args.hidden,) * (args.layers - 1) + (int(meta["num_classes"]),)
    shape = ModelShape(dims, args.model, args.itemsize)
    print_cover_table(str(meta.get("name", args.data)), [int(p) for p in args.ranks.split(",")], args.data, shape)
    return 0


def cover_layer_bytes(counts: PairCounts, shape: ModelShape) -> list[dict[str, float]]:
    """Per exchanging layer: width, and all ranks' sent bytes forward and backward for p2p and cover."""
    grid = Grid(counts.layout.parts, 1)
    union = np.zeros(counts.layout.parts, dtype=np.int64)  # unused by either plan's model
    out = []
    for width, backward in shape.exchanges:
        row = {"width": width}
        for plan, pairs in (("p2p", None), ("cover", counts.cover)):
            volume = predict_spmm_bytes(grid, counts.layout, counts.boundary, union, plan, width, shape.itemsize,
                                        pair_counts=pairs)
            row[f"{plan}_forward"] = float(volume["forward"][:, SENT].sum())
            row[f"{plan}_backward"] = float(volume["backward"][:, SENT].sum()) if backward else 0.0
        out.append(row)
    return out


def print_cover_table(name: str, ranks: list[int], data_dir: str | Path, shape: ModelShape) -> None:
    """The byte table of ``cost bytes``: per P, per layer and in total, p2p against cover."""
    print(f"{name}: bytes sent by all ranks per epoch, exact byte model (1D; {shape.itemsize}-byte values, widths "
          f"{'-'.join(str(d) for d in shape.dims)}, {shape.kind})")
    print(f"{'P':>3} {'layer':>5} {'width':>5} {'p2p fwd':>12} {'cover fwd':>12} {'p2p bwd':>12} {'cover bwd':>12}"
          f" {'ratio':>6} {'rows p2p':>10} {'rows cover':>10} {'partial':>8} {'cover s':>8}")
    for p in ranks:
        counts = pair_counts(data_dir, p)
        layers = cover_layer_bytes(counts, shape)
        for index, row in enumerate(layers):
            total_p2p = row["p2p_forward"] + row["p2p_backward"]
            total_cover = row["cover_forward"] + row["cover_backward"]
            ratio = total_cover / total_p2p if total_p2p else 1.0
            print(f"{p:>3} {index:>5} {row['width']:>5} {row['p2p_forward']:>12,.0f} {row['cover_forward']:>12,.0f} "
                  f"{row['p2p_backward']:>12,.0f} {row['cover_backward']:>12,.0f} {ratio:>6.3f}")
        total_p2p = sum(r["p2p_forward"] + r["p2p_backward"] for r in layers)
        total_cover = sum(r["cover_forward"] + r["cover_backward"] for r in layers)
        ratio = total_cover / total_p2p if total_p2p else 1.0
        print(f"{p:>3} {'all':>5} {'':>5} {sum(r['p2p_forward'] for r in layers):>12,.0f} "
              f"{sum(r['cover_forward'] for r in layers):>12,.0f} {sum(r['p2p_backward'] for r in layers):>12,.0f} "
              f"{sum(r['cover_backward'] for r in layers):>12,.0f} {ratio:>6.3f} {int(counts.boundary.sum()):>10,} "
              f"{int(counts.cover.sum()):>10,} {int(counts.pre_aggregated.sum()):>8,} {counts.seconds:>8.3f}")
    print("ratio: cover / p2p bytes (forward + backward); rows: boundary rows per exchange over all pairs; partial: "
          "of the cover's rows, those sent as partial sums; cover s: the matchings' time on this one process")
