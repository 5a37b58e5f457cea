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

from sparse_dist.csr import distinct_ids_and_positions, entry_rows
from sparse_dist.splitmix import splitmix64

__all__ = ["BlockCover", "MatchedBlock", "block_checksum", "block_fingerprint", "konig_cover", "cover_counts_of_rows",
           "entries_of_rows", "pre_aggregated", "pre_aggregated_of_transpose"]


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
    return MatchedBlock(block).cover()


class MatchedBlock:
    """One block's compact nonzero pattern (nonzero rows x nonzero columns) and a maximum matching of it: the
    König covers of the block (:meth:`cover`) and of its transpose (:meth:`transposed_cover`) from ONE matching
    (a maximum matching of ``B`` is one of ``B^T``; the owner of a symmetric pair needs both).

    Why any maximum matching gives the same cover: for a maximum matching ``M``, the rows reached from the
    ``M``-unmatched rows by ``M``-alternating paths are exactly the rows that SOME maximum matching leaves
    unmatched (flip the path for one way; for the other, the component of ``M xor M'`` at such a row is an
    even alternating path ending at an ``M``-unmatched row), and the columns reached are exactly their
    neighbours. Both depend on the pattern only (Dulmage-Mendelsohn), and so does the matching's size, so
    the cover does too: the transpose's cover equals ``konig_cover(B^T)`` bitwise.
    """

    def __init__(self, block: sp.csr_matrix) -> None:
        if not (sp.issparse(block) and block.format == "csr"):
            block = sp.csr_matrix(block)
        lengths = np.diff(block.indptr)
        nonzero = lengths > 0
        self.row_ids = np.flatnonzero(nonzero).astype(np.int64)
        col_ids, compact_cols = distinct_ids_and_positions(block.indices, block.shape[1])
        self.col_ids = col_ids.astype(np.int64)
        # the compact pattern: a monotone renumbering keeps a canonical block canonical (sorted, no duplicates)
        index = np.int32 if block.nnz < 2**31 else np.int64  # what the compiled matching takes without a copy
        compact_cols = compact_cols.astype(index)
        indptr = np.concatenate(([0], block.indptr[1:][nonzero])).astype(index)
        canonical = block.nnz == 0 or block.has_canonical_format
        self.pattern = sp.csr_matrix((np.ones(compact_cols.size, dtype=np.int8), compact_cols, indptr),
                                     shape=(self.row_ids.size, self.col_ids.size))
        if canonical:
            self.pattern.has_canonical_format = True
        else:
            self.pattern.sum_duplicates()
            self.pattern.sort_indices()
        self._flipped: sp.csr_matrix | None = None  # the pattern's transpose, built once where needed
        # the matching from the side with fewer rows (scipy's search is much faster there; any maximum
        # matching gives the same covers): the column of each row, the row of each column, -1: unmatched
        if self.pattern.nnz and self.row_ids.size > self.col_ids.size:
            self.row_of_col = maximum_bipartite_matching(self.flipped(), perm_type="column").astype(np.int64)
            self.match_of_row = _mates(self.row_of_col, self.row_ids.size)
        else:
            self.match_of_row = (maximum_bipartite_matching(self.pattern, perm_type="column").astype(np.int64)
                                 if self.pattern.nnz else np.empty(0, np.int64))
            self.row_of_col = _mates(self.match_of_row, self.col_ids.size)
        self.matched = int((self.match_of_row >= 0).sum())

    def flipped(self) -> sp.csr_matrix:
        """The compact pattern's transpose as CSR (nonzero columns x nonzero rows, canonical)."""
        if self._flipped is None:
            csc = self.pattern.tocsc()  # sorted indices
            self._flipped = sp.csr_matrix((csc.data, csc.indices, csc.indptr), shape=self.pattern.shape[::-1])
            self._flipped.has_canonical_format = True
        return self._flipped

    def cover(self) -> BlockCover:
        """The block's cover: all nonzero columns where they are a minimum cover (no pre-aggregation), else
        the columns reached from the unmatched rows and the rows not reached."""
        empty = np.empty(0, np.int64)
        if self.matched == self.col_ids.size:
            return BlockCover(self.col_ids, empty)
        rows, cols = _alternating(self.pattern.indptr, self.pattern.indices, self.match_of_row, self.row_of_col)
        cover = BlockCover(self.col_ids[cols], self.row_ids[~rows])
        assert cover.size == self.matched, (cover.size, self.matched)  # König
        return cover

    def transposed_cover(self) -> BlockCover:
        """``konig_cover(B^T)`` from this matching: the roles of rows and columns swapped."""
        empty = np.empty(0, np.int64)
        if self.matched == self.row_ids.size:
            return BlockCover(self.row_ids, empty)
        flipped = self.flipped()
        cols, rows = _alternating(flipped.indptr, flipped.indices, self.row_of_col, self.match_of_row)
        cover = BlockCover(self.row_ids[rows], self.col_ids[~cols])
        assert cover.size == self.matched, (cover.size, self.matched)  # König
        return cover


