"""The accuracy guard's second signal: the policy's own error against exact, on the same weights.

The guard of :mod:`algorithms.training.guard` sees a policy *fall* (validation below its own best, the loss above
its own level). A policy that is biased from the start never falls: on a held-out social graph
``psc:budget=0.1`` sat a point below exact from the first tens of epochs and ended 0.8 points low with no
decision. Its bias is visible only against an exact reference, and one is cheap to get: the audit's exact forward
(:mod:`algorithms.training.audit`) runs beside the step on the step's own weights and dropout masks, with every
exchange exact. From the two forwards of one step (the policy's, which trains, and the exact one) the guard
reads, globally:

* the training loss of each (the policy's is the step's loss; the exact one is the loss exact training would
  have had at these weights and masks);
* the validation metric each gives (accuracy, or micro-F1 for multi-label) from the same training-mode logits.

**The rule.** A reading *strikes* when the exact forward's validation metric lies more than ``noise`` standard
errors above the policy's, ``noise * sqrt(a * (1 - a) / n_val)`` with ``a`` the exact forward's metric and
``n_val`` the validation nodes (the noise floor the guard's other validation rules use; 500 nodes at 0.7 and 2
standard errors: 4.1 points), and the policy's training loss lies above the exact one: both say the policy's
forward is the worse. ``patience`` strikes in a row, after the warm-up of the policy in force, make the policy
*biased*: the guard tightens it one step toward exact, agreed across ranks like every other decision (the weights
stay: a bias is not a collapse). The comparison is paired (same weights, same masks, same nodes), so its own
noise is below the floor's, which is a bound. The loss alone decides nothing: a sampler's loss lies above exact's
on the same weights by its variance, more as training goes on (``bns:keep=0.1`` on Cora in 2 random parts:
1.02x at epoch 40, 1.73x at 200), while its validation gap does not grow.

**Its cost.** With ``--audit-every K`` the guard reads the audit's forward every ``K`` epochs. Otherwise it
chooses its own interval, priced before any reading from the run's first exact evaluation of the weights after
step 2 or later (step 1 pays one-off costs; :meth:`~algorithms.training.guard.Guard.price_reference`): an exact
forward like the reference, without its dropout masks. ``K`` is the smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24,
... at least ``t_ref / (0.05 * t_step)``, and large enough that the readings left fit 5% of the run's epochs
(:func:`reference_interval`): the reference forward then costs at most 5% of the steps' time (on Cora at P = 2
on a shared 2-core machine, one reference forward took 0.37 to 0.8 of a step: K = 16 or 32). After every
reading the guard chooses again from the readings' own mean cost. A reading of its own to measure the cost
would lie outside the budget it sets, and over a slow link it is the dearest part of a short run (40 epochs of
the 200k synthetic at P = 2 and 200 Mbit/s: 3.8 s, 4.7 steps, where the budget then grants no reading at all).
``K`` is agreed (the largest over ranks: one allgather, once) and kept in the guard's state, so a resumed run
checks at the same epochs; two fresh runs on differently loaded machines may choose different ``K``
(``--audit-every`` fixes it). Each reading's figures and seconds are in the epoch's record
(``guard_reference``), its bytes apart from training's like the audit's.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from algorithms.training.metrics import local_loss_sum

REFERENCE_SHARE = 0.05
"""The most of a run's step time the guard's own exact reference may cost."""
MEASURED_AT = 2
"""The first step whose weights' exact evaluation prices the reference (step 1 pays one-off costs)."""


@dataclass(frozen=True)
class SameWeights:
    """One step's two forwards compared: training losses and validation metrics, global."""

    policy_loss: float
    exact_loss: float
    policy_val: float
    exact_val: float

    def record(self) -> dict[str, float]:
        return dict(self.__dict__)


