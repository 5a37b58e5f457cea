"""Replace a running trainer's policies with tighter ones, between two steps: what the accuracy guard
(:mod:`algorithms.training.guard`) does when a policy falls behind.

The policies in force are :class:`ActivePolicies` (the two axes' parsed text and the compression text). A
swap (:meth:`sparse_dist.lifecycle.ExchangeLifecycle.swap`) completes every flight the old strategy keeps
(pipelined rows and gradients), builds the new strategy through the same factory as set-up, binds it to the
plan, replaces the codec (its residuals go: an fp16 codec has none); the run then rebuilds the policies'
per-epoch work (``psc``'s feature cache, ``dgs``' explanations; collective where the work says so). Layer 0's
input stays what set-up chose: a policy that fed layer 0 itself leaves the per-epoch input exchange behind,
which is exact.

Collective: :func:`install` and :func:`tighten` are entered by every rank at the same epoch (the guard agrees
on it first); :func:`restore_best_at_end` by every rank after the last step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from algorithms.policies.base import RunShape
from algorithms.policies.spec import AxisSpec
from sparse_dist.compress import Codec


@dataclass(frozen=True)
class ActivePolicies:
    """The policies a run trains with now: sampling and staleness axes, and the compression text."""

    sample: AxisSpec
    stale: AxisSpec
    compress: str = "none"

    @property
    def is_exact(self) -> bool:
        return self.sample.is_none and self.stale.is_none and Codec.parse(self.compress) is None

    @property
    def text(self) -> str:
        axes = [str(axis) for axis in (self.sample, self.stale) if not axis.is_none]
        if Codec.parse(self.compress) is not None:
            axes.append(f"compress {self.compress}")
        return " + ".join(axes) or "exact"

    def exact(self) -> "ActivePolicies":
        """No policy on any axis: what the guard finishes with when it gives up."""
        return ActivePolicies(AxisSpec(self.sample.axis), AxisSpec(self.stale.axis))

    def tightened(self) -> "ActivePolicies":
        """Every active axis one step toward exact (each policy and the codec answer for themselves, the
        staleness rule knowing whether the sampling axis still samples)."""
        sample = _step(self.sample, RunShape())
        stale = _step(self.stale, RunShape(samples=sample.policy is not None and sample.policy.samples))
        codec = Codec.parse(self.compress)
        compress = (codec.tightened() or "none") if codec is not None else "none"
        return ActivePolicies(sample, stale, compress)

    def record(self) -> dict[str, str]:
        return {"sample": str(self.sample), "stale": str(self.stale), "compress": self.compress}

    @classmethod
    def from_record(cls, record: dict[str, str]) -> "ActivePolicies":
        return cls(AxisSpec.parse("sample", record["sample"]), AxisSpec.parse("stale", record["stale"]),
                   record["compress"])


def _step(axis: AxisSpec, run: RunShape) -> AxisSpec:
    following = axis.policy.tightened(run) if axis.policy is not None else None
    return AxisSpec.parse(axis.axis, following) if following else AxisSpec(axis.axis)


def install(run: Any, policies: ActivePolicies) -> None:
    """Make ``run`` (a :class:`~algorithms.training.trainer.Trainer`) train with ``policies`` from its next
    step on (collective: completes the old strategy's flights, rebuilds the policies' work)."""
    sampler, rule = policies.sample.build(seed=run.config.seed), policies.stale.build()
    codec = Codec.parse(policies.compress, seed=run.config.seed)
    try:
        run.spmm.lifecycle.swap(sampler, rule, codec)
    except ValueError as exc:  # a tighter policy needs no more of a plan than the looser one did
        raise ValueError(f"the guard's {policies.text} cannot run on --plan {run.config.plan}: {exc}") from None
    run.codec = codec
    run.build_work(((policies.sample, sampler), (policies.stale, rule)))
    run.policies = policies


def tighten(run: Any) -> dict[str, Any]:
    """The guard's agreed tightening, before ``run``'s next step: restore the best evaluation's weights (after a
    collapse, where kept), start Adam's moments afresh, install the next policies (each as the run does it:
    ``restore_kept``, ``fresh_moments``, ``install_policies``; the 1D trainer's and the grid's); returns the
    decision (with ``line`` for rank 0 to say). Collective."""
    before = run.policies
    after = before.exact() if run.guard.state.give_up else before.tightened()
    kept = run.guard.kept
    if kept is not None and run.guard.state.restore:  # a collapse; after a slide the run goes on from where it is
        run.restore_kept(kept)
    # Fresh moments either way: Adam's second moments remember the looser policy's gradient variance for about
    # 1 / (1 - beta2) = 1000 steps and shrink every step of the tighter one by as much (CiteSeer, P = 2: after
    # psc:budget=0.1, exact training from epoch 50 learned at half a fresh run's rate and ended 3 points low).
    run.fresh_moments()
    run.install_policies(after)
    line = run.guard.tightened(run.epoch + 1, before.text, after.text, after.is_exact, after.record())
    return {**run.guard.state.decisions[-1], "line": line}


def restore_best_at_end(run: Any) -> tuple[dict[str, float], str] | None:
    """After ``run``'s last step: where its guard says the last evaluation fell more than ``drop`` below the best
    (:meth:`~algorithms.training.guard.Guard.fallen_at_end`), load the best evaluation's weights and evaluate them
    exactly; returns their metrics and the line rank 0 says, or None (weights untouched). Collective where the
    guard is on (an allgather of the flag, then the evaluation); nothing where it is off (the same on every rank)."""
    guard = run.guard
    if not guard.on:
        return None
    reason = guard.fallen_at_end()
    flag = np.array([reason is not None], dtype=np.int64)
    if not int(run.comm.allgather_array(flag).max()) or guard.kept is None:
        return None
    run.restore_kept(guard.kept)
    metrics = run.measured_evaluation()
    return metrics, guard.restored(run.epoch, reason or "another rank saw the last evaluation fall", metrics)
