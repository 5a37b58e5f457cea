"""Workloads of the performance model: what each row group multiplies and exchanges, per row group.

**Workload** (:class:`Workload`): rows, nonzeros (local / remote columns)
and the boundary matrix ``|B_ij|`` per row group. Either measured exactly
from a prepared dataset (:func:`workload_from_shards`, merging shards as a
run would) or expected values for a partition model
(:func:`workload_analytic`): every node has the graph's mean degree ``d``
and each neighbour lies outside its part with probability ``cut``, spread
evenly over ``k`` neighbouring parts (``random``: ``cut = (P-1)/P``,
``k = P-1``). Then ``E|B_ij| = n_j (1 - (1 - cut/k)^d)`` for a neighbouring
part and ``E|B_j| = n_j (1 - (1 - cut)^d)``; because ``1 - (1-q)^d`` is
concave in ``d``, a skewed degree distribution gives fewer boundary rows,
so this is an upper estimate. The ``cover`` plan's rows per pair depend on the graph itself (a minimum
vertex cover of each block, :func:`pair_counts`), so it is priced from shards only
(``workload_from_shards(..., covers=True)``); an analytic workload refuses it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from runners.data.partition import BoundaryAccumulator
from runners.data.part_checks import STRUCTURE
from runners.data.shards import ShardError, read_meta, read_part
from sparse_dist.cover_sets import konig_cover
from sparse_dist.csr import entry_rows
from sparse_dist.layout import RowLayout
from sparse_dist.plans import plan_class


@dataclass
class Workload:
    """Per row group: rows, nonzeros with local / remote columns, and ``|B_ij|``, ``|B_j|``."""

    name: str
    rows: np.ndarray
    nnz_local: np.ndarray
    nnz_remote: np.ndarray
    boundary: np.ndarray            # G x G, boundary[i, j] = |B_ij| (expected values allowed)
    union: np.ndarray               # |B_j|
    exact: bool = True
    notes: list[str] = field(default_factory=list)
    cover: np.ndarray | None = None  # G x G, |C_ij| + |R_ij| of the cover plan (from shards only, where asked)

    def pairs_for(self, plan: str) -> np.ndarray | None:
        """The rows per pair a ``pair_counted`` plan's byte model needs (None for the others)."""
        if not plan_class(plan).pair_counted:
            return None
        if self.cover is None:
            raise ValueError(f"{self.name}: the {plan} plan's bytes depend on the graph's covers; they are known "
                             f"only for a prepared dataset (workload_from_shards(..., covers=True))")
        return self.cover

    @property
    def groups(self) -> int:
        return int(self.rows.size)


def _merged_groups(data_dir: Path, groups: int) -> tuple[dict, int, np.ndarray]:
    """A prepared dataset's meta, its parts per row group and the groups' first rows (``groups + 1``)."""
    meta = read_meta(data_dir)
    if meta["num_parts"] % groups:
        raise ShardError(f"{data_dir}: {meta['num_parts']} parts cannot be merged into {groups} row groups (P / c "
                         f"must divide the parts; prepare it with --parts {groups} or a multiple)")
    per_group = meta["num_parts"] // groups
    return meta, per_group, np.asarray(meta["row_offsets"][::per_group], dtype=np.int64)


def entry_counts(indices: np.ndarray, indptr: np.ndarray, first_row: int, lo: int, hi: int,
                 self_loops: bool = True) -> tuple[int, int]:
    """``(local, remote)`` entries of CSR rows numbered from ``first_row`` (global column ids ``indices``): those
    whose column lies in ``[lo, hi)``, plus a self-loop for every row that lacks one (``self_loops``: what GCN's
    normalisation adds), and the others."""
    indices = np.asarray(indices, dtype=np.int64)
    inside = (indices >= lo) & (indices < hi)
    missing = 0
    if self_loops:
        rows_of = np.repeat(np.arange(indptr.size - 1, dtype=np.int64) + first_row, np.diff(indptr))
        missing = indptr.size - 1 - int(np.unique(rows_of[indices == rows_of]).size)
    return int(inside.sum()) + missing, int((~inside).sum())


def workload_from_shards(data_dir: str | Path, groups: int, self_loops: bool = True,
                         covers: bool = False) -> Workload:
    """Exact statistics of a prepared dataset run on ``groups`` row groups (its shards merged as a run does);
    ``covers``: also the cover plan's rows per pair (:func:`pair_counts`, a matching per pair)."""
    data_dir = Path(data_dir)
    meta, per_group, offsets = _merged_groups(data_dir, groups)
    accumulator = BoundaryAccumulator(offsets)
    nnz_local = np.zeros(groups, dtype=np.int64)
    nnz_remote = np.zeros(groups, dtype=np.int64)
    for g in range(groups):
        columns = []
        for index in range(g * per_group, (g + 1) * per_group):
            part = read_part(data_dir, meta, index, STRUCTURE)
            indices, indptr = part["indices"].astype(np.int64), part["indptr"]
            local, remote = entry_counts(indices, indptr, int(meta["row_offsets"][index]), int(offsets[g]),
                                         int(offsets[g + 1]), self_loops)
            nnz_local[g] += local
            nnz_remote[g] += remote
            columns.append(indices)
        merged = np.concatenate(columns) if columns else np.empty(0, np.int64)
        accumulator.add_part(g, merged, 0)
    union = np.bincount(accumulator._owner(np.flatnonzero(accumulator.needed)), minlength=groups)
    cover = pair_counts(data_dir, groups).cover if covers else None
    return Workload(meta["name"], np.diff(offsets), nnz_local, nnz_remote, accumulator.counts.copy(), union,
                    cover=cover)


