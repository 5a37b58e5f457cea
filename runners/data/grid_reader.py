"""This rank's blocks of a prepared dataset for the process grid (:mod:`sparse_dist.grid`), read from the shards.

A rank of the grid needs, per rotation of roles the layers use (at most three), the block ``Â[d, o]`` of the
GCN-normalised adjacency (self-loops added where missing, ``D^-1/2 (A + I) D^-1/2`` with ``D`` the row sums;
for SAGE ``D^-1 A``, each row divided by its whole sum, ``normalization="mean"``),
layer 0's ``X[o, i]`` (rows over ``x``, columns over ``y``; each row normalised by its sum before the columns
are cut), and labels and masks of the last layer's output rows. Rows are the shards' order (parts
concatenated), so the prepared partition is the grid's permutation: ``prepare --partitioner permute`` (a
degree-balanced random permutation, :mod:`runners.data.partition`) spreads the nonzeros evenly over the blocks
(R-MAT SCALE 20: max/mean 1.005-1.019 on 2x2 to 8x8 blocks of ``A``; the self-loops added here land in the
diagonal blocks, 1.037-1.245 with them, docs/guide/partitioning.md).

It reads only the parts that overlap the row ranges it needs, one part at a time, and cuts each part's rows to
its columns before reading the next: the peak is one part's rows beside the block, not the rows' every column.
Each block and each part's features are cast to the run's dtype as soon as they are normalised (in float64),
with int32 indices where they fit, so that :func:`sparse_dist.grid_gcn.as_blocks` shares their arrays.
The column scales of ``Â[d, o]`` are the inverse square roots of the degrees of the nodes of ``o``'s block,
read the same way (their rows' sums). Collective: a problem reading any rank's files
raises the same :class:`~runners.data.shard_reader.ShardError` on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from algorithms.normalize import add_remaining_self_loops, inverse_sqrt, scale_symmetric
from runners.data.shard_reader import ShardError, read_meta, read_part
from sparse_dist.comm import Communicator
from sparse_dist.grid import ProcessGrid, roles


@dataclass
class GridGraph:
    """What one rank of the grid holds of a dataset (module docstring); row ids are the shards' order."""

    adjacency: list[sp.csr_matrix]   # Â[d, o] per rotation (``n_d x n_o``, local column ids), the run's dtype
    features: np.ndarray             # X[o, i] of layer 0, the run's dtype
    labels: np.ndarray               # of the last layer's output rows
    masks: dict[str, np.ndarray]     # train / val / test of those rows
    output_rows: tuple[int, int]
    num_nodes: int
    feature_dim: int
    num_classes: int
    meta: dict[str, Any]


def _parts_of(meta: dict[str, Any], lo: int, hi: int) -> list[int]:
    offsets = meta["row_offsets"]
    return [part for part in range(meta["num_parts"]) if offsets[part] < hi and offsets[part + 1] > lo]