def pre_aggregated(block: sp.csr_matrix, cover: BlockCover) -> sp.csr_matrix:
    """``B[R, not C]`` (``|R| x n_j``): the entries the owner sums into the partial rows (``block``'s order
    within a row)."""
    positions = entries_of_rows(block.indptr, cover.rows)
    columns = block.indices[positions]
    sent = np.zeros(block.shape[1], dtype=bool)
    sent[cover.columns] = True
    keep = ~sent[columns]
    kept_before = np.concatenate(([0], np.cumsum(keep)))
    indptr = kept_before[np.concatenate(([0], np.cumsum(np.diff(block.indptr)[cover.rows])))]
    return sp.csr_matrix((block.data[positions[keep]], columns[keep], indptr),
                         shape=(cover.rows.size, block.shape[1]))


def pre_aggregated_of_transpose(held: sp.csr_matrix, cover: BlockCover) -> sp.csr_matrix:
    """``B[R, not C]`` for ``B = held^T`` without transposing all of ``held``: its entries in the columns
    ``R`` and outside the rows ``C``, regrouped by column (coo -> csr is stable: rows stay ascending)."""
    place = np.full(held.shape[1], -1, dtype=np.int64)  # a column's place in R, -1: not pre-aggregated
    place[cover.rows] = np.arange(cover.rows.size)
    outside = np.ones(held.shape[0], dtype=bool)
    outside[cover.columns] = False
    row_of_entry = entry_rows(held.indptr)
    keep = np.flatnonzero((place[held.indices] >= 0) & outside[row_of_entry])
    return sp.csr_matrix((held.data[keep], (place[held.indices[keep]], row_of_entry[keep])),
                         shape=(cover.rows.size, held.shape[0]))


def _mates(mate: np.ndarray, size: int) -> np.ndarray:
    """The other side's view of a matching: for each of ``size`` vertices its partner, -1 where none."""
    out = np.full(size, -1, dtype=np.int64)
    matched = mate >= 0
    out[mate[matched]] = np.flatnonzero(matched)
    return out


def _alternating(ptr: np.ndarray, idx: np.ndarray, mate_of_left: np.ndarray,
                 mate_of_right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the unmatched left vertices reach by alternating paths (any edge left -> right, the matched edge
    right -> left), level by level: ``(seen_left, seen_right)`` as masks. ``ptr``/``idx``: the left side's
    adjacency (CSR arrays); ``mate_of_*``: the matched partner, -1 where none."""
    seen_left = mate_of_left < 0
    seen_right = np.zeros(mate_of_right.size, dtype=bool)
    slot = np.empty(mate_of_right.size, dtype=np.int64)  # dedupes a level's new right vertices without a sort
    frontier = np.flatnonzero(seen_left)
    while frontier.size:
        reached = idx[entries_of_rows(ptr, frontier)]
        reached = reached[~seen_right[reached]]
        order = np.arange(reached.size)
        slot[reached] = order
        reached = reached[slot[reached] == order]  # one occurrence of each (the last)
        seen_right[reached] = True
        left = mate_of_right[reached]
        left = left[left >= 0]
        left = left[~seen_left[left]]
        seen_left[left] = True
        frontier = left
    return seen_left, seen_right


def entries_of_rows(indptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The positions of the stored entries of ``rows`` (in that order) in a CSR matrix with pointers ``indptr``:
    the concatenated ranges ``indptr[r]:indptr[r + 1]``, without a Python loop."""
    starts = indptr[rows]
    lengths = indptr[rows + 1] - starts
    firsts = np.cumsum(lengths) - lengths  # where each row's entries begin in the output
    return np.repeat(starts - firsts, lengths) + np.arange(int(lengths.sum()))


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


def block_checksum(block: sp.csr_matrix) -> tuple[int, int]:
    """``(nnz, sum of value bits)`` of a block's stored entries: equal for a block and its transpose, a cheap
    test before :func:`block_fingerprint` (most unequal blocks already differ here). Wrapping uint64, as int64."""
    bits = np.ascontiguousarray(block.data, dtype=np.float64).view(np.uint64)
    total = np.uint64(bits.sum(dtype=np.uint64)) if bits.size else np.uint64(0)
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
