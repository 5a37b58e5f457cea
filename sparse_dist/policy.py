"""The seam through which communication-avoiding policies change an exchange (DESIGN section 4).

The core defines only the questions a plan asks; the policies themselves
live in :mod:`algorithms.policies` (or in a third party's code) and plug in
without touching the SpMM:

* :class:`BoundarySampler` - which boundary rows travel this epoch, and
  the scale ``1 / p`` of the kept columns. The answer must be a pure
  function of ``(epoch, stream, global row id)`` so that owner and receiver
  compute the same sample without talking (``stream`` is the receiver's
  group for receiver-side sampling, the owner's for owner-side sampling).
* :class:`StalenessRule` - which owners are ACTIVE (send, receivers refresh
  their cache) or STALE (skip, receivers reuse their cached block) in this
  epoch and layer. ``decide`` is collective over the replica column: every
  rank returns the same mask before any exchange starts.

A plan consults them only while training (``ExchangeContext.training``);
evaluation is always exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sparse_dist.comm import Communicator


@dataclass(frozen=True)
class ExchangeContext:
    """Where an SpMM call sits in training: the epoch, the layer, and whether it trains."""

    epoch: int
    layer: int
    training: bool


@dataclass
class StalenessView:
    """What a staleness rule may look at, for one layer, on one rank.

    ``versions[j]``: epoch of owner ``j``'s last broadcast in this layer (-1: never),
    the same on every rank. ``cached_versions[j]``: version of this rank's
    cached block from ``j`` (-1: none cached). ``own_gap``: relative change
    ``||X - X_cached|| / ||X_cached||`` (Frobenius) of the rows this rank would
    broadcast as an owner, or None if it owns no broadcast in this column.
    """

    epoch: int
    layer: int
    owner: int
    owners: list[int]
    versions: np.ndarray
    cached_versions: np.ndarray
    own_gap: float | None


class BoundarySampler(Protocol):
    name: str
    p: float
    side: str  # "receiver" or "owner"

    def keep(self, epoch: int, stream: int, global_rows: np.ndarray) -> np.ndarray:
        """Boolean mask over ``global_rows``: kept in this epoch's sample."""


class StalenessRule(Protocol):
    name: str
    needs_gap: bool
    skip_backward: bool

    def decide(self, view: StalenessView, comm: Communicator) -> np.ndarray:
        """Boolean ACTIVE mask over all ``G`` owners (collective over ``comm``)."""