def local_sums(policy: torch.Tensor, exact: torch.Tensor, run: Any) -> torch.Tensor:
    """This rank's parts of :class:`SameWeights` from its rows of the two forwards' logits (``n_g x C``), as one
    float64 vector to sum over the replica column: the two loss sums (divided by the global training count) and
    the validation counts of each forward (correct rows; true positives, false positives and false negatives for
    multi-label)."""
    graph, rows, labels = run.graph, run.train_rows, run.train_labels
    count = run.global_counts["train"]
    losses = [local_loss_sum(logits, rows, labels, graph.multilabel, graph.num_classes).double() / count
              for logits in (policy, exact)]
    mask, truth = run.masks["val"], run.labels[run.masks["val"]]
    counts: list[torch.Tensor] = []
    for logits in (policy, exact):
        picked = logits[mask]
        if graph.multilabel:
            said, real = picked > 0, truth > 0.5
            counts += [(said & real).sum(), (said & ~real).sum(), (~said & real).sum()]
        else:
            counts.append((picked.argmax(dim=1) == truth).sum())
    return torch.stack(losses + [c.double() for c in counts]).to(torch.float64)


def reading(totals: np.ndarray, validation_size: int) -> SameWeights:
    """:class:`SameWeights` from :func:`local_sums` summed over the replica column."""
    policy_loss, exact_loss, *counts = (float(v) for v in totals)
    if len(counts) == 6:  # multi-label: micro-F1 of each forward
        values = [2 * tp / max(2 * tp + fp + fn, 1.0) for tp, fp, fn in (counts[:3], counts[3:])]
    else:
        values = [c / max(validation_size, 1) for c in counts]
    return SameWeights(policy_loss, exact_loss, values[0], values[1])


def gap_threshold(exact_val: float, validation_size: int, noise: float) -> float:
    """``noise`` standard errors of a metric of ``exact_val``'s size measured on ``validation_size`` nodes."""
    value = min(max(exact_val, 0.0), 1.0)
    return noise * math.sqrt(value * (1.0 - value) / max(validation_size, 1))


def strikes(seen: SameWeights, validation_size: int, noise: float) -> str | None:
    """Why ``seen`` shows the policy biased (one clause), or None (module docstring: the rule)."""
    limit = gap_threshold(seen.exact_val, validation_size, noise)
    if seen.exact_val - seen.policy_val > limit and seen.policy_loss > seen.exact_loss:
        return (f"validation {seen.policy_val:.4f} under the policy against {seen.exact_val:.4f} exact on the same "
                f"weights (more than {limit:.3g} apart; training loss {seen.policy_loss:.4f} against "
                f"{seen.exact_loss:.4f})")
    return None


def reference_interval(reference_seconds: float, step_seconds: float, share: float = REFERENCE_SHARE,
                       epochs: int | None = None, after: int = 0, spent: float | None = None) -> int:
    """Epochs between reference forwards so that they cost at most ``share`` of the steps' time: the smallest of
    1, 2, 3, 4, 6, 8, 12, 16, 24, ... (powers of two and one and a half times them) at least
    ``reference_seconds / (share * step_seconds)``. A coarse ladder, so that two runs whose timings differ by a
    little mostly check at the same epochs; a fine one, so that from 3 on the checks cost more than two thirds
    of the share, and the rule acts no later than it must.

    ``epochs``: the run's, where known: then the readings are a budget. ``spent`` seconds of readings so far (the
    one just read, beside step ``after``, included; default ``reference_seconds``, that one reading) and the
    readings left at multiples of ``K`` in ``(after, epochs]``, each of ``reference_seconds``, must fit ``share *
    epochs`` steps of ``step_seconds``. The guard asks again after every reading with the means so far
    (:meth:`ReferenceBudget.read`), so a reading dearer than the first (a loaded
    machine, a larger exchange) spends the budget sooner, never beyond it (40 epochs of the 200k synthetic at P =
    4: a fixed K from the first reading alone gave 6.3-15.9% of the steps). Where the budget is spent, the
    interval is beyond ``epochs``: no more readings."""
    if step_seconds <= 0.0 or not math.isfinite(reference_seconds / step_seconds):
        return 1
    needed = max(reference_seconds / (share * step_seconds), 1.0)
    if not epochs:
        return _rung_at_least(needed)
    spent = reference_seconds if spent is None else spent
    left = (share * epochs * step_seconds - spent) / max(reference_seconds, 1e-300)  # readings still affordable
    affordable = math.floor(left + 1e-9) if math.isfinite(left) else epochs
    if affordable < 1:
        return max(_rung_at_least(needed), epochs + 1)
    rung = _rung_at_least(max(needed, (epochs - after) / affordable))
    while epochs // rung - after // rung > affordable:  # the multiples of K left in (after, epochs]
        rung = _rung_at_least(rung + 1)
    return rung


