"""Communication-avoiding policies: BNS-GCN boundary sampling and SANCUS staleness rules.

Chosen by name with parameters, e.g. ``--sample bns:p=0.1`` or
``--sample bns:p=0.1,side=owner`` and ``--stale sancus-h:eps=0.02``. They
implement the protocols of :mod:`sparse_dist.exchange`; a third party adds
one with :func:`register_sampler` / :func:`register_staleness` (name,
builder, typed parameters, accepted form) without touching the SpMM. All
policy text, on the command line and in study files, goes through one
parser, :meth:`AxisSpec.parse` (joined forms through :meth:`PolicySpec.parse`).
The built-in ``psc`` (:mod:`algorithms.psc`) and ``dgs`` (:mod:`algorithms.dgs`) samplers live in their own
modules, which do not import this one; they are registered here, explicitly, after ``bns`` (that order is
the order of the accepted forms in messages).

Sampling (BNS-GCN): a boundary row is kept in epoch ``e`` when a 64-bit
hash (splitmix64 chain of seed, epoch, stream, global row id) falls below
``p * 2**64``. Owner and receiver evaluate the same hash, so the sample
costs no communication and does not depend on ``P`` for owner-side
sampling. ``side=receiver`` (default, BNS-GCN; stream = receiver's row
group) suits ``p2p``; ``side=owner`` (stream = owner) is what the broadcast
plans use. The same sample serves every layer, forward and backward, of
the epoch.

Pipelined staleness (PipeGCN, PSC-GCN), ``pipe:tau=T[,gamma=G]``
(:class:`PipeRule`): every exchange is posted when its rows exist and
consumed ``T`` epochs later, forward rows and backward gradients alike.

Staleness (SANCUS), per layer and owner ``j``; an owner that never sent is
always ACTIVE:

* ``sancus-e:eps=E`` epoch-fixed: ACTIVE when ``epoch - version_j > E``
  (deterministic, no communication).
* ``sancus-a:eps=A`` epoch-adaptive: every receiver flags owners whose
  block IT caches is more than ``A`` epochs old; one allgather of flags per
  layer, any flag makes the owner ACTIVE. With our plans all receivers
  refresh together, so this gives the schedule of ``sancus-e`` through the
  agreement path (it differs when caches diverge, e.g. a receiver that
  holds no block of that owner).
* ``sancus-h:eps=h`` variation gap: the owner compares the rows it would
  broadcast with those of its last broadcast, relative Frobenius norm
  ``||X - X_last||_F / ||X_last||_F``; ACTIVE when above ``h``; one
  allgather of flags per layer.

``skip_backward=1`` also skips the gradient reduce of stale blocks
(dropped); by default gradients travel every epoch.
"""

from __future__ import annotations

import argparse
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import numpy as np

from algorithms.dgs import DgsSampler
from algorithms.hashing import row_hash
from algorithms.psc import PscSampler
from sparse_dist.comm import Communicator
from sparse_dist.exchange import BoundarySampler, StalenessRule, StalenessView
from sparse_dist.factory import make_strategy
from sparse_dist.plans import plan_class

@dataclass(frozen=True)
class BnsSampler:
    """Boundary column sampling with rate ``p`` (kept columns scaled by ``1/p``)."""

    p: float
    side: str = "receiver"
    seed: int = 0
    name: str = "bns"

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"bns: keep must lie in [0, 1], got {self.p}")
        if self.side not in ("receiver", "owner"):
            raise ValueError(f"bns: side must be 'receiver' or 'owner', got {self.side!r}")

    def keep(self, epoch: int, stream: int, global_rows: np.ndarray) -> np.ndarray:
        hashed = row_hash(self.seed, epoch, stream, global_rows)
        if self.p >= 1.0:
            return np.ones(hashed.shape, dtype=bool)
        threshold = np.uint64(math.ceil(self.p * 2.0**53))
        return (hashed >> np.uint64(11)) < threshold


