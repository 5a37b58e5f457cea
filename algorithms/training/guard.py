"""The accuracy guard: it watches a policy's training and tightens the policy toward exact when it falls behind.

A communication-avoiding policy (sampling, staleness, compression) trades exactness for bytes. On some graphs
and rank counts that trade loses the model (PipeGCN without smoothing at P = 4 on a 32%-cut graph falls from
0.70 to 0.29 test accuracy). The guard reads two cheap signals that are global (the same on every rank):

* the validation metric of each evaluation (``val_acc`` or ``val_f1``), against the best seen so far;
* the training loss of each step, against the lowest level it held since the last tightening (the lowest of
  the largest of every ``patience`` consecutive steps: one lucky step of a sampled policy is not a level; on
  Cora, bns at P = 2 stepped once to 0.34 among steps near 0.44 and the guard used to call the next three a
  collapse and throw away 90 epochs).

These see a policy *fall*. A policy biased from the start never falls from its own best: the guard's second
signal (:mod:`algorithms.training.bias`, ``bias``) compares the policy's forward with an exact one on the same
weights every few epochs, and ``patience`` such readings in a row that show the policy worse beyond the
validation noise tighten it like a slide.

The warm-up only sets the best: the first ``warmup`` epochs, and for the validation signal also every epoch
until the training loss has fallen ``settle`` (a share) below the first step's, except a fall to less than half
the best (and by more than ``sharp``): a collapse whenever it comes after the first ``warmup`` epochs (on the 200k
synthetic in 4 random parts, ``pipe:tau=1`` fell from 0.26 to 0.02 at epoch 12 with its loss 2% below the
first step's; of 460 runs on Cora, CiteSeer and the 200k synthetic, no exact one fell so before its loss
settled; only ``psc``, unscaled fp16 and that ``pipe`` did). Early training swings by many
points even when exact, and for longer on a slowly learning graph: Cora at lr 0.05 loses 7 points between
epochs 8 and 10 at P = 1; CiteSeer at lr 0.01 loses 13 between epochs 8 and 11 at P = 2, when its loss has
fallen 4% of the way (the guard used to call that a collapse and finish nearly every policy exact there).
A fall must also exceed the validation metric's own sampling noise: ``drop`` and ``sharp`` are raised to
``noise`` and ``2 * noise`` standard errors of an accuracy measured on the validation set,
``sqrt(best * (1 - best) / n_val)`` (500 validation nodes at 0.7: 0.020, so a slide must exceed 4.1 points,
which exact training's own swings on Cora and CiteSeer reach; 20 000 at 0.7: 0.003, so ``drop`` rules).
After the warm-up, the policy is *falling* when the validation metric stays more than ``drop`` below its best
for ``patience`` consecutive evaluations, when one evaluation is more than ``sharp`` below it (a collapse:
exact training's swings after the warm-up stay within 3 points on Cora, a stale pipeline at P = 4 loses 12 in
one epoch on the 200k synthetic), when the loss stays above ``(1 + loss_rise)`` times its lowest held level
for ``patience`` consecutive steps, or at once when the loss is not finite. Then the guard, before the next step:

1. after a collapse (the sharp fall, or the loss), restores the weights of the best evaluation (kept in memory:
   a copy of the replicated parameters), so the epochs lost to it are not paid twice; after a slide it goes on
   from where it is (rolling back there would throw away progress that a tighter policy keeps: on Cora, bns'
   mid-training dip recovers by itself); either way Adam's moments start afresh, since its second moments
   remember the looser policy's gradient variance for about a thousand steps and shrink the tighter policy's
   steps by as much (after ``psc:budget=0.1`` on CiteSeer, exact training from epoch 50 learned at half a fresh
   run's rate and ended 3 points below exact);
2. tightens every active axis one step toward exact: each policy answers :meth:`tightened` itself
   (``pipe`` turns smoothing on, then lowers ``tau``; ``sancus`` halves ``eps`` and then stops skipping;
   ``bns``/``psc``/``dgs`` double ``keep``/``budget``/``nodes`` and then stop sampling; compression goes
   ``int8 -> fp16 -> none``). When no axis is left, the run is exact from there on, and rank 0 says so.

A policy under which the model has not begun to learn ``stall`` epochs after it took over (from the start, or
from its tightening: the training loss never fell ``settle`` below the first step's; exact training's GCN loss
did so by epoch 17 to 24 on the 200k synthetic, Cora and CiteSeer, SAGE's by epoch 10; ``psc:budget=0.1``,
tightened once or twice, by epoch 32 to 57) has no level to hold and no fall to see: on the 200k synthetic
cut into 4 random parts, ``pipe:tau=1`` wandered between 2% and 26% validation accuracy for 40 epochs with
its loss 5% below the first step's. The guard then gives up at once rather than a step at a time (each step
would wait a warm-up of its own): the run finishes exact from the next step, and rank 0 says so. It gives up
the same way, restoring the best evaluation's weights, on a collapse that comes before the loss settled (the
fall to less than half the best above): a policy that breaks training before the model has learned is not
mended by one step tighter. On the 200k synthetic in random parts, ``pipe:tau=1`` collapsed so at epoch 12
(P = 4) and 13 (P = 8), and smoothed from there it collapsed again in both runs; each tightening's warm-up
cost 10 of the run's 40 epochs, and at P = 8 the exact epochs left were too few (0.9 points below exact).

At the end of the run, when the last evaluation lies below the best one by more than the validation metric's
noise (``noise`` standard errors, not ``drop``: a fall the guard had no evaluations left to see, ``pipe:tau=1``
at P = 2 on the 200k synthetic fell from 0.70 to 0.59 in its last two epochs; or a run still swinging a point
below its best after going exact late), the guard restores the best evaluation's weights, evaluates them
(exactly, collectively) and the final record holds those metrics, with ``restored_at_end`` saying so; rank 0
says so in one line. Checkpoints keep the
last step's weights (a resumed run trains on from them, its guard still keeping the best).

A policy whose damage shows from the first epochs, as a lower plateau rather than a fall, is the bias
signal's (:mod:`algorithms.training.bias`): it compares the policy with exact on the same weights.

The tighter policy then gets its own warm-up (``warmup`` epochs without strikes) before it can be tightened
again. It never loosens again: a rule that fell once on this graph and these ranks may fall again, and a loosened
run that falls pays the fall and the rollback a second time. The decision is agreed (one allgather of a flag
over the ranks) at every evaluation, so every rank tightens at the same epoch. Its state (level, best, strikes,
the kept weights) is replicated and travels in checkpoints: a resumed run decides as the uninterrupted one,
at any ``P``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from algorithms.training import bias
from sparse_dist.comm import Communicator

GUARD_MODES = ("auto", "off")
BIAS_MODES = ("auto", "off")
VALIDATION_KEYS = ("val_acc", "val_f1")


@dataclass(frozen=True)
class GuardSettings:
    """``mode``: ``auto`` (on whenever a policy is active) or ``off``; the thresholds of the module docstring
    (``noise``: standard errors of the validation metric a fall must exceed, 0 for none; ``settle``: the share
    the training loss must fall below its first step's before validation falls count; ``stall``: the epochs
    after the policy in force took over (the start or its tightening) by which it must have done so (not within
    the warm-up), or the guard gives up and finishes exact; 0 for no such limit; ``bias``: the second signal,
    the policy's error against an exact reference on the same weights (:mod:`algorithms.training.bias`),
    ``auto`` (on wherever the guard is) or ``off``)."""

    mode: str = "auto"
    drop: float = 0.02
    patience: int = 3
    loss_rise: float = 0.25
    warmup: int = 10
    sharp: float = 0.10
    noise: float = 2.0
    settle: float = 0.10
    stall: int = 30
    bias: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in GUARD_MODES:
            raise ValueError(f"guard must be one of {GUARD_MODES}, got {self.mode!r}")
        if self.bias not in BIAS_MODES:
            raise ValueError(f"guard bias must be one of {BIAS_MODES}, got {self.bias!r}")
        if not 0.0 < self.drop < 1.0:
            raise ValueError(f"guard drop must lie in (0, 1), got {self.drop}")
        if not 1 <= self.patience <= 1000:
            raise ValueError(f"guard patience must lie in [1, 1000] evaluations, got {self.patience}")
        if not 0.0 < self.loss_rise <= 100.0:
            raise ValueError(f"guard loss rise must lie in (0, 100], got {self.loss_rise}")
        if not self.drop <= self.sharp < 1.0:
            raise ValueError(f"guard sharp must lie in [drop, 1), got {self.sharp} (drop {self.drop})")
        if not 0 <= self.warmup <= 10**6:
            raise ValueError(f"guard warmup must lie in [0, 10^6] epochs, got {self.warmup}")
        if not 0.0 <= self.noise <= 10.0:
            raise ValueError(f"guard noise must lie in [0, 10] standard errors, got {self.noise}")
        if not 0.0 <= self.settle < 1.0:
            raise ValueError(f"guard settle must lie in [0, 1), got {self.settle}")
        if not 0 <= self.stall <= 10**7:
            raise ValueError(f"guard stall must lie in [0, 10^7] epochs (0: none), got {self.stall}")


@dataclass
class GuardState:
    """What the guard remembers (replicated: the same on every rank, and what a checkpoint carries)."""

    level: int = 0                      # tightenings so far
    best_value: float = -math.inf       # the best validation metric seen
    best_epoch: int = 0
    lowest_loss: float = math.inf       # the lowest level held since the last tightening (see observe_loss)
    recent_losses: list[float] = field(default_factory=list)  # the last ``patience`` steps' losses
    first_loss: float = math.nan        # the first step's
    settled: bool = False               # the loss has fallen ``settle`` below the first step's
    stalled: bool = False               # ... and had not ``stall`` epochs after the policy took over: give up
    broke: bool = False                 # a collapse before the loss settled (only halving sees it): give up
    took_over: int = 0                  # the epoch after which the policy in force took over (0: the start)
    value_strikes: int = 0
    loss_strikes: int = 0
    pending: str | None = None          # the reason of a tightening agreed, applied before the next step
    restore: bool = False               # whether that tightening restores the best evaluation's weights
    give_up: bool = False               # whether it goes straight to exact (the policy never began to learn)
    quiet_until: int = 0                # no strike is counted up to this epoch (the warm-up after a tightening)
    exact: bool = False                 # nothing left to tighten: the run is exact
    policies: dict[str, str] | None = None  # the policies in force after the last tightening (their text)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    restored_at_end: dict[str, Any] | None = None  # the best evaluation's weights, restored after the last step
    bias_strikes: int = 0               # exact-reference readings in a row that showed the policy biased
    bias_seen: str | None = None        # the last such reading, in one clause
    reference_every: int = 0            # epochs between exact references (0: not chosen yet; bias module)
    reference_checks: int = 0           # exact references read so far
    reference_seconds: float = 0.0      # this rank's seconds in them so far

    def record(self) -> dict[str, Any]:
        return {key: value for key, value in self.__dict__.items()}


class Guard:
    """Watches one run (see the module docstring). ``observe_loss`` after each step and ``observe_metrics``
    after each evaluation (both collective: every rank with the same values); :meth:`due` says whether a
    tightening waits for the start of the next step."""

    def __init__(self, settings: GuardSettings, comm: Communicator, active: bool, validation_size: int,
                 audit_every: int = 0, epochs: int | None = None) -> None:
        """``audit_every``: the run's audit interval, whose exact forward the bias signal reads (0: it chooses
        its own, :func:`~algorithms.training.bias.reference_interval`); ``epochs``: the run's, so that the
        chosen interval spends the share over the whole run."""
        self.settings, self.comm = settings, comm
        self.validation_size = validation_size  # global validation nodes: the metric's sampling noise
        self.on = settings.mode == "auto" and active
        self.state = GuardState()
        self.kept: dict[str, Any] | None = None  # the best evaluation's model and optimiser state
        self._value: float | None = None  # the last evaluation's validation metric
        self.budget = bias.ReferenceBudget(comm, audit_every, epochs)  # when the bias signal's reference is read

    def observe_loss(self, epoch: int, loss: float) -> None:
        """``epoch``'s global training loss (the same on every rank)."""
        state = self.state
        if not self.on or state.exact:
            return
        warming = epoch <= max(self.settings.warmup, state.quiet_until)
        if math.isnan(state.first_loss):
            state.first_loss = loss
        if not state.settled and math.isfinite(loss) and loss <= state.first_loss * (1.0 - self.settings.settle):
            state.settled = True
        stall = self.settings.stall
        if (not state.settled and self.settings.settle > 0.0 and stall
                and epoch > state.took_over + max(stall, self.settings.warmup)):
            state.stalled = True
        if not math.isfinite(loss):
            state.loss_strikes = self.settings.patience
            return
        window = self.settings.patience
        state.recent_losses = (state.recent_losses + [loss])[-window:]
        if loss > state.lowest_loss * (1.0 + self.settings.loss_rise) and not warming:
            state.loss_strikes += 1
        else:
            state.loss_strikes = 0
        if len(state.recent_losses) == window:  # a level is what the loss held for ``patience`` steps
            state.lowest_loss = min(state.lowest_loss, max(state.recent_losses))

    def reference_due(self, epoch: int) -> bool:
        """Whether the step that makes ``epoch`` (1-based) runs beside the exact reference of the bias signal:
        every ``--audit-every`` or chosen interval; none before an interval is chosen (:meth:`price_reference`).
        The same on every rank."""
        every = self.budget.every(self.state)
        return self._bias_on() and bool(every) and epoch % every == 0

    @property
    def reads_references(self) -> bool:
        """Whether the bias signal may read exact reference forwards in this run (as it starts)."""
        return self._bias_on()

    def _bias_on(self) -> bool:
        """Whether the bias signal acts: the guard on, the run not yet exact, ``--guard-bias`` not off."""
        return self.on and not self.state.exact and self.settings.bias != "off"

    def note_step(self, seconds: float) -> None:
        """A step's own seconds on this rank (evaluations and references left out): the bias reference's budget
        is a share of the steps' time (:class:`~algorithms.training.bias.ReferenceBudget`)."""
        self.budget.note_step(seconds)

    def price_reference(self, epoch: int, evaluation_seconds: float) -> None:
        """The bias signal's first interval, priced from the exact evaluation of the weights after step ``epoch``
        (``evaluation_seconds`` on this rank) instead of a reading of its own
        (:meth:`~algorithms.training.bias.ReferenceBudget.price`; collective where it acts, which is replicated
        state). A measuring reading of its own cost a reference forward the budget had not granted (on 40 epochs
        of the 200k synthetic at 200 Mbit/s, 3.8 s, 4.7 steps)."""
        if self._bias_on():
            self.budget.price(self.state, epoch, evaluation_seconds)

    def observe_reference(self, epoch: int, seen: bias.SameWeights, seconds: float) -> dict[str, Any]:
        """The exact reference read beside the step that made ``epoch`` (``seconds`` its cost on this rank): a
        strike where it shows the policy biased (counted after the warm-up of the policy in force), and the
        interval agreed again (collective without ``--audit-every``). Returns the reading for the epoch's
        record."""
        state, settings = self.state, self.settings
        self.budget.read(state, epoch, seconds)
        why = bias.strikes(seen, self.validation_size, settings.noise)
        if why is not None and epoch > max(settings.warmup, state.quiet_until):
            state.bias_strikes, state.bias_seen = state.bias_strikes + 1, why
        else:
            state.bias_strikes = 0
        return {**seen.record(), "threshold": bias.gap_threshold(seen.exact_val, self.validation_size,
                                                                 settings.noise),
                "strikes": state.bias_strikes, "every": self.budget.every(state), "seconds": seconds}

    def observe_metrics(self, epoch: int, metrics: dict[str, float], keep: Any) -> None:
        """An evaluation's global metrics after ``epoch``'s step: :meth:`note_metrics` then :meth:`agree`
        (collective)."""
        self.note_metrics(epoch, metrics, keep)
        self.agree()

    def note_metrics(self, epoch: int, metrics: dict[str, float], keep: Any) -> None:
        """Read an evaluation's global metrics (no communication). ``keep()`` returns the model and optimiser
        state to keep when this evaluation is the best: the state the evaluation saw, so this is called before
        the optimiser moves on."""
        state = self.state
        if not self.on:
            return
        value = next((float(metrics[key]) for key in VALIDATION_KEYS if metrics.get(key) is not None), None)
        self._value = value
        if value is None:
            return
        settled = state.settled or self.settings.settle == 0.0
        warm = epoch > max(self.settings.warmup, state.quiet_until)
        counting = warm and settled
        # before the loss settles only a fall that loses half of what the model had learned counts (a collapse)
        drop, sharp = self.thresholds()
        halved = warm and value < state.best_value / 2 and value < state.best_value - sharp
        if value > state.best_value:  # kept also once exact: the end of the run may restore it
            state.best_value, state.best_epoch, state.value_strikes = value, epoch, 0
            self.kept = copy.deepcopy(keep())
        elif state.exact:
            return
        elif (value < state.best_value - sharp and counting) or halved:
            state.value_strikes = self.settings.patience  # a collapse: no need to wait for more
            state.broke = halved and not counting  # before the model learned: a tighter step would break too
        elif value < state.best_value - drop and counting:
            state.value_strikes += 1
        else:
            state.value_strikes = 0

    def thresholds(self) -> tuple[float, float]:
        """``(drop, sharp)`` in force: the settings', raised to ``noise`` and ``2 * noise`` standard errors of an
        accuracy of the best value's size measured on ``validation_size`` nodes."""
        settings, noise = self.settings, self.noise_floor()
        return max(settings.drop, noise), max(settings.sharp, 2.0 * noise)

    def agree(self) -> None:
        """Whether the policy falls, agreed by every rank (one allgather of a flag over the communicator; every
        rank calls it after the same evaluation)."""
        state = self.state
        if not self.on or state.exact:
            return
        reason, collapse = self._reason(self._value)
        # one int64: 0 no fall, else 1 + (1 if a collapse) + (2 if the guard gives up); the same on every rank
        seen = 0 if reason is None else 1 + int(collapse) + 2 * int(state.stalled or state.broke)
        agreed = int(self.comm.allgather_array(np.array([seen], dtype=np.int64)).max())
        fell, collapsed, gives_up = agreed > 0, bool((agreed - 1) & 1), bool((agreed - 1) & 2)
        if fell and state.pending is None:
            state.pending = reason or "another rank saw the policy fall"
            state.restore, state.give_up = collapsed, gives_up

    def _reason(self, value: float | None) -> tuple[str | None, bool]:
        """Why the policy falls (or None), and whether it collapsed (a sharp fall or a loss that rises or is not
        finite: the weights are restored) rather than slid (the run goes on from where it is)."""
        state, settings = self.state, self.settings
        drop, sharp = self.thresholds()
        if state.stalled:
            return (f"training loss {state.recent_losses[-1] if state.recent_losses else math.nan:.4f} not "
                    f"{settings.settle:.0%} below its first {state.first_loss:.4f} within {settings.stall} epochs "
                    f"of the policy taking over: the model has not begun to learn"), False
        if state.value_strikes >= settings.patience and value is not None:
            if value < state.best_value - sharp:
                early = ", before its training loss settled" if state.broke else ""
                return (f"validation {value:.4f} more than {sharp:.3g} below its best {state.best_value:.4f} "
                        f"(epoch {state.best_epoch}){early}"), True
            return (f"validation {value:.4f} more than {drop:.3g} below its best {state.best_value:.4f} "
                    f"(epoch {state.best_epoch}) for {state.value_strikes} evaluations"), False
        if state.loss_strikes >= settings.patience:
            return (f"training loss above {1 + settings.loss_rise:g}x its lowest {state.lowest_loss:.4f} "
                    f"for {state.loss_strikes} steps"), True
        if state.bias_strikes >= settings.patience:
            return f"{state.bias_seen}, {state.bias_strikes} checks in a row", False
        return None, False

    @property
    def due(self) -> bool:
        return self.on and self.state.pending is not None

    def tightened(self, epoch: int, before: str, after: str, exact: bool, policies: dict[str, str]) -> str:
        """Book a tightening applied before ``epoch``'s step (``before`` and ``after``: the policies' text;
        ``policies``: the new ones per axis, for a resume); returns the one line rank 0 prints."""
        state = self.state
        reason, state.pending = state.pending, None
        state.level += 1
        state.exact = exact
        state.policies = dict(policies)
        state.value_strikes = state.loss_strikes = state.bias_strikes = 0
        state.broke = False
        state.lowest_loss = math.inf
        state.recent_losses = []
        state.quiet_until = epoch - 1 + self.settings.warmup  # the tighter policy's own warm-up
        state.took_over = epoch - 1  # and its own ``stall`` epochs to settle the loss
        rolled = state.best_epoch if self.kept is not None and state.restore else None
        gave_up, state.restore, state.give_up = state.give_up, False, False
        decision = {"epoch": epoch, "level": state.level, "from": before, "to": after, "reason": reason,
                    "restored_epoch": rolled, "gave_up": gave_up}
        state.decisions.append(decision)
        back = f"; weights of epoch {rolled} restored" if rolled is not None else ""
        if gave_up:
            return f"guard: {before} gave up ({reason}); finishing exact from epoch {epoch}{back}"
        if exact:
            return (f"guard: {before} fell behind ({reason}); nothing left to tighten, finishing exact from epoch "
                    f"{epoch}{back}")
        return f"guard: {before} fell behind ({reason}); tightened to {after} from epoch {epoch}{back}"

    def fallen_at_end(self) -> str | None:
        """Why the run should end on the best evaluation's weights rather than its last (its last evaluation
        below the best by more than the validation metric's noise, the best's weights kept), or None. The same
        on every rank."""
        value, state = self._value, self.state
        if not self.on or self.kept is None or value is None:
            return None
        noise = self.noise_floor()
        if value >= state.best_value - noise:
            return None
        return (f"its last validation {value:.4f} is more than {noise:.3g} below its best {state.best_value:.4f} "
                f"(epoch {state.best_epoch})")

    def noise_floor(self) -> float:
        """``noise`` standard errors of an accuracy of the best value's size measured on ``validation_size``
        nodes: a smaller difference between two evaluations says nothing."""
        best = min(max(self.state.best_value, 0.0), 1.0)
        return self.settings.noise * math.sqrt(best * (1.0 - best) / max(self.validation_size, 1))

    def restored(self, epoch: int, reason: str, metrics: dict[str, float]) -> str:
        """Book the end-of-run restore (after ``epoch``'s step; ``metrics``: the restored weights' evaluation);
        returns the one line rank 0 prints."""
        state = self.state
        state.restored_at_end = {"epoch": epoch, "restored_epoch": state.best_epoch, "reason": reason,
                                 "metrics": dict(metrics)}
        return (f"guard: {reason}; the final model is epoch {state.best_epoch}'s weights (restored, evaluated "
                f"exactly)")

    def state_dict(self) -> dict[str, Any]:
        return {"guard": self.state.record(), "guard_kept": self.kept}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("guard")
        if saved is None:
            return
        self.state = GuardState(**{"settled": True, **saved})  # a checkpoint from before ``settle``: no such wait
        self.kept = state.get("guard_kept")
