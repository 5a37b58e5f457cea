"""Analytic communication volume of each exchange plan, from layout and boundary sets alone.

The prediction follows the byte convention of :mod:`sparse_dist.comm` (the
ring allreduce's is :func:`sparse_dist.accounting.ring_allreduce_bytes`), so
for every rank and phase the bytes a :class:`~sparse_dist.spmm.DistSpMM`
call counts must equal it exactly (the tests check this). It loads without
MPI: a single-process tool may import it.

Inputs are global metadata every rank holds after building a
:class:`~sparse_dist.dcsr.DistCSR`: the row counts per group, the ``G x G``
matrix ``boundary_counts[i, j] = |B_ij|`` and ``union_sizes[j] = |B_j|``.
"""

from __future__ import annotations

import numpy as np

from sparse_dist.accounting import ring_allreduce_bytes
from sparse_dist.layout import Grid, RowLayout
from sparse_dist.plans import plan_class

SENT, RECV = 0, 1


def predict_spmm_bytes(grid: Grid, layout: RowLayout, boundary_counts: np.ndarray, union_sizes: np.ndarray,
                       plan: str, width: int, itemsize: int, exchange_row_bytes: int | None = None,
                       pair_counts: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Bytes each world rank sends and receives in one forward and one transpose.

    Returns ``{"forward": a, "backward": b}`` with arrays of shape ``(P, 2)``
    (column 0 sent, column 1 received). Integer counts give exact integer
    bytes; float counts (expected boundary sizes of a partition model) give
    expected bytes. ``exchange_row_bytes``: what one exchanged row travels as when the plan's
    messages are compressed (:meth:`sparse_dist.compress.Codec.row_bytes`); the 1.5D replica
    allreduce and broadcast keep ``width * itemsize``. The compressed transpose of a broadcast plan
    gathers the pieces instead of reducing them, with the same counts. ``pair_counts``: the rows a
    ``pair_counted`` plan moves per pair (the cover plan's ``|C_ij| + |R_ij|``: its
    :attr:`~sparse_dist.cover_plan.CoverPlan.pair_counts`, or single-process
    :func:`sparse_dist.cover_sets.cover_counts_of_rows`); required for such a plan, ignored by the others.
    """
    groups, c = grid.groups, grid.replication
    row_bytes = width * itemsize if exchange_row_bytes is None else exchange_row_bytes
    counts = np.asarray(boundary_counts)
    if plan_class(plan).pair_counted:
        if pair_counts is None:
            raise ValueError(f"the {plan} plan's bytes depend on each block's cover, not only on the boundary sets: "
                             f"pass pair_counts (the plan's own, or sparse_dist.cover_sets.cover_counts_of_rows)")
        counts = np.asarray(pair_counts)
    kind = np.result_type(counts.dtype, np.asarray(union_sizes).dtype, np.int64)
    owners = np.arange(groups)
    replica = owners % c                                  # grid.replica_for_block(j)
    owner_rank = owners * c + replica                     # grid.rank_of(j, replica)
    # moved[i, j]: bytes of H_j that receiver group i gets (from the replica column of j, j % c)
    moved = np.array(plan_class(plan).moved_rows(layout.counts(), counts, np.asarray(union_sizes)), dtype=kind)
    moved *= row_bytes
    np.fill_diagonal(moved, 0)
    column = np.zeros((grid.world_size, 2), dtype=kind)
    np.add.at(column[:, SENT], owner_rank, moved.sum(axis=0))  # a broadcast counts once per receiver
    receivers = owners[:, None] * c + replica[None, :]    # rank_of(i, replica of j)
    np.add.at(column[:, RECV], receivers.ravel(), moved.ravel())
    forward = column.copy()
    backward = column[:, ::-1].copy()
    if c > 1:
        for rank in range(grid.world_size):
            g, r = grid.group_of(rank), grid.replica_of(rank)
            n_g = layout.count(g)
            moved_rows = ring_allreduce_bytes(n_g * width, c, r, itemsize)
            forward[rank] += moved_rows
            if r == grid.replica_for_block(g):
                backward[rank, SENT] += n_g * width * itemsize * (c - 1)
            else:
                backward[rank, RECV] += n_g * width * itemsize
    return {"forward": forward, "backward": backward}


def predict_halo_bytes(grid: Grid, boundary_counts: np.ndarray, width: int, itemsize: int) -> np.ndarray:
    """Bytes each world rank sends and receives in the one-time halo exchange (:mod:`sparse_dist.halo`).

    Shape ``(P, 2)`` (sent, received). Every replica column moves its row groups' whole halos: rank
    ``(g, r)`` sends ``sum_{i != g} |B_ig|`` rows and receives ``sum_{j != g} |B_gj|`` rows of ``width``.
    """
    counts = np.array(boundary_counts, copy=True)
    np.fill_diagonal(counts, 0)
    row_bytes = width * itemsize
    out = np.zeros((grid.world_size, 2), dtype=np.result_type(counts.dtype, np.int64))
    for rank in range(grid.world_size):
        g = grid.group_of(rank)
        out[rank, SENT] = counts[:, g].sum() * row_bytes
        out[rank, RECV] = counts[g].sum() * row_bytes
    return out
