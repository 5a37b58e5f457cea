"""Steered evaluation (``train --steer-evaluation``): the step's own forward decides when an exact evaluation is
due, so a run over a slow link does not pay an exact forward's exchange after every step.

Every step already computes logits for every owned row, the validation rows included, under the run's policy
and dropout. Their validation accuracy (micro-F1 multi-label) is the *steered* signal: its counts are summed over
the replica column in one allreduce of 1-3 numbers after the gradients' (in the gradients' buffer they would
shift the reduction's chunks and change the summed gradients by rounding), so every rank sees the same value and
takes the same decision. It measures the weights the step started from, through dropout and the
policy, so it is neither the exact metric nor the same weights; it only **steers**. Every accuracy a run
reports (the epoch rows' metrics, best, final, time to target) comes from an exact evaluation of the weights
after the step it belongs to, as without steering; an epoch that was not evaluated carries no new metrics
(its row keeps the last evaluation's, and ``metrics_epoch`` says whose).

An exact evaluation follows step ``e`` when (the reason is recorded in the row's ``steering``):

* ``first``: no exact evaluation has been seen yet (the signal's gap to exact is not known);
* ``last``: ``e`` is the run's last epoch;
* ``ceiling``: ``e`` is ``every`` epochs (``--eval-every``, 10 under steering unless given) after the last exact
  evaluation, so the guard and the curve see the run at least that often;
* ``target`` (with ``--target-acc A``): ``s + gap + 2 se >= A``, where ``s`` is the signal, ``gap`` the largest
  ``exact - s`` of the last :data:`GAP_PAIRS` evaluated epochs (0 where exact was lower) and ``se`` the standard
  error of an accuracy ``A`` measured on the validation nodes: the exact evaluation comes at the first step that
  may have reached the target, so time to target is exact's own as long as the gap holds;
* ``fall``: after the guard's warm-up, ``s`` lies more than ``max(drop, 2 se)`` below its best so far
  (``drop``, warm-up: the guard's), so the guard sees a fall at the next step instead of at the ceiling (during
  its warm-up it counts no fall, so none is steered to it).

Refused with a staleness policy (``runners.train_cmd.check_arguments``): its step's forward uses rows of earlier
epochs, so the signal does not follow the exact metric and the guard would not be steered to its falls.

A steered run trains exactly as the run that evaluates after every step: layer 0's exchange is chosen as for
that run (``input_exchange auto`` counts every epoch as evaluated), and the counts travel in an allreduce of
their own, so the weights, losses and exchanged bytes of every step are that run's (tested under mpiexec).

Measured decision: exchanging only what the evaluated nodes' receptive field needs saves little on the graphs
here (docs/guide/emulate.md, "Steered evaluation"), so the evaluation stays the exact full forward and is run
less often instead (``--evaluation-plan field`` holds each rank's whole receptive field instead, exchanging
nothing per evaluation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

DEFAULT_CEILING = 10
"""``--eval-every`` under ``--steer-evaluation`` when the flag is not given: an exact evaluation at least every 10
epochs (the guard's patience of 3 evaluations then spans at most 30 epochs without a fall to steer it sooner)."""
GAP_PAIRS = 2
"""How many of the latest evaluated epochs' ``exact - steered`` gaps the target rule takes the largest of."""
REASONS = ("first", "last", "ceiling", "target", "fall")


def steering_counts(logits: torch.Tensor, labels: torch.Tensor, validation: torch.Tensor,
                    multilabel: bool) -> torch.Tensor:
    """This rank's validation counts from ``logits`` (``rows x classes``, its owned rows; ``validation`` a bool
    mask over them): ``[correct]``, or ``[tp, fp, fn]`` multi-label; as float64 (exact counts to 2^53), to be
    summed over the replica column."""
    picked = logits.detach()[validation]
    if multilabel:
        predicted, truth = picked > 0, labels[validation] > 0.5
        counts = [(predicted & truth).sum(), (predicted & ~truth).sum(), (~predicted & truth).sum()]
    else:
        counts = [(picked.argmax(dim=1) == labels[validation]).sum()]
    return torch.stack(counts).to(torch.float64).contiguous()


def steered_value(counts: Sequence[float], validation_size: int, multilabel: bool) -> float:
    """The signal from the summed :func:`steering_counts`: accuracy over ``validation_size`` nodes, or
    micro-F1."""
    if multilabel:
        tp, fp, fn = (float(c) for c in counts)
        return 2 * tp / max(2 * tp + fp + fn, 1.0)
    return float(counts[0]) / max(validation_size, 1)


def counts_width(multilabel: bool) -> int:
    """How many entries :func:`steering_counts` gives."""
    return 3 if multilabel else 1


class EvaluationSteering:
    """Decides after each step whether an exact evaluation follows (module docstring); fed the same values on
    every rank (the allreduced signal, the global exact metric), so every rank decides alike without a
    collective of its own. Its state travels in checkpoints (:meth:`state_dict`) so a resumed run decides as
    the uninterrupted one."""

    def __init__(self, every: int, epochs: int, target: float | None, validation_size: int, drop: float,
                 warmup: int = 0, multilabel: bool = False) -> None:
        self.every, self.epochs, self.target = every, epochs, target
        self.validation_size, self.drop, self.warmup, self.multilabel = validation_size, drop, warmup, multilabel
        self.last_exact: int | None = None  # the latest epoch an exact evaluation was decided for
        self.gaps: list[float] = []  # exact - steered of the latest evaluated epochs (at most GAP_PAIRS)
        self.best: float | None = None  # the highest signal so far
        self.pending: dict[int, float] = {}  # decided epochs whose exact metric has not come back: their signal

    def standard_error(self, value: float) -> float:
        """The standard error of an accuracy ``value`` measured on the validation nodes."""
        value = min(max(value, 0.0), 1.0)
        return math.sqrt(value * (1.0 - value) / max(self.validation_size, 1))

    def after_step(self, epoch: int, logits: torch.Tensor, labels: torch.Tensor, validation: torch.Tensor,
                   col_comm: Any) -> dict[str, Any]:
        """The signal of step ``epoch`` from this rank's ``logits`` (its owned rows; ``validation`` a mask over
        them), summed over the replica column, and the decision it gives: ``{"signal", "due"}``, the same on
        every rank. Collective over ``col_comm``: its own allreduce of 1-3 numbers (inside the gradients' buffer
        it would shift the reduction's chunks and change the summed gradients by rounding)."""
        counts = steering_counts(logits, labels, validation, self.multilabel)
        col_comm.allreduce_(counts, "other")
        value = steered_value(counts.tolist(), self.validation_size, self.multilabel)
        return {"signal": value, "due": self.due(epoch, value)}

    def observe_metrics(self, epoch: int, metrics: dict[str, float]) -> None:
        """The exact metrics of the weights after step ``epoch``: their validation value feeds the gap."""
        self.observe_exact(epoch, metrics.get("val_f1" if self.multilabel else "val_acc"))

    def due(self, epoch: int, signal: float) -> str | None:
        """Why an exact evaluation follows step ``epoch`` (1-based) whose forward gave ``signal``, or None."""
        reason = self._reason(epoch, signal)
        self.best = signal if self.best is None else max(self.best, signal)
        if reason is not None:
            self.last_exact = epoch
            self.pending[epoch] = signal
        return reason

    def _reason(self, epoch: int, signal: float) -> str | None:
        if self.last_exact is None:
            return "first"
        if epoch >= self.epochs:
            return "last"
        if epoch - self.last_exact >= self.every:
            return "ceiling"
        if self.target is not None:
            gap = max([0.0, *self.gaps])
            if signal + gap + 2.0 * self.standard_error(self.target) >= self.target:
                return "target"
        fallen = self.best is not None and signal < self.best - max(self.drop, 2.0 * self.standard_error(self.best))
        if fallen and epoch > self.warmup:
            return "fall"
        return None

    def observe_exact(self, epoch: int, value: float | None) -> None:
        """The exact validation metric of the weights after step ``epoch`` (None: the metrics had none): keeps
        ``value - signal`` among the latest gaps."""
        signal = self.pending.pop(epoch, None)
        if signal is None or value is None:
            return
        self.gaps = (self.gaps + [value - signal])[-GAP_PAIRS:]

    def state_dict(self) -> dict[str, Any]:
        return {"last_exact": self.last_exact, "gaps": list(self.gaps), "best": self.best,
                "pending": {str(k): v for k, v in self.pending.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` gave (checked first by :func:`state_problem`)."""
        self.last_exact, self.best = state["last_exact"], state["best"]
        self.gaps = [float(g) for g in state["gaps"]][-GAP_PAIRS:]
        self.pending = {int(k): float(v) for k, v in state["pending"].items()}


def state_problem(state: Any) -> str | None:
    """Why a checkpoint's steering state cannot be loaded (one clause), or None: a checkpoint is data."""
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if not isinstance(state, dict) or set(state) != {"last_exact", "gaps", "best", "pending"}:
        return "steering state is not the four fields last_exact, gaps, best, pending"
    last = state["last_exact"]
    if last is not None and (not isinstance(last, int) or isinstance(last, bool) or last < 0):
        return f"steering's last exact epoch {last!r} is not a count"
    if state["best"] is not None and not number(state["best"]):
        return f"steering's best signal {state['best']!r} is not a finite number"
    gaps, pending = state["gaps"], state["pending"]
    if not isinstance(gaps, list) or not all(number(g) for g in gaps):
        return "steering's gaps are not a list of finite numbers"
    if not isinstance(pending, dict) or not all(isinstance(k, str) and k.isdigit() and number(v)
                                                for k, v in pending.items()):
        return "steering's pending signals are not epochs with finite numbers"
    return None
