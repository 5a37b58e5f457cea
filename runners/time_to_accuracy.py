"""Time-to-accuracy: wall seconds from launch until the validation metric first reaches a target.

The validation metric is ``val_acc`` (single-label) or ``val_f1`` (micro-F1, multi-label), whichever an epoch
record carries. A curve is the ``(epoch, wall, value)`` of every epoch that carries both a ``wall`` and the
metric (``wall``: seconds since launch at the end of that epoch, evaluation included; see
:mod:`runners.launch`). Epochs that did not evaluate repeat the last evaluated value, so the first epoch at or
above a target is always one that evaluated. Time-to-target needs a target: ``train --target-acc A``, a
study's ``target_acc``, or by default :data:`DEFAULT_TARGET_FRACTION` of a reference run's best value
(:mod:`runners.study.collect`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

VALIDATION_METRICS = ("val_acc", "val_f1")

DEFAULT_TARGET_FRACTION = 0.98
"""Without an explicit target, a study's target is this fraction of its exact p2p run's best validation value."""


def validation_value(record: dict[str, Any]) -> float | None:
    """The validation metric an epoch (or final) record carries, or None."""
    for key in VALIDATION_METRICS:
        if record.get(key) is not None:
            return float(record[key])
    return None


def validation_name(metrics: dict[str, Any]) -> str:
    """``val_acc`` or ``val_f1``: the metric a target is compared with."""
    return "val_f1" if metrics.get("val_f1") is not None and metrics.get("val_acc") is None else "val_acc"


def at_target(target: float | None, metrics: dict[str, Any], evaluated: bool) -> bool:
    """Whether this epoch evaluated and its validation metric is at least ``target`` (False without one)."""
    value = validation_value(metrics) if evaluated else None
    return target is not None and value is not None and value >= target


def curve(epochs: Iterable[dict[str, Any]]) -> list[tuple[int, float, float]]:
    """``(epoch, wall, value)`` of every epoch record with a ``wall`` and a validation metric (older results
    files have no ``wall``: an empty curve)."""
    points = []
    for record in epochs:
        value = validation_value(record)
        if value is not None and record.get("wall") is not None:
            points.append((int(record["epoch"]), float(record["wall"]), value))
    return points


def first_reaching(points: list[tuple[int, float, float]], target: float | None) -> tuple[float | None, int | None]:
    """``(wall, epoch)`` of the first point whose value is at least ``target``; ``(None, None)`` if none is, or
    without a target."""
    if target is None:
        return None, None
    for epoch, wall, value in points:
        if value >= target:
            return wall, epoch
    return None, None


@dataclass
class AccuracyClock:
    """Follows a run's validation metric epoch by epoch (rank 0 of ``train``): the first epoch at the target
    and the best value, each with its wall time since launch."""

    target: float | None
    metric: str | None = None
    target_epoch: int | None = None
    time_to_target: float | None = None
    best_val: float | None = None
    best_epoch: int | None = None
    time_to_best: float | None = None

    def observe(self, epoch: int, wall: float, metrics: dict[str, float]) -> None:
        """One epoch's (global) metrics at ``wall`` seconds since launch."""
        value = validation_value(metrics)
        if value is None:
            return
        self.metric = next(key for key in VALIDATION_METRICS if metrics.get(key) is not None)
        if self.best_val is None or value > self.best_val:
            self.best_val, self.best_epoch, self.time_to_best = value, epoch, wall
        if self.target is not None and self.target_epoch is None and value >= self.target:
            self.target_epoch, self.time_to_target = epoch, wall

    def record(self) -> dict[str, Any]:
        """The ``final`` record's time-to-accuracy fields (None where not known)."""
        return {"target_acc": self.target, "target_metric": self.metric, "time_to_target": self.time_to_target,
                "target_epoch": self.target_epoch, "best_val": self.best_val, "best_epoch": self.best_epoch,
                "time_to_best": self.time_to_best}

    def describe(self, epochs: int) -> str:
        """One line for the user."""
        metric = self.metric or "val_acc"
        if self.target is None:
            best = (f"best {metric} {self.best_val:.4f} at epoch {self.best_epoch}, {self.time_to_best:.1f} s "
                    f"after launch" if self.best_val is not None else f"no {metric} measured")
            return f"{best} (time-to-accuracy needs --target-acc A)"
        if self.time_to_target is None:
            best = f"; best {self.best_val:.4f}" if self.best_val is not None else ""
            return f"{metric} never reached {self.target:g} in {epochs} epoch(s){best}"
        return (f"time to {metric} >= {self.target:g}: {self.time_to_target:.2f} s after launch "
                f"(epoch {self.target_epoch})")
