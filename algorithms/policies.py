"""Communication-avoiding policies: BNS-GCN boundary sampling and SANCUS staleness rules.

Chosen by name with parameters, e.g. ``--sample bns:p=0.1`` or
``--sample bns:p=0.1,side=owner`` and ``--stale sancus-h:eps=0.02``. They
implement the protocols of :mod:`sparse_dist.policy`; a third party adds
one with :func:`register_sampler` / :func:`register_staleness` without
touching the SpMM.

Sampling (BNS-GCN): a boundary row is kept in epoch ``e`` when a 64-bit
hash (splitmix64 chain of seed, epoch, stream, global row id) falls below
``p * 2**64``. Owner and receiver evaluate the same hash, so the sample
costs no communication and does not depend on ``P`` for owner-side
sampling. ``side=receiver`` (default, BNS-GCN; stream = receiver's row
group) suits ``p2p``; ``side=owner`` (stream = owner) is what the broadcast
plans use. The same sample serves every layer, forward and backward, of
the epoch.

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
from dataclasses import dataclass
from typing import Callable

import numpy as np

from sparse_dist.comm import Communicator
from sparse_dist.policy import BoundarySampler, StalenessRule, StalenessView

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, vectorised over uint64 (wrapping arithmetic)."""
    z = np.asarray(values, dtype=np.uint64) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _parse_params(text: str, allowed: dict[str, type], spec: str) -> dict[str, object]:
    params: dict[str, object] = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in allowed:
            raise ValueError(f"policy {spec!r}: unknown parameter {item!r}; expected {sorted(allowed)} as key=value")
        try:
            params[key] = allowed[key](value)
        except ValueError:
            raise ValueError(f"policy {spec!r}: {key}={value!r} is not a {allowed[key].__name__}") from None
    return params


@dataclass(frozen=True)
class BnsSampler:
    """Boundary column sampling with rate ``p`` (kept columns scaled by ``1/p``)."""

    p: float
    side: str = "receiver"
    seed: int = 0
    name: str = "bns"

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"bns: p must lie in [0, 1], got {self.p}")
        if self.side not in ("receiver", "owner"):
            raise ValueError(f"bns: side must be 'receiver' or 'owner', got {self.side!r}")

    def keep(self, epoch: int, stream: int, global_rows: np.ndarray) -> np.ndarray:
        key = splitmix64(np.array([self.seed], dtype=np.uint64))
        key = splitmix64(key ^ np.array([epoch], dtype=np.uint64))
        key = splitmix64(key ^ np.array([stream], dtype=np.uint64))
        hashed = splitmix64(np.asarray(global_rows, dtype=np.int64).astype(np.uint64) ^ key)
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

    def __post_init__(self) -> None:
        if self.kind not in ("e", "a", "h") or self.eps < 0:
            raise ValueError(f"sancus rule needs kind e/a/h and eps >= 0, got {self.kind!r}, {self.eps}")

    @property
    def name(self) -> str:
        return f"sancus-{self.kind}"

    @property
    def needs_gap(self) -> bool:
        return self.kind == "h"

    def decide(self, view: StalenessView, comm: Communicator) -> np.ndarray:
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


_SAMPLERS: dict[str, Callable[..., BoundarySampler]] = {}
_STALENESS: dict[str, Callable[..., StalenessRule]] = {}


def register_sampler(name: str, factory: Callable[..., BoundarySampler]) -> None:
    """Make ``--sample NAME:key=value,...`` build ``factory(seed=..., **params)``."""
    _SAMPLERS[name] = factory


def register_staleness(name: str, factory: Callable[..., StalenessRule]) -> None:
    """Make ``--stale NAME:key=value,...`` build ``factory(**params)``."""
    _STALENESS[name] = factory


register_sampler("bns", lambda seed, **kw: BnsSampler(
    seed=seed, **_parse_params(kw.pop("_text"), {"p": float, "side": str}, kw.pop("_spec"))))
for _kind in ("e", "a", "h"):
    register_staleness(f"sancus-{_kind}", lambda _k=_kind, **kw: SancusRule(
        _k, **{key: (bool(int(v)) if key == "skip_backward" else v) for key, v in _parse_params(
            kw.pop("_text"), {"eps": float, "skip_backward": int}, kw.pop("_spec")).items()}))


def _split(spec: str) -> tuple[str, str]:
    name, _, params = spec.partition(":")
    return name.strip(), params.strip()


def parse_sampler(spec: str, seed: int = 0) -> BoundarySampler | None:
    """``'none'`` or ``NAME:params`` -> a sampler (None for exact)."""
    name, params = _split(spec)
    if name in ("", "none"):
        return None
    if name not in _SAMPLERS:
        raise ValueError(f"unknown sampling policy {name!r}; known: {sorted(_SAMPLERS)} or 'none'")
    return _SAMPLERS[name](seed, _text=params, _spec=spec)


def parse_staleness(spec: str) -> StalenessRule | None:
    """``'none'`` or ``NAME:params`` -> a staleness rule (None for exact)."""
    name, params = _split(spec)
    if name in ("", "none"):
        return None
    if name not in _STALENESS:
        raise ValueError(f"unknown staleness policy {name!r}; known: {sorted(_STALENESS)} or 'none'")
    return _STALENESS[name](_text=params, _spec=spec)


def sampler_spec(text: str) -> str:
    """An argparse ``type=`` for ``--sample``: the spec itself once :func:`parse_sampler` accepts it.

    Checked while the command line is parsed, so a typo stops the job before any data is read or
    any collective starts.
    """
    try:
        parse_sampler(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (accepted: 'none' or bns:p=P[,side=receiver|owner])") from None
    return text


def staleness_spec(text: str) -> str:
    """An argparse ``type=`` for ``--stale`` (see :func:`sampler_spec`)."""
    try:
        parse_staleness(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{exc} (accepted: 'none' or sancus-e|sancus-a|sancus-h:eps=E[,skip_backward=1] with E >= 0)") from None
    return text


def split_policy(spec: str) -> tuple[str, str]:
    """``'exact'``, one policy, or ``'bns:p=0.1+sancus-e:eps=1'`` -> ``(sample, stale)`` specs (validated).

    Used by studies, which name a run's policy in one string.
    """
    sample, stale = "none", "none"
    if spec.strip() in ("exact", "none", ""):
        return sample, stale
    for piece in spec.split("+"):
        name, _ = _split(piece.strip())
        if name in _SAMPLERS and sample == "none":
            sample = piece.strip()
            parse_sampler(sample)
        elif name in _STALENESS and stale == "none":
            stale = piece.strip()
            parse_staleness(stale)
        else:
            raise ValueError(f"policy {spec!r}: {piece.strip()!r} is not a sampling policy {sorted(_SAMPLERS)} "
                             f"or staleness policy {sorted(_STALENESS)}, or repeats one kind")
    return sample, stale