@dataclass(frozen=True)
class SancusRule:
    """One of the SANCUS skip-broadcast rules (``kind`` e, a or h)."""

    kind: str
    eps: float
    skip_backward: bool = False
    pipelined: ClassVar[bool] = False  # a cached-block rule (CachedStrategy), not a pipelined one

    def __post_init__(self) -> None:
        if self.kind not in ("e", "a", "h"):
            raise ValueError(f"sancus rule kind must be e, a or h, got {self.kind!r}")
        if not self.eps >= 0:
            raise ValueError(f"sancus-{self.kind}: eps must be >= 0, got {self.eps}")

    @property
    def name(self) -> str:
        return f"sancus-{self.kind}"

    @property
    def needs_gap(self) -> bool:
        return self.kind == "h"

    @property
    def agreement(self) -> bool:
        """Whether deciding costs one allgather of flags per layer (rules a and h)."""
        return self.kind != "e"

    def scheduled_share(self) -> float | None:
        """Share of forward blocks sent when it follows a fixed schedule (e, and a with our plans), else None."""
        return 1.0 / (self.eps + 1.0) if self.kind != "h" else None

    def decide(self, view: StalenessView, comm: Communicator) -> np.ndarray:
        """ACTIVE owners; collective over ``comm`` (rules a and h allgather flags; e is deterministic)."""
        never = view.versions < 0
        if self.kind == "e":
            return never | (view.epoch - view.versions > self.eps)
        if self.kind == "a":
            flags = (view.cached_versions >= 0) & (view.epoch - view.cached_versions > self.eps)
        else:
            flags = np.zeros(view.versions.size, dtype=bool)
            if view.own_gap is not None:
                flags[view.owner] = view.own_gap > self.eps
        agreed = comm.allgather_array(flags.astype(np.int64)).max(axis=0) > 0
        return never | agreed



@dataclass(frozen=True)
class PipeRule:
    """``pipe:tau=T[,gamma=G]`` (PipeGCN, PSC-GCN): epoch ``t`` uses the boundary rows owners sent in epoch
    ``t - T`` and, in the backward, the boundary gradients receivers sent in epoch ``t - T``; the first ``T``
    epochs are exact. ``gamma > 0``: receivers (of rows) and owners (of gradients) use an exponential
    moving average ``s <- gamma s + (1 - gamma) m`` of what arrives, started with the first arrival.
    Deterministic: no agreement, no rank-local decision (:class:`sparse_dist.exchange.PipelinedStrategy`).
    """

    tau: int
    gamma: float = 0.0
    name: ClassVar[str] = "pipe"
    needs_gap: ClassVar[bool] = False
    skip_backward: ClassVar[bool] = False
    agreement: ClassVar[bool] = False
    pipelined: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.tau < 0:
            raise ValueError(f"pipe: tau must be >= 0 epochs, got {self.tau}")
        if not 0.0 <= self.gamma < 1.0:
            raise ValueError(f"pipe: gamma must lie in [0, 1), got {self.gamma}")

    def scheduled_share(self) -> float:
        """Every owner sends every epoch (the exchange is late, not skipped)."""
        return 1.0


