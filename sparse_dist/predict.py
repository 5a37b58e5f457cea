"""Analytic communication volume of each exchange plan, from layout and boundary sets alone.

The prediction follows the byte convention of :mod:`sparse_dist.comm`, so
for every rank and phase the bytes a :class:`~sparse_dist.spmm.DistSpMM`
call counts must equal it exactly (the tests check this).

Inputs are global metadata every rank holds after building a
:class:`~sparse_dist.dcsr.DistCSR`: the row counts per group, the ``G x G``
matrix ``boundary_counts[i, j] = |B_ij|`` and ``union_sizes[j] = |B_j|``.
"""

from __future__ import annotations

import numpy as np

from sparse_dist.comm import _ring_allreduce_bytes
from sparse_dist.layout import Grid, RowLayout

SENT, RECV = 0, 1


def predict_spmm_bytes(grid: Grid, layout: RowLayout, boundary_counts: np.ndarray, union_sizes: np.ndarray,
                       plan: str, width: int, itemsize: int) -> dict[str, np.ndarray]:
    """Bytes each world rank sends and receives in one forward and one transpose.

    Returns ``{"forward": a, "backward": b}`` with arrays of shape ``(P, 2)``
    (column 0 sent, column 1 received).
    """
    groups, c = grid.groups, grid.replication
    row_bytes = width * itemsize
    column = np.zeros((grid.world_size, 2), dtype=np.int64)
    for j in range(groups):
        r = grid.replica_for_block(j)
        owner = grid.rank_of(j, r)
        if plan in ("dense-bcast", "sparse-bcast"):
            rows = layout.count(j) if plan == "dense-bcast" else int(union_sizes[j])
            if rows == 0:
                continue
            column[owner, SENT] += rows * row_bytes * (groups - 1)
            for i in range(groups):
                if i != j:
                    column[grid.rank_of(i, r), RECV] += rows * row_bytes
        elif plan == "p2p":
            for i in range(groups):
                if i != j:
                    moved = int(boundary_counts[i, j]) * row_bytes
                    column[owner, SENT] += moved
                    column[grid.rank_of(i, r), RECV] += moved
        else:
            raise ValueError(f"unknown exchange plan {plan!r}")
    forward = column.copy()
    backward = column[:, ::-1].copy()
    if c > 1:
        for rank in range(grid.world_size):
            g, r = grid.group_of(rank), grid.replica_of(rank)
            n_g = layout.count(g)
            moved = _ring_allreduce_bytes(n_g * width, c, r, itemsize)
            forward[rank] += moved
            if r == grid.replica_for_block(g):
                backward[rank, SENT] += n_g * row_bytes * (c - 1)
            else:
                backward[rank, RECV] += n_g * row_bytes
    return {"forward": forward, "backward": backward}
