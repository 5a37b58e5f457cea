"""The train command's epoch loop: steps, evaluations, one results row per epoch, stop at target, checkpoints.

Each epoch's row holds that step's figures (time, CPU, bytes, per rank as min/mean/max) and, where it was
evaluated, the metrics of the weights after it; ``wall`` is when the row's figures were all known (rank 0's
clock, after an allgather every rank enters). With ``--overlap-evaluation`` an epoch's evaluation runs beside
the next step (:meth:`Trainer.train_epoch`'s ``evaluate_alongside``), so its row is written after that step:
``wall`` and time-to-accuracy then count the wait for the next step. The last epoch, and the epoch after one
that reached ``--target-acc`` with ``--stop-at-target``, are evaluated after their step (nothing follows them).

A resumed run's ``wall`` is the run's time across its legs: the earlier legs' ``wall`` at the epoch it resumed
from (the last epoch record it kept of them; :func:`runners.results.read_earlier_legs`) plus this process's time
since launch; best value and time to target count the earlier legs' epochs too.

Collective: :func:`run_epochs` is entered by every rank.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from algorithms.checkpoint import SetWriter
from algorithms.train import TrainConfig, Trainer
from runners.launch import since_launch
from runners.results import EarlierLegs, ResultsWriteError, ResultsWriter, cpu_seconds, cpu_since, spread
from runners.time_to_accuracy import AccuracyClock, at_target, validation_name, validation_value
from sparse_dist.comm import Communicator, said_once


def traffic_spread(per_rank: list[dict[str, dict[str, int]]]) -> dict[str, dict[str, dict[str, float]]]:
    """Bytes per phase and direction as min/mean/max over ranks."""
    return {phase: {direction: spread([g[phase][direction] for g in per_rank]) for direction in ("sent", "recv")}
            for phase in per_rank[0]}


def _summarise(gathered: list[dict[str, Any]]) -> dict[str, Any]:
    times = {key: spread([g["time"][key] for g in gathered]) for key in gathered[0]["time"]}
    cpu = {key: spread([g["cpu"][key] for g in gathered]) for key in gathered[0]["cpu"]}
    return {"time": times, "cpu": cpu, "bytes": traffic_spread([g["bytes"] for g in gathered])}


@dataclass
class _Step:
    """A step whose row is not written yet: its record and this rank's CPU seconds."""

    epoch: int
    record: dict[str, Any]
    cpu: dict[str, float]


@dataclass
class EpochRows:
    """Writes the epoch rows and keeps what the final record needs (collective :meth:`write`)."""

    comm: Communicator
    args: argparse.Namespace
    trainer: Trainer
    writer: ResultsWriter
    epochs: int
    earlier: EarlierLegs | None = None  # rank 0 of a resumed run: its earlier legs' records
    clock: AccuracyClock = field(init=False)
    metrics: dict[str, float] = field(default_factory=dict)  # the last evaluation's
    metrics_epoch: int | None = None  # the epoch whose weights ``metrics`` are

    def __post_init__(self) -> None:
        self.clock = AccuracyClock(self.args.target_acc)  # rank 0's: wall times are its clock after each allgather
        for record in self.earlier.epochs if self.earlier is not None else []:
            if record.get("wall") is not None:
                self.clock.observe(int(record["epoch"]), float(record["wall"]), record)

    def wall(self) -> float:
        """The run's seconds so far: the earlier legs' (where resumed) and this process's since launch."""
        return (self.earlier.wall if self.earlier is not None else 0.0) + since_launch()

    def write(self, step: _Step, metrics: dict[str, float] | None, turns: float | None = None) -> bool:
        """Gather ``step``'s figures, write its row (with the last evaluation's metrics, ``metrics`` where this
        step was evaluated; ``turns``: this rank's seconds in that evaluation's turns beside the next step),
        print progress; whether the run stops at target here (rank 0's verdict, the same on every rank).
        Collective."""
        args, trainer, writer, record = self.args, self.trainer, self.writer, step.record
        evaluated = metrics is not None
        if metrics is not None:
            self.metrics, self.metrics_epoch = metrics, step.epoch
        gathered = self.comm.allgather_object({"time": record["time"], "cpu": step.cpu, "bytes": record["bytes"],
                                               "cache_bytes": record["cache_bytes"],
                                               "feature_cache": record.get("feature_cache"),
                                               "eval_bytes": trainer.eval_bytes if evaluated else None,
                                               "audit": record.get("audit"), "turns": turns,
                                               "reference": record.get("guard_reference"),
                                               "at_target": at_target(args.target_acc, self.metrics, evaluated),
                                               **({"results_error": writer.error} if writer.error else {})})
        elapsed = self.wall()  # after the allgather: every rank has finished this epoch and its evaluation
        # rank 0's verdict, seen alike by every rank (the metric is global, but one boolean decides for all)
        stopped = bool(args.stop_at_target and gathered[0]["at_target"])
        if gathered[0].get("results_error"):  # rank 0 could not write the results file: every rank stops here
            trainer.close()
            raise said_once(ResultsWriteError(gathered[0]["results_error"]))
        if self.comm.rank != 0:
            return stopped
        epoch, last = step.epoch, step.epoch == self.epochs
        if evaluated:
            self.clock.observe(epoch, elapsed, self.metrics)
        evaluation = {"eval_bytes": traffic_spread([g["eval_bytes"] for g in gathered])} if evaluated else {}
        if turns is not None:  # the same on every rank: an evaluation beside the next step
            evaluation["evaluation_turns"] = spread([g["turns"] for g in gathered])
        if record.get("audit") is not None:  # the errors are global (the same on every rank)
            evaluation["audit"] = {"layer_error": record["audit"]["layer_error"],
                                   "seconds": spread([g["audit"]["seconds"] for g in gathered]),
                                   "bytes": traffic_spread([g["audit"]["bytes"] for g in gathered])}
        if record.get("guard_reference") is not None:  # the guard's bias signal: global figures, per-rank cost
            reading = {key: value for key, value in record["guard_reference"].items()
                       if key not in ("seconds", "bytes")}
            costs = [g["reference"] for g in gathered]
            evaluation["guard_reference"] = {**reading, "seconds": spread([c["seconds"] for c in costs]),
                                             "bytes": traffic_spread([c["bytes"] for c in costs])}
        if record.get("steering") is not None:  # the same on every rank: from the allreduced signal
            evaluation["steering"] = {**record["steering"], "metrics_epoch": self.metrics_epoch}
        if record.get("guard") is not None:  # the same on every rank: agreed at the last evaluation
            evaluation["guard"] = {key: value for key, value in record["guard"].items() if key != "line"}
            print(record["guard"]["line"], flush=True)
        if record.get("bit_widths") is not None:  # the same on every rank: agreed from the summed errors
            evaluation["bit_widths"] = record["bit_widths"]
        if record.get("explanation") is not None:  # dgs: rank 0's explanation (loss and mask means)
            evaluation["explanation"] = record["explanation"]
        if record.get("feature_cache") is not None:  # summed over ranks: needed boundary rows and cache hits
            totals = {key: sum(g["feature_cache"][key] for g in gathered) for key in ("needed", "hits")}
            evaluation["feature_cache"] = {**totals, "hit_rate": totals["hits"] / max(totals["needed"], 1)}
        writer.write({"type": "epoch", "epoch": epoch, "wall": elapsed, "loss": record["loss"], **self.metrics,
                      **_summarise(gathered), **evaluation, "broadcasts": record["broadcasts"],
                      "cache_bytes": spread([g["cache_bytes"] for g in gathered])})
        if epoch % args.print_every == 0 or last or epoch == 1 or stopped:
            whose = "" if evaluated or self.metrics_epoch is None else f" (epoch {self.metrics_epoch}'s)"
            shown = " ".join(f"{key} {value:.4f}" for key, value in self.metrics.items()) + whose
            wall = max(g["time"]["total"] for g in gathered)
            print(f"epoch {epoch:4d} loss {record['loss']:.4f} {shown} time {wall:.4f}s", flush=True)
        return stopped


