"""Results of many runs in one table: one CSV row per run, plus all raw JSON lines in one file.

Time figures leave out the study's warm-up epochs. Per epoch, ``epoch_time``
is the slowest rank's wall time (what a user waits for), its mean over the timed epochs (``epoch_time_std``,
``epoch_time_median``, ``epoch_time_min`` and ``epoch_time_max`` give their spread); the breakdown
columns (``t_local_spmm``, ``t_dense``, ``t_exchange``, ``t_exchange_wait``, ``t_allreduce``,
``t_allreduce_wait``) are means over ranks, so they add up to ``epoch_time_mean_rank``. ``t_exchange`` is a
rank's own seconds in the SpMM exchanges (posting, copies, the transfer), ``t_exchange_wait`` its seconds in
them waiting for partners that had not posted yet (load imbalance), and the same pair for the gradient
allreduce ("Waits" in :mod:`sparse_dist.comm`); in results files older than the split the waits are 0 and
``t_exchange`` / ``t_allreduce`` hold them. ``t_dense``
is all compute besides the local SpMM (weight multiplies, dropout, loss,
optimiser), what the performance model calls dense; ``t_masks`` (making
dropout masks), ``t_dropout`` (applying them) and ``t_optimizer`` show three
of its parts (0 in results files older than them); ``t_policy`` is the compute a policy books for itself
beside them (dgs's explanation, in the epochs that explain; 0 for the others). Bytes are
per epoch, averaged over the timed epochs: ``exchange_bytes`` is what all
ranks sent in the training exchanges together (:data:`EXCHANGE_PHASES`: forward and backward SpMM
exchanges, and a mini-batch run's sampling rounds and feature pulls, which are also ``sample_bytes`` and
``fetch_bytes``; 0 in full-graph runs, so their ``exchange_bytes`` is unchanged),
``exchange_bytes_max_rank`` the largest sent + received of one rank.

The evaluation: ``eval_every`` and ``overlap_evaluation`` are the run's flags (under ``steer_evaluation``,
``eval_every`` is the timed epochs per evaluation the run made); ``cycle_time`` the mean wall
seconds from one epoch's row to the next over the timed epochs (the step and its evaluation, however they
overlap; with ``overlap_evaluation`` the last row, whose evaluation ran after its own step with nothing beside
it, is left out); ``t_evaluation_turns`` the mean wall seconds of an evaluation's turns beside the next step
(its compute and its waits for its own exchanges; 0 without ``overlap_evaluation``); ``eval_bytes`` what all
ranks sent in one evaluation.

Time-to-accuracy (every epoch counted, warm-up included: it is time from launch): ``wall_total`` is the run's
wall seconds from launch to its ``final`` record; ``best_val`` the best validation accuracy (micro-F1 for
multi-label) of any epoch; ``time_to_target`` the ``wall`` (seconds since launch, slowest rank, evaluation
included; :mod:`runners.launch`) of the first epoch whose validation metric reaches ``target_acc``, at
``target_epoch``; empty if the run never reached it. ``target_acc`` is the study's ``target_acc`` where it sets
one; otherwise :data:`~runners.time_to_accuracy.DEFAULT_TARGET_FRACTION` (0.98) of the best validation value of
the study's exact, uncompressed p2p run on the same dataset and P (the highest, where several seeds, replications
or bandwidths give several), computed here from each run's epoch curve, so that every policy at that dataset and
P races to the same target. Without such a run (and without ``target_acc``) the three are empty; so is
``time_to_target`` for results files older than the ``wall`` field.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
from pathlib import Path
from typing import Any, Iterable

from algorithms.policies import PolicySpec
from runners.results import ResultsWriter, temporary_beside
from runners.time_to_accuracy import DEFAULT_TARGET_FRACTION, curve, first_reaching
from sparse_dist.plans import PointToPointPlan

DENSE_PARTS = ("dense", "masks", "dropout", "optimizer")  # an epoch record's parts that make up t_dense
WAIT_PARTS = ("exchange_wait", "allreduce_wait")  # a rank's waits for late partners in the exchanges and allreduce
OWN_PARTS = ("total", "local_spmm", "exchange", "allreduce", *WAIT_PARTS) + DENSE_PARTS  # the rest is a policy's
EXCHANGE_PHASES = ("forward", "backward", "sample", "fetch")  # a training epoch's exchanges (mini-batch: the last two)
SPREAD_COLUMNS = ("epoch_time_median", "epoch_time_min", "epoch_time_max")  # of a run's timed epochs
CSV_COLUMNS = (
    "study", "run", "dataset", "nodes", "edges", "scaling", "world_size", "replication", "plan", "policy", "sample",
    "stale", "compress", "variant", "mode", "seed", "model", "hidden", "layers", "dtype", "input_exchange", "receiver_dropout", "epochs", "warmup", "epoch_time", "epoch_time_std",
    *SPREAD_COLUMNS,
    "epoch_time_mean_rank", "t_local_spmm", "t_dense", "t_exchange", "t_exchange_wait", "t_allreduce",
    "t_allreduce_wait", "t_masks",
    "t_dropout", "t_optimizer", "t_policy", "exchange_bytes", "sample_bytes", "fetch_bytes",
    "exchange_bytes_max_rank", "allreduce_bytes", "broadcast_fraction", "eval_every", "overlap_evaluation",
    "cycle_time", "t_evaluation_turns", "eval_bytes", "final_test", "final_val", "best_val", "target_acc",
    "time_to_target", "target_epoch", "wall_total", "peak_rss_max",
    "threads_per_rank", "ranks_on_node", "cpu_count", "launcher", "bandwidth", "results_file", "data",
)


class ResultsError(ValueError):
    """A results file that cannot be read; the message names it."""


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON-lines records of one run's results file."""
    records = []
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ResultsError(f"{path}:{number}: not a JSON line ({exc})") from None
    return records


