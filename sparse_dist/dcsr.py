"""Block-row distributed CSR matrix (DESIGN section 3).

Each rank holds the rows of its row group ``g`` of a square ``N x N``
matrix, given as a local scipy CSR with GLOBAL column ids. The columns are
split into blocks by the owner of the matching rows of ``H`` (the same
layout as the rows), so ``A_gj`` is the part of ``A``'s rows ``g`` whose
columns are owned by group ``j``.

Boundary sets (local row ids inside the owner's range):

* ``B_gj`` (``recv_ids[j]`` on group ``g``): columns of ``A_gj`` holding a
  nonzero, i.e. the rows of ``H_j`` that group ``g`` needs;
* ``B_j`` (``union_ids`` on group ``j``): the union over ``g != j``.

Construction is collective and agrees the boundary sets with one
alltoallv of ids in each replica column (plus small metadata gathers); the
set-up bytes are booked under the ``other`` phase. Naming follows the
local/global convention: ``lshape``/``gshape``, ``lnnz``/``gnnz``.

On the 1.5D grid replica ``r`` of group ``g`` keeps only the column blocks
``j`` with ``j % c == r`` (:meth:`Grid.column_share`), the ones it multiplies.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.csr import distinct_ids, entry_rows
from sparse_dist.layout import Grid, RowLayout
from sparse_dist.log import get_logger

if TYPE_CHECKING:  # annotations only: the byte model (sparse_dist.predict) loads without MPI
    from sparse_dist.comm import Communicator

_log = get_logger(__name__)


def split_grid(comm: Communicator, grid: Grid) -> tuple[Communicator, Communicator]:
    """``(row_comm, col_comm)``: the ``c`` replicas of this rank's row group, and the ``G`` ranks of its
    replica column. Collective over ``comm`` (two splits, every rank in the same order)."""
    group, replica = grid.group_of(comm.rank), grid.replica_of(comm.rank)
    return comm.split(group, replica), comm.split(replica, group)


class DistCSR:
    """A square sparse matrix distributed by block rows over a (1D or 1.5D) grid.

    Collective: every rank of ``comm`` constructs it together.

    Args:
        comm: the world facade (all ``P`` ranks).
        layout: contiguous row ranges of the ``G = P / replication`` row groups.
        local_rows: this rank's rows (``layout.count(g) x N`` scipy sparse,
            global column ids); the ``c`` replicas of a group pass equal rows.
        replication: the 1.5D replication factor ``c`` (1 = 1D).
        name: used in error messages.
        grid_comms: ``split_grid(comm, Grid(comm.size, replication))`` made earlier by the caller
            (e.g. to normalise the rows over the replica column first); split here when None.
    """

    def __init__(self, comm: Communicator, layout: RowLayout, local_rows: sp.spmatrix, *,
                 replication: int = 1, name: str = "matrix",
                 grid_comms: tuple[Communicator, Communicator] | None = None) -> None:
        self.comm = comm
        self.grid = Grid(comm.size, replication)
        self.layout = layout
        self.name = name
        self.group = self.grid.group_of(comm.rank)
        self.replica = self.grid.replica_of(comm.rank)
        n_total = layout.n_rows
        not_sparse = None if sp.issparse(local_rows) else (
            f"{name}: local_rows must be a scipy sparse matrix, got {type(local_rows).__name__}")
        comm.raise_if_any(self._layout_error() or not_sparse, ValueError)
        local = sp.csr_matrix(local_rows)
        comm.raise_if_any(self._rows_error(local, n_total), ValueError)
        local = local.copy()
        local.sum_duplicates()
        local.sort_indices()

        # Sub-communicators: the c replicas of one row group, and the G ranks of one replica column.
        self.row_comm, self.col_comm = grid_comms if grid_comms is not None else split_grid(comm, self.grid)
        comm.raise_if_any(self._replica_mismatch(local), ValueError)

        self.lshape = local.shape
        self.gshape = (n_total, n_total)
        self.lnnz = int(local.nnz)
        self.gnnz = int(self.col_comm.allgather_array(np.array([self.lnnz], dtype=np.int64)).sum())
        self.dtype = local.dtype

        self.blocks: dict[int, sp.csr_matrix] = {}
        counts_row = self._split_blocks(local)
        self.boundary_counts = self.col_comm.allgather_array(counts_row)
        self._exchange_boundary_ids()
        _log.info("%s: %d x %d, %d nonzeros over %d ranks (c=%d); row group %d needs %d remote rows",
                  name, n_total, n_total, self.gnnz, comm.size, replication, self.group,
                  int(self.boundary_counts[self.group].sum() - self.boundary_counts[self.group, self.group]))

    # ------------------------------------------------------------- validation
    def _layout_error(self) -> str | None:
        if self.layout.parts != self.grid.groups:
            return (f"{self.name}: layout has {self.layout.parts} parts but the grid has "
                    f"{self.grid.groups} row groups (P={self.grid.world_size}, c={self.grid.replication})")
        return None

    def _rows_error(self, local: sp.csr_matrix, n_total: int) -> str | None:
        expected = (self.layout.count(self.group), n_total)
        if local.shape != expected:
            return f"{self.name}: local rows have shape {local.shape}, expected {expected} for row group {self.group}"
        if local.nnz and (local.indices.min() < 0 or local.indices.max() >= n_total):
            return f"{self.name}: column ids must lie in [0, {n_total})"
        if not np.all(np.isfinite(local.data)):
            return f"{self.name}: values must be finite, found {int((~np.isfinite(local.data)).sum())} non-finite"
        return None

    def _replica_mismatch(self, local: sp.csr_matrix) -> str | None:
        """Why the ``c`` replicas of this row group hold different rows, or None (collective over ``row_comm``)."""
        digest = zlib.crc32(local.indptr.tobytes(), zlib.crc32(local.indices.tobytes(), zlib.crc32(local.data.tobytes())))
        digests = self.row_comm.allgather_array(np.array([digest, local.nnz], dtype=np.int64))
        if np.any(digests != digests[0]):
            return f"{self.name}: the {self.grid.replication} replicas of row group {self.group} hold different rows"
        return None

    # --------------------------------------------------------------- blocks
    def _split_blocks(self, local: sp.csr_matrix) -> np.ndarray:
        """Cut the local rows into column blocks; return |B_gj| for every group j (0 for j == g)."""
        groups = self.grid.groups
        counts = np.zeros(groups, dtype=np.int64)
        self.recv_ids: dict[int, np.ndarray] = {}
        n_rows = local.shape[0]
        owners = self.layout.owner_of(local.indices)
        order = np.argsort(owners, kind="stable")
        starts = np.searchsorted(owners[order], np.arange(groups + 1))
        row_of_entry = entry_rows(local.indptr)
        share = set(self.grid.column_share(self.replica))
        for j in range(groups):
            lo, hi = starts[j], starts[j + 1]
            if lo == hi:
                if j in share and j == self.group:
                    self.blocks[j] = sp.csr_matrix((n_rows, self.layout.count(j)), dtype=local.dtype)
                continue
            picked = order[lo:hi]
            local_cols = local.indices[picked].astype(np.int64) - self.layout.offsets[j]
            if j != self.group:
                ids = distinct_ids(local_cols, self.layout.count(j))
                counts[j] = ids.size
                if j in share:
                    self.recv_ids[j] = ids
            if j in share:
                rows = row_of_entry[picked]
                indptr = np.searchsorted(rows, np.arange(n_rows + 1))
                block = sp.csr_matrix((local.data[picked], local_cols, indptr),
                                      shape=(n_rows, self.layout.count(j)))
                self.blocks[j] = block
        return counts

    def _exchange_boundary_ids(self) -> None:
        """Tell each owner which of its rows every receiver needs (p2p send lists, B_j).

        Collective over ``col_comm``: one alltoallv of ids and one allgather of ``|B_j|``.
        """
        groups = self.grid.groups
        share = set(self.grid.column_share(self.replica))
        me = self.group
        send_rows = [int(self.boundary_counts[me, j]) if (j in share and j != me) else 0 for j in range(groups)]
        owner_in_share = me in share
        recv_rows = [int(self.boundary_counts[i, me]) if (owner_in_share and i != me) else 0 for i in range(groups)]
        send = torch.from_numpy(np.concatenate([self.recv_ids.get(j, np.empty(0, np.int64))
                                                for j in range(groups)]).astype(np.int64))
        recv = torch.empty(sum(recv_rows), dtype=torch.int64)
        self.col_comm.alltoallv(send, send_rows, recv, recv_rows, phase="other")
        pieces = np.split(recv.numpy(), np.cumsum(recv_rows)[:-1])
        self.send_ids: dict[int, np.ndarray] = {i: pieces[i] for i in range(groups) if recv_rows[i] > 0}
        self.union_ids = (np.unique(np.concatenate(list(self.send_ids.values())))
                          if self.send_ids else np.empty(0, np.int64))

        # Positions of each B_ij inside B_j, sent back so receivers can index the sparse broadcast.
        positions = torch.from_numpy(np.concatenate(
            [np.searchsorted(self.union_ids, pieces[i]) for i in range(groups)]).astype(np.int64))
        back = torch.empty(sum(send_rows), dtype=torch.int64)
        self.col_comm.alltoallv(positions, recv_rows, back, send_rows, phase="other")
        back_pieces = np.split(back.numpy(), np.cumsum(send_rows)[:-1])
        self.union_positions: dict[int, np.ndarray] = {j: back_pieces[j] for j in self.recv_ids}

        mine = self.union_ids.size if owner_in_share else -1
        sizes = self.comm.allgather_array(np.array([mine], dtype=np.int64))[:, 0]
        self.union_sizes = np.array([sizes[self.grid.rank_of(j, self.grid.replica_for_block(j))]
                                     for j in range(groups)], dtype=np.int64)

    # -------------------------------------------------------------- queries
    @property
    def column_share(self) -> list[int]:
        """Column blocks this rank multiplies (all groups in 1D)."""
        return self.grid.column_share(self.replica)

    def total_boundary(self) -> int:
        """Sum over owners of |B_j|: the distinct rows that must leave their owner."""
        return int(self.union_sizes.sum())
