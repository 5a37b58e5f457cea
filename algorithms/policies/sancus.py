"""SANCUS staleness-aware skip-broadcast, ``sancus-e|a|h:eps=E[,skip_backward=0|1]``, per layer and owner ``j``.

An owner that never sent is always ACTIVE:

* ``sancus-e:eps=E`` epoch-fixed: ACTIVE when ``epoch - version_j > E`` (deterministic, no communication).
* ``sancus-a:eps=A`` epoch-adaptive: every receiver flags owners whose block IT caches is more than ``A``
  epochs old; one allgather of flags per layer, any flag makes the owner ACTIVE. With our plans all
  receivers refresh together, so this gives the schedule of ``sancus-e`` through the agreement path (it
  differs when caches diverge, e.g. a receiver that holds no block of that owner).
* ``sancus-h:eps=h`` variation gap: the owner compares the rows it would broadcast with those of its last
  broadcast, relative Frobenius norm ``||X - X_last||_F / ||X_last||_F``; ACTIVE when above ``h``; one
  allgather of flags per layer.

``skip_backward=1`` also skips the gradient reduce of stale blocks (dropped); by default gradients travel
every epoch. The strategy that keeps the caches is :class:`sparse_dist.cached.CachedStrategy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from algorithms.policies.base import PolicyBase, RunShape
from algorithms.policies.registry import PolicyKind, flag
from sparse_dist.comm import Communicator
from sparse_dist.exchange import StalenessView


@dataclass(frozen=True)
class SancusRule(PolicyBase):
    """One of the SANCUS skip-broadcast rules (``kind`` e, a or h)."""

    kind: str
    eps: float
    skip_backward: bool = False
    pipelined: ClassVar[bool] = False  # a cached-block rule (CachedStrategy), not a pipelined one
    overlaps: ClassVar[bool] = False   # a skipped block moves nothing; a sent one is waited for
    caches: ClassVar[bool] = True

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

    def tightened(self, run: RunShape) -> str | None:
        """Half the staleness bound (whole epochs for e and a); below one epoch, or ``h``'s gap below 0.005,
        it stops skipping (exact)."""
        eps = math.floor(self.eps / 2.0) if self.kind != "h" else self.eps / 2.0
        if eps < (1.0 if self.kind != "h" else 0.005):
            return None
        eps_text = f"{eps:g}"
        return f"{self.name}:eps={eps_text}" + (",skip_backward=1" if self.skip_backward else "")

    def resume_drops(self) -> str | None:
        return f"{self.name} caches (they refill at the next exchange)"


def _kind(letter: str) -> PolicyKind:
    return PolicyKind(f"sancus-{letter}", "stale", {"eps": float, "skip_backward": flag},
                      lambda **params: SancusRule(letter, **params),
                      f"sancus-{letter}:eps=E[,skip_backward=0|1] with E >= 0")


KINDS = tuple(_kind(letter) for letter in ("e", "a", "h"))