@dataclass(frozen=True)
class PolicyKind:
    """One registered policy name: its axis, its parameters (name -> type) and how to build it."""

    name: str
    axis: str                                  # "sample" or "stale"
    params: dict[str, Callable[[str], Any]]
    build: Callable[..., Any]                  # build(seed=..., **params) for samplers, build(**params) for rules
    form: str                                  # the accepted form, for error messages

    def parse_params(self, text: str, spec: str) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for item in filter(None, (piece.strip() for piece in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key not in self.params:
                raise ValueError(f"policy {spec!r}: unknown parameter {item!r}; expected {self.form}")
            try:
                values[key] = self.params[key](value)
            except ValueError:
                raise ValueError(f"policy {spec!r}: {key}={value!r} is not a {self.params[key].__name__}") from None
        return values


_KINDS: dict[str, dict[str, PolicyKind]] = {"sample": {}, "stale": {}}
_AXIS_WORD = {"sample": "sampling", "stale": "staleness"}


def register_sampler(name: str, build: Callable[..., BoundarySampler], params: dict[str, Callable[[str], Any]],
                     form: str) -> None:
    """Make ``--sample NAME:key=value,...`` build ``build(seed=RUN_SEED, **typed_params)``.

    ``params`` maps each accepted key to its type (a callable from the text); ``form`` is the accepted
    form shown in errors, e.g. ``"bns:p=P[,side=receiver|owner]"``.
    """
    _KINDS["sample"][name] = PolicyKind(name, "sample", params, build, form)


def register_staleness(name: str, build: Callable[..., StalenessRule], params: dict[str, Callable[[str], Any]],
                       form: str) -> None:
    """Make ``--stale NAME:key=value,...`` build ``build(**typed_params)`` (see :func:`register_sampler`)."""
    _KINDS["stale"][name] = PolicyKind(name, "stale", params, build, form)


def _flag(value: str) -> bool:
    if value not in ("0", "1"):
        raise ValueError(value)
    return value == "1"


_flag.__name__ = "0 or 1"


def _bns(seed: int, keep: float | None = None, p: float | None = None, side: str = "receiver") -> BnsSampler:
    """``bns:keep=K[,side=...]``; ``p=`` is keep's old name (this release; a ``FutureWarning`` says so)."""
    if p is not None:
        if keep is not None:
            raise ValueError("bns: give keep=K only (p= is its old name)")
        warnings.warn("bns:p= is deprecated, use bns:keep= (the old name goes in the next release)", FutureWarning,
                      stacklevel=2)
        keep = p
    if keep is None:
        raise ValueError("bns: needs keep=K, the probability of keeping a boundary row")
    return BnsSampler(keep, side, seed)


register_sampler("bns", _bns, {"keep": float, "p": float, "side": str},
                 "bns:keep=K[,side=receiver|owner] with 0 <= K <= 1")
register_sampler("psc", lambda seed, **params: PscSampler(seed=seed, **params),
                 {"budget": float, "a_inner": float, "a_boundary": float, "every": int, "cache": float},
                 "psc:budget=B[,a_inner=1.1,a_boundary=1,every=10,cache=C] with 0 < B <= 1, 0 <= C <= 1")
register_sampler("dgs", lambda seed, **params: DgsSampler(seed=seed, **params),
                 {"nodes": float, "features": float, "every": int, "steps": int},
                 "dgs:nodes=R[,features=Q,every=10,steps=20] with 0 < R, Q <= 1")
for _kind in ("e", "a", "h"):
    register_staleness(f"sancus-{_kind}", lambda _k=_kind, **params: SancusRule(_k, **params),
                       {"eps": float, "skip_backward": _flag}, f"sancus-{_kind}:eps=E[,skip_backward=0|1] with E >= 0")
register_staleness("pipe", lambda **params: PipeRule(**params), {"tau": int, "gamma": float},
                   "pipe:tau=T[,gamma=G] with T >= 0 epochs and 0 <= G < 1")


@dataclass(frozen=True)
class AxisSpec:
    """One axis of a run's policy parsed once from its text: ``'none'`` (exact) or ``NAME:key=value,...``.

    The built object (sampler or staleness rule) is made here, so a bad spec fails at parse time with
    the text and the accepted forms; :meth:`build` makes a fresh one with the run's seed.
    """

    axis: str
    text: str = "none"
    kind: PolicyKind | None = field(default=None, compare=False, repr=False)
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, axis: str, text: str) -> "AxisSpec":
        spec = text.strip()
        name, _, params = spec.partition(":")
        name = name.strip()
        if name in ("", "none"):
            return cls(axis)
        known = _KINDS[axis]
        if name not in known:
            raise ValueError(f"unknown {_AXIS_WORD[axis]} policy {name!r}; known: {sorted(known)} or 'none'")
        kind = known[name]
        values = kind.parse_params(params, spec)
        parsed = cls(axis, spec, kind, tuple(sorted(values.items())))
        parsed.build(seed=0)  # the policy's own range checks (e.g. p in [0, 1]) run now, not later
        return parsed

    @property
    def is_none(self) -> bool:
        return self.kind is None

    @property
    def name(self) -> str:
        return "none" if self.kind is None else self.kind.name

    def build(self, seed: int = 0) -> Any:
        """The sampler (given the run's seed) or staleness rule; None for ``'none'``."""
        if self.kind is None:
            return None
        if self.axis == "sample":
            return self.kind.build(seed=seed, **dict(self.params))
        return self.kind.build(**dict(self.params))

    def accepted(self) -> str:
        return " or ".join(["'none'"] + [kind.form for kind in _KINDS[self.axis].values()])

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class PolicySpec:
    """A run's whole policy: a sampling axis and a staleness axis.

    Its text is ``'exact'``, one axis, or both joined by ``+`` (``'bns:p=0.1+sancus-e:eps=1'``):
    the form studies and ``sparse-dist model`` use; ``train`` takes the two axes as ``--sample`` and
    ``--stale``. Both parse through :meth:`AxisSpec.parse`, the one parser of policy text.
    """

    sample: AxisSpec = field(default_factory=lambda: AxisSpec("sample"))
    stale: AxisSpec = field(default_factory=lambda: AxisSpec("stale"))

    @classmethod
    def parse(cls, text: str) -> "PolicySpec":
        spec = text.strip()
        if spec in ("exact", "none", ""):
            return cls()
        sample, stale = AxisSpec("sample"), AxisSpec("stale")
        for piece in (part.strip() for part in spec.split("+")):
            name = piece.partition(":")[0].strip()
            if name in _KINDS["sample"] and sample.is_none:
                sample = AxisSpec.parse("sample", piece)
            elif name in _KINDS["stale"] and stale.is_none:
                stale = AxisSpec.parse("stale", piece)
            else:
                raise ValueError(f"policy {spec!r}: {piece!r} is not a sampling policy {sorted(_KINDS['sample'])} "
                                 f"or staleness policy {sorted(_KINDS['stale'])}, or repeats one kind")
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
        return [cls.parse(piece) for piece in pieces]

    @property
    def is_exact(self) -> bool:
        return self.sample.is_none and self.stale.is_none

    @property
    def samples(self) -> bool:
        """Whether it needs a plan that can send a sampled subset (see ``ExchangePlan.refusal``)."""
        return not self.sample.is_none

    @property
    def caches(self) -> bool:
        """Whether it needs a plan whose receivers can cache whole blocks (a SANCUS rule; ``pipe`` does not)."""
        return not self.stale.is_none and not self.stale.build().pipelined

    def refusal(self, plan: str) -> str | None:
        """Why ``plan`` cannot run this policy, or None (decided from the text alone, before MPI starts)."""
        return combination_problem(plan, self.sample, self.stale)

    @property
    def text(self) -> str:
        return "+".join(str(axis) for axis in (self.sample, self.stale) if not axis.is_none) or "exact"

    def __str__(self) -> str:
        return self.text


def combination_problem(plan: str, sample: AxisSpec, stale: AxisSpec) -> str | None:
    """Why ``plan`` cannot carry this sampling and staleness policy together (one sentence), or None.

    The same check the plan makes when it is built, made from the flags alone so that a run is refused
    before MPI does any collective work.
    """
    try:
        strategy = make_strategy(sample.build(), stale.build())
    except ValueError as exc:
        return str(exc)
    return plan_class(plan).refusal(samples=strategy.samples, caches=strategy.caches,
                                    per_receiver=strategy.per_receiver)


def parse_sampler(spec: str, seed: int = 0) -> BoundarySampler | None:
    """``'none'`` or ``NAME:params`` -> a sampler (None for exact)."""
    return AxisSpec.parse("sample", spec).build(seed)


def parse_staleness(spec: str) -> StalenessRule | None:
    """``'none'`` or ``NAME:params`` -> a staleness rule (None for exact)."""
    return AxisSpec.parse("stale", spec).build()


def _argparse_type(axis: str) -> Callable[[str], AxisSpec]:
    def parse(text: str) -> AxisSpec:
        try:
            return AxisSpec.parse(axis, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc} (accepted: {AxisSpec(axis).accepted()})") from None

    parse.__name__ = f"{_AXIS_WORD[axis]} policy"
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
