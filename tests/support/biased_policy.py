"""A deliberately biased sampler, for the guard's tests only (never registered by the library).

``drop-fixed:drop=D`` leaves out the same share ``D`` of every receiver's boundary rows in every epoch (a row's
fate is a hash of its global id alone) and does not reweight the rows it keeps: the policy's product misses
those columns of ``Â`` for the whole run. Nothing about it changes from epoch to epoch, so it never *falls*: it
trains a model for a graph without those edges, and evaluation (exact) meets the whole graph. Its one step
toward exact is exact itself.

``p`` (what the sampled strategy scales kept columns by, ``1/p``) is one less one part in 10^12: the rows are
sampled, and the kept ones travel unscaled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from algorithms.hashing import row_hash
from algorithms.policies.base import PolicyBase, RunShape
from algorithms.policies.registry import KINDS, PolicyKind, register
from sparse_dist.comm import Communicator
from sparse_dist.exchange import StalenessView

NAME = "drop-fixed"


@dataclass(frozen=True)
class DropFixedSampler(PolicyBase):
    """Leaves out a fixed share ``drop`` of the boundary rows, unscaled (module docstring)."""

    drop: float
    weight: float = 1.0
    seed: int = 0
    side: str = "receiver"
    name: str = NAME

    def __post_init__(self) -> None:
        if not 0.0 <= self.drop <= 1.0 or not self.weight >= 1.0:
            raise ValueError(f"{NAME}: drop must lie in [0, 1] and weight be at least 1, got {self.drop}, "
                             f"{self.weight}")

    @property
    def p(self) -> float:
        """What the sampled strategy scales kept columns by the inverse of: ``1 / weight``, just below 1 at
        weight 1 (a sampled strategy with unscaled rows)."""
        return min(1.0 / self.weight, 1.0 - 1e-12)

    @property
    def samples(self) -> bool:  # type: ignore[override]
        return True

    def keep(self, epoch: int, stream: int, global_rows: np.ndarray) -> np.ndarray:
        """The same rows every epoch, on every receiver."""
        hashed = row_hash(self.seed, 0, 0, global_rows, salt=0x5EED)
        return (hashed >> np.uint64(11)) >= np.uint64(int(self.drop * 2.0**53))

    def tightened(self, run: RunShape) -> str | None:
        return None


def register_biased_policy() -> None:
    """Make ``--sample drop-fixed:drop=D`` parse in this process (idempotent)."""
    if NAME not in KINDS["sample"]:
        register(PolicyKind(NAME, "sample", {"drop": float, "weight": float},
                            lambda seed, drop, weight=1.0: DropFixedSampler(drop, weight, seed),
                            f"{NAME}:drop=D[,weight=W] with 0 <= D <= 1, W >= 1"))


FROZEN = "frozen-test"


@dataclass(frozen=True)
class FrozenRule(PolicyBase):
    """Every owner sends its boundary rows once, at its first exchange, and never again: each receiver trains on
    the rows of the first epoch's weights for the whole run (gradients travel every epoch)."""

    name: str = FROZEN
    caches: ClassVar[bool] = True
    needs_gap: ClassVar[bool] = False
    skip_backward: ClassVar[bool] = False
    pipelined: ClassVar[bool] = False
    overlaps: ClassVar[bool] = False

    def decide(self, view: StalenessView, comm: Communicator) -> np.ndarray:
        return view.versions < 0

    def tightened(self, run: RunShape) -> str | None:
        return None


def register_frozen_rule() -> None:
    if FROZEN not in KINDS["stale"]:
        register(PolicyKind(FROZEN, "stale", {}, lambda: FrozenRule(), FROZEN))
