"""Exchange plans of the distributed SpMM ``T = A H`` and its transpose ``dH = A^T dT``: their names.

All four plans of DESIGN section 3, over one replica column (``col_comm``,
the ``G`` ranks sharing a replica index; in 1D that is every rank):

* ``dense-bcast`` (CAGNET 1D): owner ``j`` broadcasts all of ``H_j``.
* ``sparse-bcast``: owner ``j`` broadcasts only the rows ``B_j``.
* ``p2p``: owner ``j`` sends rows ``B_ij`` to each ``i`` (one alltoallv).
* ``cover`` (SuperGCN): per pair a minimum vertex cover of ``A_ij``'s nonzeros: owner ``j`` sends the
  cover's columns as rows of ``H_j`` and its rows as partial sums (one alltoallv, never more rows than
  ``p2p``; :mod:`sparse_dist.cover_plan`).

The transposes are the reverse exchanges: a reduce to the owner for the
broadcast plans, the reverse alltoallv for ``p2p``, each summing the
pieces ``A_ij^T dT_i`` that every rank computes locally. This is exact for
non-symmetric ``A``; no global ``A^T`` is formed (each rank transposes its own
blocks, lazily, on the first backward).

Plans only move bytes. Who does what:

* :class:`~sparse_dist.exchange_plan.ExchangePlan` (the base) and its kinds,
  :mod:`sparse_dist.broadcast_plans` and :mod:`sparse_dist.p2p_plan`: each plan class is the one
  home of its semantics: which strategies it can carry (``carries_samples``, ``carries_history``),
  its byte model (:meth:`ExchangePlan.moved_rows`) and its alpha-beta cost
  (:meth:`ExchangePlan.exchange_seconds`); it posts the non-blocking exchanges of a call as a
  flight of parts and says what each part is (rows, block, where its gradient lands).
* What each message carries while training (exact, sampled, cached, pipelined) is decided by the
  :class:`~sparse_dist.exchange.ExchangeStrategy` a plan holds.
* :class:`~sparse_dist.partial.PartialSpMM` orchestrates the flights (post, overlap, multiply
  what arrived); :class:`~sparse_dist.products.BlockProducts` runs the timed local products;
  :mod:`sparse_dist.receiver_dropout` masks what is multiplied under receiver-side dropout.

Overlap: the bcast plans post the next block's non-blocking broadcast
(reduce) before multiplying the current block (prefetch depth 1); ``p2p``
posts its alltoallv and multiplies the local block meanwhile. How much of
the transfer is really hidden depends on the MPI library's asynchronous
progress (e.g. ``MPICH_ASYNC_PROGRESS=1``).

A plan's exchange yields this rank's partial result only; :class:`sparse_dist.spmm.DistSpMM`
completes it across the replicas of a row group on the 1.5D grid.
"""

from __future__ import annotations

from sparse_dist.broadcast_plans import DenseBroadcastPlan, SparseBroadcastPlan
from sparse_dist.cover_plan import CoverPlan
from sparse_dist.exchange_plan import ExchangePlan, Gathered
from sparse_dist.p2p_plan import PointToPointPlan

__all__ = ["CoverPlan", "DenseBroadcastPlan", "ExchangePlan", "Gathered", "PLANS", "PLAN_NAMES",
           "PointToPointPlan", "SparseBroadcastPlan", "plan_class"]

PLANS: dict[str, type[ExchangePlan]] = {cls.name: cls for cls in (DenseBroadcastPlan, SparseBroadcastPlan,
                                                                  PointToPointPlan, CoverPlan)}
PLAN_NAMES: tuple[str, ...] = tuple(PLANS)


def plan_class(name: str) -> type[ExchangePlan]:
    """The exchange plan class called ``name`` (one of :data:`PLAN_NAMES`)."""
    try:
        return PLANS[name]
    except KeyError:
        raise ValueError(f"unknown exchange plan {name!r}; expected one of {PLAN_NAMES}") from None