def run_epochs(comm: Communicator, args: argparse.Namespace, trainer: Trainer, config: TrainConfig,
               writer: ResultsWriter, checkpoints: SetWriter | None, every: int,
               earlier: EarlierLegs | None = None) -> tuple[EpochRows, bool]:
    """Train from ``trainer.epoch`` to ``config.epochs`` (or the target); the rows' keeper and whether the run
    stopped at target (``earlier``: rank 0 of a resumed run, its earlier legs' records). Collective."""
    rows = EpochRows(comm, args, trainer, writer, config.epochs, earlier)
    overlap = bool(getattr(args, "overlap_evaluation", False))
    waiting: _Step | None = None  # (overlap) the step whose evaluation runs beside the next one
    reached: tuple[int, dict[str, float]] | None = None  # the epoch that reached the target (--stop-at-target)
    stopped = False

    def checkpoint(epoch: int, final: bool) -> None:
        if checkpoints is not None and (epoch % every == 0 or final):  # collective: one set, current at once
            state = trainer.state()  # every rank: a grid run gathers its blocks (collective)
            checkpoints.commit(epoch, state if comm.rank == 0 else None,
                               trainer.policy_state() if trainer.has_policy_state else None)

    steered = config.steer_evaluation  # the step's own signal decides (algorithms.training.steering)
    while trainer.epoch < config.epochs and not stopped:
        epoch = trainer.epoch + 1
        scheduled = not steered and (epoch % config.eval_every == 0 or epoch == config.epochs)
        cpu_before = cpu_seconds()
        record = trainer.train_epoch(evaluation_follows=scheduled and not overlap,
                                     evaluate_alongside=waiting is not None,
                                     **({"steered": not overlap} if steered else {}))  # full-graph only
        evaluated = scheduled or (steered and record["steering"]["due"] is not None)
        step = _Step(epoch, record, cpu_since(cpu_before))  # CPU: the step's and its evaluation's (after, or turned)
        if waiting is not None:  # the previous epoch's row, its evaluation done beside this step
            if rows.write(waiting, record["evaluation"], record["evaluation_seconds"]):
                reached = (waiting.epoch, dict(rows.metrics))
            waiting = None
        if overlap and evaluated and reached is None and epoch < config.epochs:
            waiting = step  # evaluated beside the next step
        elif rows.write(step, trainer.evaluate() if evaluated or reached is not None else None) and reached is None:
            reached = (epoch, dict(rows.metrics))
        stopped = reached is not None
        checkpoint(epoch, epoch == config.epochs or stopped)
    if reached is not None and comm.rank == 0:
        at, metrics = reached
        print(f"stopped at epoch {trainer.epoch}: " + ("" if at == trainer.epoch else f"epoch {at}'s ")
              + f"{validation_name(metrics)} {validation_value(metrics):.4f} >= --target-acc {args.target_acc:g}",
              flush=True)
    return rows, stopped