def read_rows(data_dir: Path, meta: dict[str, Any], lo: int, hi: int, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Per-row arrays ``names`` (labels, masks) of rows ``[lo, hi)``, from the parts that overlap them."""
    offsets = meta["row_offsets"]
    pieces: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for part in _parts_of(meta, lo, hi):
        arrays = read_part(data_dir, meta, part, names)
        start, stop = max(lo, offsets[part]) - offsets[part], min(hi, offsets[part + 1]) - offsets[part]
        for name in names:
            pieces[name].append(arrays[name][start:stop])
    return {name: np.concatenate(chunks) if chunks else np.zeros(0) for name, chunks in pieces.items()}


def _rows_with_loops(data_dir: Path, meta: dict[str, Any], lo: int, hi: int, c0: int,
                     c1: int, loops: bool = True) -> tuple[sp.csr_matrix, np.ndarray]:
    """Rows ``[lo, hi)`` of ``A + I`` (self-loops added where missing; ``loops`` False: of ``A``) cut to columns
    ``[c0, c1)`` (local ids), and the rows' whole sums: read one overlapping part at a time, so the peak is one
    part's rows, not the rows' every column."""
    offsets, n = meta["row_offsets"], meta["num_nodes"]
    blocks, sums = [], []
    for part in _parts_of(meta, lo, hi):
        arrays = read_part(data_dir, meta, part, ("indptr", "indices", "data"))
        start, stop = max(lo, offsets[part]) - offsets[part], min(hi, offsets[part + 1]) - offsets[part]
        first = offsets[part] + start
        rows = sp.csr_matrix((arrays["data"], arrays["indices"], arrays["indptr"]),
                             shape=(arrays["indptr"].size - 1, n))[start:stop]
        rows = add_remaining_self_loops(rows, first) if loops else sp.csr_matrix(rows, dtype=np.float64)
        del arrays
        sums.append(np.asarray(rows.sum(axis=1)).ravel())
        blocks.append(sp.csr_matrix(rows[:, c0:c1]))
    if not blocks:
        return sp.csr_matrix((0, c1 - c0)), np.zeros(0)
    return sp.csr_matrix(sp.vstack(blocks)), np.concatenate(sums)


def _degree_inv_sqrt(data_dir: Path, meta: dict[str, Any], lo: int, hi: int) -> np.ndarray:
    """``(row sum of A + I)^-1/2`` of nodes ``[lo, hi)`` (self-loops added where missing)."""
    return inverse_sqrt(_rows_with_loops(data_dir, meta, lo, hi, 0, 0)[1])


def _features(data_dir: Path, meta: dict[str, Any], lo: int, hi: int, f0: int, f1: int,
              dtype: np.dtype) -> np.ndarray:
    """Rows ``[lo, hi)`` of ``X`` divided by their whole sums (0 where a row sums to 0, in float64), columns
    ``[f0, f1)``, as ``dtype``: one part's rows at a time."""
    offsets = meta["row_offsets"]
    pieces = []
    for part in _parts_of(meta, lo, hi):
        features = read_part(data_dir, meta, part, ("features",))["features"]
        start, stop = max(lo, offsets[part]) - offsets[part], min(hi, offsets[part + 1]) - offsets[part]
        rows = features[start:stop]
        sums = rows.sum(axis=1, dtype=np.float64)
        kept = rows[:, f0:f1].astype(np.float64)
        np.divide(kept, sums[:, None], out=kept, where=sums[:, None] != 0)
        kept[sums == 0] = 0.0
        pieces.append(kept.astype(dtype, copy=False))
    return np.concatenate(pieces) if pieces else np.zeros((0, f1 - f0), dtype=dtype)


def _compact(block: sp.csr_matrix, dtype: np.dtype) -> sp.csr_matrix:
    """``block`` with ``dtype`` values and int32 indices where they fit (what torch's CSR takes without a copy)."""
    index = np.int32 if max(block.nnz, *block.shape) < 2**31 - 1 else np.int64
    return sp.csr_matrix((block.data.astype(dtype, copy=False), block.indices.astype(index, copy=False),
                          block.indptr.astype(index, copy=False)), shape=block.shape, copy=False)


NORMALIZATIONS = ("symmetric", "mean")
"""How a layer kind normalises ``A``: GCN's ``D^-1/2 (A + I) D^-1/2`` (``symmetric``), SAGE's ``D^-1 A``
(``mean``: no self-loops, rows without neighbours stay 0)."""


def read_meta_everywhere(comm: Communicator, data_dir: str | Path) -> dict[str, Any]:
    """``meta.json`` read on every rank; a problem on any rank is the same :class:`ShardError` on every rank
    (collective)."""
    meta, error = None, None
    try:
        meta = read_meta(data_dir)
    except ShardError as exc:
        error = str(exc)
    comm.raise_if_any(error, ShardError)
    assert meta is not None
    return meta


def load_grid_graph(comm: Communicator, grid: ProcessGrid, data_dir: str | Path, layers: int,
                    dtype: np.dtype | type = np.float64, normalization: str = "symmetric") -> GridGraph:
    """This rank's :class:`GridGraph` for a model of ``layers`` layers whose adjacency is normalised as
    ``normalization`` says (:data:`NORMALIZATIONS`), blocks and features as ``dtype`` (collective validation over
    ``comm``)."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    data_dir = Path(data_dir)
    error: str | None = None
    graph: GridGraph | None = None
    try:
        graph = _load(grid, data_dir, layers, np.dtype(dtype), normalization)
    except ShardError as exc:
        error = str(exc)
    comm.raise_if_any(error, ShardError)
    assert graph is not None
    return graph


def _load(grid: ProcessGrid, data_dir: Path, layers: int, dtype: np.dtype, normalization: str) -> GridGraph:
    meta = read_meta(data_dir)
    n = meta["num_nodes"]
    scales: dict[tuple[int, int], np.ndarray] = {}
    blocks = []
    for layer in range(min(layers, 3)):
        outer, _, depth = roles(layer)
        (r0, r1), (c0, c1) = grid.block(n, depth), grid.block(n, outer)
        if normalization == "mean":
            rows, sums = _rows_with_loops(data_dir, meta, r0, r1, c0, c1, loops=False)
            inverse = np.divide(1.0, sums, out=np.zeros_like(sums), where=sums > 0)
            blocks.append(_compact(sp.csr_matrix(sp.diags(inverse) @ rows), dtype))
            continue
        rows, sums = _rows_with_loops(data_dir, meta, r0, r1, c0, c1)
        scales.setdefault((r0, r1), inverse_sqrt(sums))  # a row range's degrees serve it as columns too
        if (c0, c1) not in scales:
            scales[(c0, c1)] = _degree_inv_sqrt(data_dir, meta, c0, c1)
        blocks.append(_compact(scale_symmetric(rows, scales[(r0, r1)], scales[(c0, c1)][rows.indices]), dtype))
        del rows
    outer, inner, _ = roles(0)
    (x0, x1), (f0, f1) = grid.block(n, outer), grid.block(meta["feature_dim"], inner)
    features = _features(data_dir, meta, x0, x1, f0, f1, dtype)
    o0, o1 = grid.block(n, roles(layers - 1)[2])
    labelled = read_rows(data_dir, meta, o0, o1, ("labels", "train", "val", "test"))
    return GridGraph(adjacency=blocks, features=np.ascontiguousarray(features), labels=labelled["labels"],
                     masks={split: labelled[split].astype(bool) for split in ("train", "val", "test")},
                     output_rows=(o0, o1), num_nodes=n, feature_dim=meta["feature_dim"],
                     num_classes=meta["num_classes"], meta=meta)
