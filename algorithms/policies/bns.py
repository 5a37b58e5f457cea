"""BNS-GCN boundary sampling, ``bns:keep=K[,side=receiver|owner]``: each epoch keeps each boundary row with
probability ``K`` (the field ``p``) and scales the kept columns of ``A_ij`` by ``1/K``. ``bns:p=`` is keep's
old name, accepted this release with a ``FutureWarning``.

A boundary row is kept in epoch ``e`` when a 64-bit hash (splitmix64 chain of seed, epoch, stream, global
row id; :mod:`algorithms.hashing`) falls below ``p * 2**64``. Owner and receiver evaluate the same hash, so
the sample costs no communication and does not depend on ``P`` for owner-side sampling. ``side=receiver``
(default, BNS-GCN; stream = receiver's row group) suits ``p2p``; ``side=owner`` (stream = owner) is what the
broadcast plans use. The same sample serves every layer, forward and backward, of the epoch. The strategy
that carries it is :class:`sparse_dist.exchange.SampledStrategy` (``p = 1`` is the exact path).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from algorithms.hashing import row_hash
from algorithms.policies.base import PolicyBase, RunShape, doubled_share
from algorithms.policies.registry import PolicyKind


@dataclass(frozen=True)
class BnsSampler(PolicyBase):
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

    @property
    def samples(self) -> bool:  # type: ignore[override]
        """``p = 1`` sends every row: the exact path, which any plan carries."""
        return self.p < 1.0

    def tightened(self, run: RunShape) -> str | None:
        """Twice the kept share; from ``keep >= 0.5`` on, every row (exact)."""
        keep = doubled_share(self.p)
        return None if keep is None else f"{self.name}:keep={keep:g},side={self.side}"

    def keep(self, epoch: int, stream: int, global_rows: np.ndarray) -> np.ndarray:
        hashed = row_hash(self.seed, epoch, stream, global_rows)
        if self.p >= 1.0:
            return np.ones(hashed.shape, dtype=bool)
        threshold = np.uint64(math.ceil(self.p * 2.0**53))
        return (hashed >> np.uint64(11)) < threshold


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


KINDS = (PolicyKind("bns", "sample", {"keep": float, "p": float, "side": str}, _bns,
                    "bns:keep=K[,side=receiver|owner] with 0 <= K <= 1"),)