def _rung_at_least(needed: float) -> int:
    """The smallest of 1, 2, 3, 4, 6, 8, 12, ... at least ``needed``."""
    power = 1 << max(math.ceil(math.log2(max(needed, 1.0)) - 1e-9) - 1, 0)  # half the first power of two >= needed
    return next(step for step in (power, 3 * power // 2, 2 * power) if step >= needed - 1e-9)


class ReferenceBudget:
    """When the exact reference is read: the interval ``K`` chosen from its cost against the steps' own seconds
    (:func:`reference_interval`), kept in the guard's replicated state (``reference_every``, ``reference_checks``,
    ``reference_seconds``: a resumed run checks at the same epochs). ``audit_every`` > 0: the run's
    ``--audit-every`` fixes ``K`` and nothing is chosen; ``epochs``: the run's, so that the readings spend the
    share over the whole run. Collective where it chooses (one allgather, the largest interval kept)."""

    def __init__(self, comm: Any, audit_every: int, epochs: int | None) -> None:
        self.comm, self.audit_every, self.epochs = comm, audit_every, epochs
        self._step_seconds: list[float] = []  # this leg's steps' own seconds

    def note_step(self, seconds: float) -> None:
        """A step's own seconds on this rank (evaluations and references left out; every rank notes as many)."""
        self._step_seconds.append(seconds)

    def typical_step(self) -> float:
        """The median of this leg's steps' seconds (not the step beside a reading, which the reading slows: the
        200k synthetic at P = 2, 2.8-4.7 s beside one, 1.9 s the median); 0 before any step."""
        return statistics.median(self._step_seconds) if self._step_seconds else 0.0

    def every(self, state: Any) -> int:
        """The interval in force (0: none chosen yet)."""
        return self.audit_every or state.reference_every

    def price(self, state: Any, epoch: int, evaluation_seconds: float) -> None:
        """Choose the first interval from the exact evaluation of the weights after step ``epoch``
        (``evaluation_seconds`` on this rank): an exact forward, as the reference is, without its dropout masks.
        Acts once, at the first such evaluation after step :data:`MEASURED_AT` or later (step 1 pays one-off
        costs) while no interval is chosen and ``--audit-every`` is not given; then collective. Whether it acts
        is replicated state, so every rank acts alike. A reading of its own to measure the cost would lie outside
        the budget it sets (module docstring)."""
        if self.audit_every or state.reference_every or epoch < MEASURED_AT or not self._step_seconds:
            return  # a resumed leg's first evaluation before any step has nothing to price against
        self._agree(state, reference_interval(evaluation_seconds, self.typical_step(), epochs=self.epochs,
                                              after=epoch, spent=0.0))

    def read(self, state: Any, epoch: int, seconds: float) -> None:
        """A reading beside the step that made ``epoch`` cost ``seconds`` on this rank: counted, and the interval
        chosen again from the readings' mean so far (collective without ``--audit-every``)."""
        state.reference_checks += 1
        state.reference_seconds += seconds
        if not self.audit_every:
            self._agree(state, reference_interval(state.reference_seconds / state.reference_checks,
                                                  self.typical_step(), epochs=self.epochs, after=epoch,
                                                  spent=state.reference_seconds))

    def _agree(self, state: Any, interval: int) -> None:
        mine = np.array([interval], dtype=np.int64)
        state.reference_every = int(self.comm.allgather_array(mine).max())
