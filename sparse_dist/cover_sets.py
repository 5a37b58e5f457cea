"""Minimum vertex covers of boundary blocks (König), the arithmetic of the ``cover`` plan: no communication.

A boundary block ``B = A_ij`` (rows of receiver ``i``, columns of owner ``j``) needs every nonzero ``(r, c)``
covered: either column ``c`` travels as a row of ``H_j`` or row ``r`` travels pre-aggregated,
``sum_c B[r, c] H_j[c]`` over its columns that do not travel. The fewest rows plus columns that cover every
nonzero is a minimum vertex cover of the bipartite graph of ``B``'s nonzeros; by König's theorem its size is
that of a maximum matching, found here with :func:`scipy.sparse.csgraph.maximum_bipartite_matching`
(Hopcroft-Karp, compiled) and turned into a cover by one alternating search from the unmatched rows:
``Z`` = what unmatched rows reach by alternating paths (any edge row -> column, the matched edge column ->
row); the cover is the columns in ``Z`` and the rows not in ``Z``. A cover is never larger than the block's
nonzero columns (the ``p2p`` plan's rows) nor its nonzero rows. Where all nonzero columns are a minimum cover
too, they are taken: the same bytes, and nothing for the owner to pre-aggregate or to learn at set-up.

A leaf of the package (numpy and scipy only): the plan (:mod:`sparse_dist.cover_plan`) and single-process
tools (the cost model, ``prepare``'s report) share it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import maximum_bipartite_matching

from sparse_dist.csr import distinct_ids, entry_rows
from sparse_dist.splitmix import splitmix64

__all__ = ["BlockCover", "block_fingerprint", "konig_cover", "cover_counts_of_rows", "positions_in"]


@dataclass(frozen=True)
class BlockCover:
    """A minimum vertex cover of one block's nonzeros: ``columns`` (local ids of the owner's rows, ascending,
    sent as rows of ``H``) and ``rows`` (local ids of the receiver's rows, ascending, sent pre-aggregated)."""

    columns: np.ndarray
    rows: np.ndarray

    @property
    def size(self) -> int:
        return int(self.columns.size + self.rows.size)


def konig_cover(block: sp.csr_matrix) -> BlockCover:
    """A minimum vertex cover of the nonzero pattern of ``block`` (scipy CSR, sorted or not; stored entries
    count as nonzeros). Deterministic: the same pattern gives the same cover on every rank."""
    block = sp.csr_matrix(block)
    empty = np.empty(0, np.int64)
    if block.nnz == 0:
        return BlockCover(empty, empty)
    row_ids = np.flatnonzero(np.diff(block.indptr)).astype(np.int64)
    col_ids = distinct_ids(block.indices, block.shape[1]).astype(np.int64)
    # the compact pattern: nonzero rows x nonzero columns, canonical (sorted, no duplicates)
    compact_cols = positions_in(col_ids, block.indices, block.shape[1])
    counts = np.diff(block.indptr)[row_ids]
    indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    pattern = sp.csr_matrix((np.ones(block.nnz, dtype=np.int8), compact_cols, indptr),
                            shape=(row_ids.size, col_ids.size))
    pattern.sum_duplicates()
    pattern.sort_indices()
    match_of_row = maximum_bipartite_matching(pattern, perm_type="column")  # column of each row, -1: unmatched
    matched = int((match_of_row >= 0).sum())
    if matched == col_ids.size:  # every nonzero column is a minimum cover: prefer it (no pre-aggregation)
        return BlockCover(col_ids, empty)
    row_of_col = np.full(col_ids.size, -1, dtype=np.int64)
    row_of_col[match_of_row[match_of_row >= 0]] = np.flatnonzero(match_of_row >= 0)
    seen_rows = match_of_row < 0
    seen_cols = np.zeros(col_ids.size, dtype=bool)
    frontier = np.flatnonzero(seen_rows)
    ptr, idx = pattern.indptr, pattern.indices
    while frontier.size:
        starts, ends = ptr[frontier], ptr[frontier + 1]
        lengths = ends - starts
        positions = np.repeat(starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths) + np.arange(lengths.sum())
        reached = np.unique(idx[positions])
        reached = reached[~seen_cols[reached]]
        seen_cols[reached] = True
        rows = row_of_col[reached]
        rows = rows[rows >= 0]
        rows = rows[~seen_rows[rows]]
        seen_rows[rows] = True
        frontier = rows
    cover = BlockCover(col_ids[seen_cols], row_ids[~seen_rows])
    assert cover.size == matched, (cover.size, matched)  # König
    return cover


def positions_in(ids: np.ndarray, values: np.ndarray, bound: int) -> np.ndarray:
    """The position of each of ``values`` in the ascending ``ids`` (all in ``[0, bound)``), -1 where absent:
    one lookup table, no search (a block's column ids against its few distinct ones)."""
    table = np.full(bound, -1, dtype=np.int64)
    table[ids] = np.arange(ids.size, dtype=np.int64)
    return table[values]


def block_fingerprint(block: sp.csr_matrix, *, transposed: bool = False) -> tuple[int, int]:
    """``(nnz, hash)`` of a block's stored entries (local row, local column, value bits), independent of their
    order; ``transposed``: of the block's transpose (so the holder of ``A_ji`` can check it equals
    ``A_ij^T`` without seeing ``A_ij``). Wrapping uint64 arithmetic, returned as int64 for an allgather."""
    block = sp.csr_matrix(block)
    rows = entry_rows(block.indptr).astype(np.uint64)
    cols = block.indices.astype(np.uint64)
    if transposed:
        rows, cols = cols, rows
    bits = np.ascontiguousarray(block.data.astype(np.float64)).view(np.uint64)
    with np.errstate(over="ignore"):
        key = splitmix64(splitmix64((rows << np.uint64(32)) ^ cols) ^ bits)  # local ids < 2^32
        total = np.uint64(key.sum(dtype=np.uint64)) if key.size else np.uint64(0)
    return int(block.nnz), int(total.view(np.int64))


def cover_counts_of_rows(rows: sp.csr_matrix, offsets: np.ndarray, group: int) -> np.ndarray:
    """``|C_gj| + |R_gj|`` for every owner ``j`` (0 for ``j == g``) of a row group's rows (``n_g x N``, global
    column ids; ``offsets``: the row groups' first rows, ``G + 1`` of them). Single-process tools' form."""
    rows = sp.csr_matrix(rows)
    offsets = np.asarray(offsets, dtype=np.int64)
    groups = offsets.size - 1
    out = np.zeros(groups, dtype=np.int64)
    for j in range(groups):
        if j == group:
            continue
        lo, hi = offsets[j], offsets[j + 1]
        if hi == lo:
            continue
        out[j] = konig_cover(_column_range(rows, lo, hi)).size
    return out


def _column_range(rows: sp.csr_matrix, lo: int, hi: int) -> sp.csr_matrix:
    """The entries of ``rows`` with columns in ``[lo, hi)``, renumbered from 0."""
    keep = (rows.indices >= lo) & (rows.indices < hi)
    row_of_entry = entry_rows(rows.indptr)
    indptr = np.concatenate(([0], np.cumsum(np.bincount(row_of_entry[keep], minlength=rows.shape[0]))))
    return sp.csr_matrix((rows.data[keep], rows.indices[keep] - lo, indptr), shape=(rows.shape[0], hi - lo))