# ---------------------------------------------------------------- the cover plan's pairs (single process)
# Per pair of row groups: |B_ij| (p2p's rows) and the cover's |C_ij| + |R_ij| (sparse_dist.cover_sets), one row
# group's rows in memory at a time; the input of the cover plan's byte model here and in ``sparse-dist cost bytes``.

@dataclass
class PairCounts:
    """``boundary[i, j] = |B_ij|`` (p2p's rows) and ``cover[i, j] = |C_ij| + |R_ij|`` of one partition."""

    layout: RowLayout
    boundary: np.ndarray
    cover: np.ndarray
    pre_aggregated: np.ndarray  # |R_ij|: rows sent as partial sums
    seconds: float              # covers' (matchings') time on this process


def _group_rows(data_dir: Path, meta: dict, first: int, last: int) -> sp.csr_matrix:
    """Parts ``first..last-1`` stacked: their CSR rows with global column ids."""
    pieces = []
    for index in range(first, last):
        part = read_part(data_dir, meta, index, STRUCTURE)
        indptr, indices = part["indptr"], part["indices"].astype(np.int64)
        pieces.append(sp.csr_matrix((np.ones(indices.size), indices, indptr),
                                    shape=(indptr.size - 1, int(meta["num_nodes"]))))
    return sp.vstack(pieces, format="csr") if pieces else sp.csr_matrix((0, int(meta["num_nodes"])))


def pair_counts(data_dir: str | Path, groups: int) -> PairCounts:
    """Boundary and cover counts of a prepared dataset on ``groups`` row groups (its parts merged)."""
    data_dir = Path(data_dir)
    meta, per_group, offsets = _merged_groups(data_dir, groups)
    layout = RowLayout.from_counts([int(c) for c in np.diff(offsets)])
    boundary = np.zeros((groups, groups), dtype=np.int64)
    cover = np.zeros((groups, groups), dtype=np.int64)
    pre = np.zeros((groups, groups), dtype=np.int64)
    seconds = 0.0
    for g in range(groups):
        rows = _group_rows(data_dir, meta, g * per_group, (g + 1) * per_group)
        owners = np.searchsorted(offsets, rows.indices, side="right") - 1
        row_of_entry = entry_rows(rows.indptr)
        for j in range(groups):
            if j == g:
                continue
            keep = owners == j
            if not keep.any():
                continue
            cols = rows.indices[keep] - offsets[j]
            block = sp.csr_matrix((np.ones(cols.size), (row_of_entry[keep], cols)),
                                  shape=(rows.shape[0], int(offsets[j + 1] - offsets[j])))
            boundary[g, j] = np.unique(cols).size
            began = time.perf_counter()
            found = konig_cover(block)
            seconds += time.perf_counter() - began
            cover[g, j], pre[g, j] = found.size, found.rows.size
    return PairCounts(layout, boundary, cover, pre, seconds)




def workload_analytic(name: str, nodes: int, nnz: int, groups: int, cut: float | None = None,
                      neighbour_parts: int | None = None) -> Workload:
    """Expected statistics of an ``nnz``-entry graph on ``groups`` equal row groups (see the module doc)."""
    rows = np.full(groups, nodes // groups, dtype=np.int64)
    rows[: nodes % groups] += 1
    degree = nnz / nodes
    if cut is None:
        cut = (groups - 1) / groups
    k = min(neighbour_parts or groups - 1, groups - 1)
    boundary = np.zeros((groups, groups))
    union = np.zeros(groups)
    if groups > 1:
        q = cut / k
        reach = 1.0 - (1.0 - q) ** degree
        for i in range(groups):
            for step in range(1, k + 1):
                j = (i + step) % groups
                boundary[i, j] = rows[j] * reach
        union = rows * (1.0 - (1.0 - cut) ** degree)
    remote = np.round(rows * degree * (cut if groups > 1 else 0.0)).astype(np.int64)
    local = np.round(rows * degree).astype(np.int64) - remote + rows
    notes = [f"expected boundary of a partition with edge cut {cut:.3f} over {k} neighbouring part(s), "
             f"every node of mean degree {degree:.1f} (upper estimate)"]
    return Workload(name, rows, local, remote, boundary, union, exact=False, notes=notes)