def is_complete(path: Path) -> bool:
    """A results file that exists and ends with its ``final`` record (the run finished).

    A run in progress or killed has only ``NAME.partial`` (:class:`runners.results.ResultsWriter`), so ``path``
    does not exist; a file cut inside a line, or one without its ``final`` record, is not complete either."""
    try:
        records = read_records(path)
    except (OSError, ResultsError):
        return False
    return bool(records) and records[-1].get("type") == "final"


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def _spread(totals: list[float]) -> dict[str, float]:
    """Median, min and max of the timed epochs' times: the spread a scaling point states beside its mean."""
    figures = (statistics.median(totals), min(totals), max(totals)) if totals else (float("nan"),) * 3
    return dict(zip(SPREAD_COLUMNS, figures))


def summarise_run(records: list[dict[str, Any]], warmup: int, extra: dict[str, Any]) -> dict[str, Any]:
    """One CSV row from one run's records (``extra`` supplies the study's own columns)."""
    config = next(r for r in records if r["type"] == "config")
    environment = next((r for r in records if r["type"] == "environment"), {})
    final = next(r for r in records if r["type"] == "final")
    setup = next((r for r in records if r["type"] == "setup"), {})  # absent in files older than it
    epochs = [r for r in records if r["type"] == "epoch"]
    timed = epochs[warmup:] or epochs
    world = int(config["world_size"])
    totals = [e["time"]["total"]["max"] for e in timed]
    row: dict[str, Any] = {
        "world_size": world, "replication": config["replication"], "plan": config["plan"],
        "sample": config["sample"], "stale": config["stale"], "compress": config.get("compress", "none"),
        "mode": config.get("mode", "full"), "seed": config["seed"], "model": config["model"],
        "hidden": config["hidden"], "layers": config["layers"], "dtype": config["dtype"], "data": config["data"],
        "input_exchange": setup.get("input_exchange", {}).get("mode", "per-epoch"),
        "receiver_dropout": bool(setup.get("receiver_dropout", False)),
        "epochs": len(epochs), "warmup": warmup,
        "epoch_time": _mean(totals), "epoch_time_std": statistics.pstdev(totals) if len(totals) > 1 else 0.0,
        **_spread(totals),
        "epoch_time_mean_rank": _mean([e["time"]["total"]["mean"] for e in timed]),
        "exchange_bytes": _mean([sum(_phase_sent(e, phase) for phase in EXCHANGE_PHASES) * world for e in timed]),
        "sample_bytes": _mean([_phase_sent(e, "sample") * world for e in timed]),
        "fetch_bytes": _mean([_phase_sent(e, "fetch") * world for e in timed]),
        "exchange_bytes_max_rank": _mean([max_rank_traffic(e) for e in timed]),
        "allreduce_bytes": _mean([e["bytes"]["grad_allreduce"]["sent"]["mean"] * world for e in timed]),
        "broadcast_fraction": broadcast_fraction(timed, world // int(config["replication"])),
        "final_test": final.get("test_acc", final.get("test_f1")),
        "final_val": final.get("val_acc", final.get("val_f1")),
        "peak_rss_max": max(p.get("rss", 0) for p in final.get("peak_memory_per_rank", [{}])),
        "threads_per_rank": environment.get("threads_per_rank"),
        "ranks_on_node": environment.get("ranks_on_node"), "cpu_count": environment.get("cpu_count"),
    }
    points = curve(epochs)
    row["best_val"] = max((value for _, _, value in points), default=final.get("best_val"))
    row["wall_total"] = final.get("wall_total", points[-1][1] if points else None)
    row[CURVE] = points  # not a CSV column: add_time_to_target reads it
    for part in ("local_spmm", "exchange", "allreduce", *WAIT_PARTS, "masks", "dropout", "optimizer"):
        row[f"t_{part}"] = _mean([e["time"].get(part, {"mean": 0.0})["mean"] for e in timed])
    row["t_dense"] = _mean([sum(e["time"].get(part, {"mean": 0.0})["mean"] for part in DENSE_PARTS) for e in timed])
    full = row["mode"] == "full"  # a mini-batch epoch's parts (sampling, fetching) are its own, not a policy's
    row["t_policy"] = _mean([sum(value["mean"] for part, value in e["time"].items() if part not in OWN_PARTS)
                             for e in timed]) if full else 0.0
    row.update(evaluation_columns(config, timed, world))
    row.update(extra)
    return row


def evaluation_columns(config: dict[str, Any], timed: list[dict[str, Any]], world: int) -> dict[str, Any]:
    """``eval_every``, ``overlap_evaluation``, ``cycle_time``, ``t_evaluation_turns`` and ``eval_bytes`` of a
    run's timed epoch rows (see the module docstring; a steered run's ``eval_every`` is its timed epochs per
    evaluation, measured)."""
    alongside = bool(config.get("overlap_evaluation", False))
    walls = [e["wall"] for e in timed if "wall" in e]  # results files older than ``wall``: no cycle
    cycles = [later - earlier for earlier, later in zip(walls, walls[1:])]
    if alongside:
        cycles = cycles[:-1]
    evaluated = [e for e in timed if e.get("eval_bytes")]
    turns = [e["evaluation_turns"]["mean"] for e in timed if e.get("evaluation_turns")]
    every = config.get("eval_every", 1)
    if config.get("steer_evaluation") and evaluated:  # steered: the measured mean epochs between evaluations
        every = len(timed) / len(evaluated)
    return {"eval_every": every, "overlap_evaluation": alongside,
            "cycle_time": _mean(cycles) if cycles else None,
            "t_evaluation_turns": _mean(turns) if turns else 0.0,
            "eval_bytes": _mean([sum(_phase_sent({"bytes": e["eval_bytes"]}, phase) for phase in EXCHANGE_PHASES)
                                 * world for e in evaluated]) if evaluated else None}


CURVE = "_validation_curve"
"""The key of a row's ``(epoch, wall, validation value)`` points (left out of the CSV)."""


def default_targets(rows: list[dict[str, Any]]) -> dict[tuple[Any, int], float]:
    """Per (dataset, P): :data:`DEFAULT_TARGET_FRACTION` of the best validation value of its exact p2p run(s),
    uncompressed and no variant (a compressed exact run, or a mini-batch one, races to the target like every
    other policy)."""
    best: dict[tuple[Any, int], float] = {}
    for row in rows:
        if _is_reference(row) and row.get("best_val") is not None:
            key = (row.get("dataset"), int(row["world_size"]))
            best[key] = max(best.get(key, float("-inf")), float(row["best_val"]))
    return {key: DEFAULT_TARGET_FRACTION * value for key, value in best.items()}


def _is_reference(row: dict[str, Any]) -> bool:
    """Whether ``row`` is a reference run: the point-to-point plan, a policy that parses as exact (the study's own
    parser), uncompressed and no variant."""
    return (row.get("plan") == PointToPointPlan.name and row.get("policy") is not None
            and PolicySpec.parse(str(row["policy"])).is_exact and (row.get("compress") or "none") == "none"
            and not row.get("variant"))


def add_time_to_target(rows: list[dict[str, Any]], target_acc: float | None = None) -> None:
    """Fill ``target_acc``, ``time_to_target`` and ``target_epoch`` of every row (see the module docstring):
    the study's ``target_acc``, else the default target of the row's dataset and P."""
    defaults = default_targets(rows) if target_acc is None else {}
    for row in rows:
        target = target_acc if target_acc is not None else defaults.get((row.get("dataset"), int(row["world_size"])))
        row["target_acc"] = target
        row["time_to_target"], row["target_epoch"] = first_reaching(row.get(CURVE, []), target)


def _phase_sent(epoch: dict[str, Any], phase: str) -> float:
    """Mean bytes one rank sent in ``phase`` in one epoch (0 where the results file has no such phase)."""
    return epoch["bytes"].get(phase, {}).get("sent", {}).get("mean", 0.0)


def max_rank_traffic(epoch: dict[str, Any]) -> float:
    """Upper bound of one rank's exchange bytes (sent + received, :data:`EXCHANGE_PHASES`) in one epoch."""
    return sum(epoch["bytes"].get(phase, {}).get(direction, {}).get("max", 0) for phase in EXCHANGE_PHASES
               for direction in ("sent", "recv"))


def broadcast_fraction(epochs: list[dict[str, Any]], groups: int) -> float | None:
    """Share of (epoch, layer, owner) forward blocks that were sent (SANCUS); None without a staleness policy.

    Each decision lists the ids of the ACTIVE owners out of ``owners`` exchanged ones (older results
    files lack ``owners``: every row group is counted then).
    """
    decisions = [d for e in epochs for d in e.get("broadcasts") or []]  # a mini-batch epoch records None
    owners = sum(int(d.get("owners", groups)) for d in decisions)
    return sum(len(d["active"]) for d in decisions) / owners if owners else None


def write_atomically(path: Path, write: Any) -> None:
    """Call ``write(handle)`` on a temporary file beside ``path``, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_beside(path)
    with open(temporary, "w", newline="") as handle:
        write(handle)
    os.replace(temporary, path)


def write_csv(path: Path, rows: Iterable[dict[str, Any]], target_acc: float | None = None) -> None:
    """The study table (:data:`CSV_COLUMNS`), time-to-target filled first (:func:`add_time_to_target`)."""
    rows = list(rows)
    add_time_to_target(rows, target_acc)
    write_csv_rows(path, CSV_COLUMNS, rows)


def write_csv_rows(path: Path, columns: tuple[str, ...], rows: Iterable[dict[str, Any]]) -> None:
    """A CSV with ``columns`` (None becomes an empty cell), written atomically."""
    rows = list(rows)

    def write(handle: Any) -> None:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: ("" if row.get(key) is None else row.get(key)) for key in columns})

    write_atomically(path, write)


def write_raw(path: Path, runs: Iterable[tuple[str, list[dict[str, Any]]]]) -> None:
    """Every record of every run in one JSON-lines file, each tagged with its ``run``."""
    writer = ResultsWriter(path)
    for run_id, records in runs:
        for record in records:
            writer.write({"run": run_id, **record})
    writer.close()


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a study CSV with numbers parsed back (empty cells become None)."""
    if not path.is_file():
        raise ResultsError(f"{path}: no such results table (run `sparse-dist sweep` first)")
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in ("run", "world_size", "plan", "policy", "epoch_time") if c not in (reader.fieldnames or [])]
        if missing:
            raise ResultsError(f"{path}: not a study table (missing columns {missing})")
        return [{key: _number(value) for key, value in row.items()} for row in reader]


def _number(text: str) -> Any:
    if text == "":
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
