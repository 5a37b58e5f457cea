"""Pipelined staleness (PipeGCN, PSC-GCN), ``pipe:tau=T[,gamma=G]``: every exchange is posted when its rows
exist and consumed ``T`` epochs later, forward rows and backward gradients alike; the first ``T`` epochs are
exact. The strategy that keeps the flights is :class:`sparse_dist.pipelined.PipelinedStrategy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from algorithms.policies.base import PolicyBase, RunShape, StateSize
from algorithms.policies.registry import PolicyKind


SMOOTHING = 0.95
"""The smoothing the guard turns on first (PipeGCN's feature and gradient smoothing, gamma 0.95)."""


@dataclass(frozen=True)
class PipeRule(PolicyBase):
    """``pipe:tau=T[,gamma=G]`` (PipeGCN, PSC-GCN): epoch ``t`` uses the boundary rows owners sent in epoch
    ``t - T`` and, in the backward, the boundary gradients receivers sent in epoch ``t - T``; the first ``T``
    epochs are exact. ``gamma > 0``: receivers (of rows) and owners (of gradients) use an exponential
    moving average ``s <- gamma s + (1 - gamma) m`` of what arrives, started with the first arrival.
    Deterministic: no agreement, no rank-local decision (:class:`sparse_dist.pipelined.PipelinedStrategy`).
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

    @property
    def overlaps(self) -> bool:
        """Whether its flights travel while layers compute: from ``tau = 1`` on (``tau = 0`` waits as exact)."""
        return self.tau >= 1

    def scheduled_share(self) -> float:
        """Every owner sends every epoch (the exchange is late, not skipped)."""
        return 1.0

    def refusal(self, run: RunShape) -> str | None:
        """Smoothing needs a row in every message; a sampled run sends a row in some epochs only (the same
        refusal :class:`~sparse_dist.pipelined.PipelinedStrategy` makes when it is built)."""
        if self.gamma > 0 and run.samples:
            return (f"{self.name}: gamma smooths each boundary row over consecutive messages; with a sampling "
                    f"policy rows arrive in some epochs only, so combine gamma=0 with sampling")
        return None

    def tightened(self, run: RunShape) -> str | None:
        """Smoothing first (``gamma = 0.95``: PipeGCN's; not beside a sampler, which it refuses), then one epoch
        less of delay; ``tau = 0`` is exact."""
        if self.tau == 0:
            return None
        if self.gamma == 0.0 and not run.samples:
            return f"{self.name}:tau={self.tau},gamma={SMOOTHING}"
        if self.tau == 1:
            return None
        return f"{self.name}:tau={self.tau - 1}" + (f",gamma={self.gamma}" if self.gamma else "")

    def state_size(self) -> StateSize:
        """Its last flight of rows and of gradients per layer (from ``tau = 1`` on; ``tau = 0`` keeps none)."""
        return StateSize(row_copies=2 if self.tau > 0 else 0)

    def resume_drops(self) -> str | None:
        if self.tau > 0:
            return "pipelined flights and averages (the next tau epochs exchange exactly, as a run's first do)"
        return None


KINDS = (PolicyKind("pipe", "stale", {"tau": int, "gamma": float}, lambda **params: PipeRule(**params),
                    "pipe:tau=T[,gamma=G] with T >= 0 epochs and 0 <= G < 1"),)
