"""Policy text, parsed once into typed policies: ``--sample``/``--stale`` axes and their joined form.

Chosen by name with parameters, e.g. ``--sample bns:keep=0.1`` or ``--sample bns:keep=0.1,side=owner`` and
``--stale sancus-h:eps=0.02``. All policy text, on the command line and in study files, goes through one
parser, :meth:`AxisSpec.parse` (joined forms through :meth:`PolicySpec.parse`), which builds the typed policy
once (its range checks run then); a run checks it once, against its plan, replication, layer kind, dropout
side and layer-0 input, with :meth:`PolicySpec.refusal`, before MPI does any collective work. The names come
from :mod:`algorithms.policies.registry`; the built-in policies live one per module beside this one.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from algorithms.policies.base import RunShape
from algorithms.policies.registry import AXIS_WORD, KINDS, PolicyKind
from sparse_dist.plans import PLAN_NAMES, plan_class


PARAM_LIMITS: dict[str, dict[str, tuple[float, str]]] = {
    "psc": {"every": (10**7, "epochs between recomputations, as train --epochs' bound")},
    "dgs": {"every": (10**7, "epochs between explanations, as train --epochs' bound"),
            "steps": (10**4, "optimiser steps of every explanation, each a forward and a backward")},
    "sancus-e": {"eps": (10**7, "epochs a cached block may age, as train --epochs' bound")},
    "sancus-a": {"eps": (10**7, "epochs a cached block may age, as train --epochs' bound")},
    "sancus-h": {"eps": (10.0**6, "a variation-gap threshold; 0 resends every changed block")},
    "pipe": {"tau": (1000, "epochs of delay; every epoch of delay keeps one more set of boundary rows in flight")},
}
"""Policy name -> parameter -> (its largest value, why): the upper ends a policy's own checks leave open (its
lower ends and the shares in [0, 1] are its own). Checked when the text is parsed, so ``dgs:steps=10^12`` is
refused before a run, not met at its tenth epoch."""


def _check_ranges(name: str, values: dict[str, Any], spec: str) -> None:
    """Refuse a parameter above its :data:`PARAM_LIMITS` bound, or not a finite number."""
    for key, value in values.items():
        high, why = PARAM_LIMITS.get(name, {}).get(key, (None, ""))
        if high is not None and isinstance(value, (int, float)) and not value <= high:
            shown = value if isinstance(value, int) else f"{value:g}"
            raise ValueError(f"policy {spec!r}: {key} must be at most {high:g} ({why}), got {shown}")


@dataclass(frozen=True)
class AxisSpec:
    """One axis of a run's policy parsed once from its text: ``'none'`` (exact) or ``NAME:key=value,...``.

    :meth:`parse` builds the typed policy once (``policy``, seed 0), so a bad spec fails at parse time with
    the text and the accepted forms, and every check reads that object; a run takes its own copy with the
    run's seed from :meth:`build` (a copy, not a second parse: ``dgs`` keeps per-run state in it).
    """

    axis: str
    text: str = "none"
    kind: PolicyKind | None = field(default=None, compare=False, repr=False)
    params: tuple[tuple[str, Any], ...] = ()
    policy: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def parse(cls, axis: str, text: str) -> "AxisSpec":
        spec = text.strip()
        name, _, params = spec.partition(":")
        name = name.strip()
        if not spec:
            raise ValueError(f"an empty {AXIS_WORD[axis]} policy; write 'none' for exact")
        if not name:
            raise ValueError(f"policy {spec!r} names no {AXIS_WORD[axis]} policy; write NAME:key=value,... "
                             f"or 'none' for exact")
        if name == "none":
            if params.strip():
                raise ValueError(f"policy {spec!r}: 'none' takes no parameters")
            return cls(axis)
        known = KINDS[axis]
        if name not in known:
            raise ValueError(f"unknown {AXIS_WORD[axis]} policy {name!r}; known: {sorted(known)} or 'none'")
        kind = known[name]
        values = kind.parse_params(params, spec)
        _check_ranges(kind.name, values, spec)
        built = kind.build(seed=0, **values) if axis == "sample" else kind.build(**values)  # range checks run now
        return cls(axis, spec, kind, tuple(sorted(values.items())), built)

    @property
    def is_none(self) -> bool:
        return self.kind is None

    @property
    def name(self) -> str:
        return "none" if self.kind is None else self.kind.name

    def build(self, seed: int = 0) -> Any:
        """The run's sampler (its own copy, with the run's seed) or staleness rule (stateless and frozen: the
        parsed one); None for ``'none'``."""
        if self.policy is None or self.axis != "sample":
            return self.policy
        return replace(self.policy, seed=seed)

    def accepted(self) -> str:
        return " or ".join(["'none'"] + [kind.form for kind in KINDS[self.axis].values()])

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class PolicySpec:
    """A run's whole policy: a sampling axis and a staleness axis.

    Its text is ``'exact'``, one axis, or both joined by ``+`` (``'bns:keep=0.1+sancus-e:eps=1'``):
    the form studies and ``sparse-dist model`` use; ``train`` takes the two axes as ``--sample`` and
    ``--stale``. Both parse through :meth:`AxisSpec.parse`, the one parser of policy text.
    """

    sample: AxisSpec = field(default_factory=lambda: AxisSpec("sample"))
    stale: AxisSpec = field(default_factory=lambda: AxisSpec("stale"))

    @classmethod
    def parse(cls, text: str) -> "PolicySpec":
        spec = text.strip()
        if not spec:
            raise ValueError("an empty policy; write 'exact' for no sampling and no staleness")
        if spec in ("exact", "none"):
            return cls()
        sample, stale = AxisSpec("sample"), AxisSpec("stale")
        for piece in (part.strip() for part in spec.split("+")):
            name = piece.partition(":")[0].strip()
            if name in KINDS["sample"] and sample.is_none:
                sample = AxisSpec.parse("sample", piece)
            elif name in KINDS["stale"] and stale.is_none:
                stale = AxisSpec.parse("stale", piece)
            else:
                raise ValueError(f"policy {spec!r}: {piece!r} is not a sampling policy {sorted(KINDS['sample'])} "
                                 f"or staleness policy {sorted(KINDS['stale'])}, or repeats one kind")
        return cls(sample, stale)

    @classmethod
    def parse_list(cls, text: str) -> list["PolicySpec"]:
        """Policies separated by ``;`` or ``,``; a ``key=value`` piece without a name belongs to the
        policy before it (``exact,sancus-e:eps=1,skip_backward=1`` is two policies)."""
        pieces: list[str] = []
        for piece in (part.strip() for part in text.replace(";", ",").split(",")):
            if "=" in piece and ":" not in piece and pieces:
                pieces[-1] += "," + piece
            elif piece:
                pieces.append(piece)
        if not pieces:
            raise ValueError(f"no policy in {text!r}; give at least one, e.g. 'exact'")
        return [cls.parse(piece) for piece in pieces]

    @property
    def is_exact(self) -> bool:
        return self.sample.is_none and self.stale.is_none

    @property
    def samples(self) -> bool:
        """Whether it needs a plan that can send a sampled subset (see ``ExchangePlan.refusal``)."""
        return self.sample.policy is not None and self.sample.policy.samples

    @property
    def caches(self) -> bool:
        """Whether it needs a plan whose receivers can cache whole blocks (a SANCUS rule; ``pipe`` does not)."""
        return self.stale.policy is not None and self.stale.policy.caches

    def refusal(self, run: RunShape | str) -> str | None:
        """Why this policy cannot run in ``run`` (a :class:`RunShape`, or a plan name with the defaults), one
        sentence naming the flags, or None. Decided from the flags alone, before MPI starts: each policy's
        own :meth:`~algorithms.policies.base.PolicyBase.refusal`, then what the plan carries (the check the
        plan repeats when it is built)."""
        shape = RunShape(plan=run) if isinstance(run, str) else run
        shape = replace(shape, samples=self.samples)
        sampler, rule = self.sample.policy, self.stale.policy
        problem = sampler.refusal(shape) if sampler is not None else None
        if problem:
            return f"--sample {self.sample} {problem}"
        problem = rule.refusal(shape) if rule is not None else None
        if not problem:
            per_receiver = sampler is not None and sampler.per_receiver
            problem = plan_class(shape.plan).refusal(samples=self.samples, caches=self.caches,
                                                     per_receiver=per_receiver)
            if problem and self.samples and self.caches:
                problem = self._sampled_and_cached(problem, per_receiver)
        return f"--plan {shape.plan} --sample {self.sample} --stale {self.stale}: {problem}" if problem else None

    def _sampled_and_cached(self, problem: str, per_receiver: bool) -> str:
        """A plan's refusal of a run that both samples and caches blocks, completed: the plan's own sentence
        names the plans for the one capability it lacks, which may refuse the other, so say which plans carry
        both, or, where none does, why and what composes instead."""
        carriers = [name for name in PLAN_NAMES
                    if plan_class(name).refusal(samples=True, caches=True, per_receiver=per_receiver) is None]
        if carriers:
            return f"{problem}; to sample and cache blocks together use --plan {' or '.join(carriers)}"
        sampling = [name for name in PLAN_NAMES
                    if plan_class(name).refusal(samples=True, caches=False, per_receiver=per_receiver) is None]
        caching = [name for name in PLAN_NAMES if plan_class(name).refusal(samples=False, caches=True) is None]
        return (f"per-receiver sampling ({self.sample.name}) needs --plan {' or '.join(sampling)} and cached "
                f"historical blocks ({self.stale.name}) need --plan {' or '.join(caching)}, so no plan carries both: "
                f"keep --sample {self.sample} with --stale pipe:tau=T (it caches no blocks), or --stale "
                f"{self.stale} with --sample bns:keep=K,side=owner (one sample every receiver shares)")

    @property
    def text(self) -> str:
        return "+".join(str(axis) for axis in (self.sample, self.stale) if not axis.is_none) or "exact"

    def __str__(self) -> str:
        return self.text


def parse_sampler(spec: str, seed: int = 0) -> Any:
    """``'none'`` or ``NAME:params`` -> a sampler (None for exact)."""
    return AxisSpec.parse("sample", spec).build(seed)


def parse_staleness(spec: str) -> Any:
    """``'none'`` or ``NAME:params`` -> a staleness rule (None for exact)."""
    return AxisSpec.parse("stale", spec).build()


def _argparse_type(axis: str) -> Callable[[str], AxisSpec]:
    def parse(text: str) -> AxisSpec:
        try:
            return AxisSpec.parse(axis, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (accepted: {AxisSpec(axis).accepted()})") from None

    parse.__name__ = f"{AXIS_WORD[axis]} policy"
    return parse


# argparse ``type=`` of --sample and --stale: checked while the command line is parsed, so a typo stops
# the job before any data is read or any collective starts.
sampling_arg = _argparse_type("sample")
staleness_arg = _argparse_type("stale")


def policy_list_arg(text: str) -> list[PolicySpec]:
    """argparse ``type=`` of a list of joined policies (``sparse-dist model predict --policies``)."""
    try:
        return PolicySpec.parse_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (accepted: 'exact', {AxisSpec('sample').accepted()}, "
                                         f"{AxisSpec('stale').accepted()}, or one of each joined by '+')") from None
