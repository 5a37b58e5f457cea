"""Nonzeros per block of the adjacency on a process grid: the load balance of the grid plans (Plexus, CAGNET 2D/3D).

The grid (:mod:`sparse_dist.grid`, read by :mod:`runners.data.grid_reader`) gives each rank a block ``Â[d, o]``
of the written (relabelled) adjacency, rows and columns in the shards' one node order, each dimension cut into
``numpy.array_split``'s near-equal ranges (:func:`sparse_dist.grid.block_range`) whatever the parts; a rank's
SpMM work is its block's nonzeros. For ``R x C`` blocks (``R`` row ranges, ``C`` column ranges) this module
counts each block's entries and reports max / mean over the blocks (1.0 is perfect). Where ``R`` and ``C`` divide
the number of parts of a ``random`` or ``permute`` dataset (equal parts), the blocks are whole parts merged.

Two counts per grid: the stored entries (``A``: what the shards hold, no self-loops for prepare's inputs), and
``A + I``, GCN's operator as the grid reader builds it (a self-loop added on every row without one,
:func:`algorithms.normalize.add_remaining_self_loops`): with one node order for rows and columns the ``n``
self-loops all fall in the blocks that cross the diagonal, ``n / R`` more each on a square grid (R-MAT SCALE 20,
8 x 8: 131,072 against a mean of about 507,000; see :mod:`runners.data.partition` on Plexus's second
permutation, which spreads them).

The counts are gathered one part's rows at a time: :func:`blocks_from_shards` streams the shards (graphs larger
than memory), :func:`blocks_from_partition` takes an in-memory graph and any partitioner's ``part_of``
(``sparse-dist bench partition``), relabelled as ``prepare`` writes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from runners.data.part_checks import STRUCTURE
from runners.data.partition import relabel
from runners.data.shard_reader import read_meta, read_part
from sparse_dist.grid import block_range

GRIDS = ((2, 2), (2, 4), (4, 4), (8, 8))
"""``R x C`` block grids of ``P = 4, 8, 16, 64`` ranks."""


def grid_cuts(n: int, blocks: int) -> np.ndarray:
    """The ``blocks + 1`` boundaries of ``n`` nodes cut as the process grid cuts them."""
    return np.array([block_range(n, blocks, index)[0] for index in range(blocks)] + [n], dtype=np.int64)


class GridBlocks:
    """Entries per block of each ``R x C`` grid over ``n`` nodes, of ``A`` and of ``A + I``, gathered by rows."""

    def __init__(self, n: int, grids: tuple[tuple[int, int], ...] = GRIDS) -> None:
        self.grids = tuple(grids)
        self.cuts = {grid: (grid_cuts(n, grid[0]), grid_cuts(n, grid[1])) for grid in self.grids}
        self.stored = {grid: np.zeros(grid, dtype=np.int64) for grid in self.grids}
        self.loops = {grid: np.zeros(grid, dtype=np.int64) for grid in self.grids}  # self-loops GCN adds

    def _count(self, grid: tuple[int, int], rows: np.ndarray, columns: np.ndarray) -> np.ndarray:
        row_cuts, column_cuts = self.cuts[grid]
        flat = (np.searchsorted(row_cuts[1:], rows, side="right") * grid[1]
                + np.searchsorted(column_cuts[1:], columns, side="right"))
        return np.bincount(flat, minlength=grid[0] * grid[1]).reshape(grid)

    def add_rows(self, row_ids: np.ndarray, indptr: np.ndarray, indices: np.ndarray) -> None:
        """CSR rows of nodes ``row_ids`` (node ids in the written order), column ids in the same order."""
        row_ids = np.asarray(row_ids, dtype=np.int64)
        local = np.repeat(np.arange(row_ids.size), np.diff(indptr))
        rows, columns = row_ids[local], np.asarray(indices, dtype=np.int64)
        has_loop = np.zeros(row_ids.size, dtype=bool)
        has_loop[local[rows == columns]] = True
        missing = row_ids[~has_loop]
        for grid in self.grids:
            self.stored[grid] += self._count(grid, rows, columns)
            self.loops[grid] += self._count(grid, missing, missing)

    def report(self) -> dict[str, Any]:
        """``{"stored": {"RxC": max/mean}, "with_self_loops": {...}}`` (:func:`imbalance` of each grid's counts)."""
        return {"stored": {f"{r}x{c}": imbalance(self.stored[(r, c)]) for r, c in self.grids},
                "with_self_loops": {f"{r}x{c}": imbalance(self.stored[(r, c)] + self.loops[(r, c)])
                                    for r, c in self.grids}}


def imbalance(counts: np.ndarray) -> float | None:
    """Max over mean of ``counts`` (None when all are zero)."""
    mean = float(np.mean(counts))
    return float(np.max(counts)) / mean if mean else None


def blocks_from_shards(data_dir: str | Path, grids: tuple[tuple[int, int], ...] = GRIDS) -> GridBlocks:
    """:class:`GridBlocks` of a prepared dataset, read one part's structure at a time (checked as a run reads it)."""
    data_dir = Path(data_dir)
    meta = read_meta(data_dir)
    offsets = meta["row_offsets"]
    blocks = GridBlocks(int(meta["num_nodes"]), grids)
    for index in range(int(meta["num_parts"])):
        part = read_part(data_dir, meta, index, STRUCTURE)
        blocks.add_rows(np.arange(offsets[index], offsets[index + 1]), part["indptr"], part["indices"])
        del part
    return blocks


def blocks_from_partition(adjacency: sp.spmatrix, part_of: np.ndarray, parts: int,
                          grids: tuple[tuple[int, int], ...] = GRIDS) -> GridBlocks:
    """:class:`GridBlocks` of ``adjacency`` (original ids) relabelled by ``part_of`` as ``prepare`` writes it
    (:func:`runners.data.partition.relabel`)."""
    adjacency = sp.csr_matrix(adjacency)
    order, _ = relabel(np.asarray(part_of, dtype=np.int64), parts)
    new_id = np.empty_like(order)
    new_id[order] = np.arange(order.size)
    blocks = GridBlocks(adjacency.shape[0], grids)
    blocks.add_rows(new_id, adjacency.indptr, new_id[adjacency.indices])
    return blocks


def grid_line(report: dict[str, Any]) -> str:
    """``2x2 1.002 [1.034], ...``: each grid's max/mean of ``A``, of ``A + I`` in brackets."""
    def shown(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"
    return ", ".join(f"{key} {shown(value)} [{shown(report['with_self_loops'][key])}]"
                     for key, value in report["stored"].items())
