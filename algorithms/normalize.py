"""Adjacency normalisation as pure functions of a rank's rows (plus its neighbours' degrees).

* GCN (Kipf & Welling): ``Â = D^-1/2 (A + I) D^-1/2`` where the self-loops are
  "remaining" ones (a node that already has a self-loop keeps its weight,
  every other node gets weight 1) and ``D`` holds the ROW sums of ``A + I``.
  For symmetric ``A`` row and column sums agree; for a directed graph the row
  sum (the number of sources a row aggregates from) is used on both sides.
* GraphSAGE-mean: ``D^-1 A`` with row sums of ``A`` (no self-loops; a row
  without neighbours stays zero).

The same functions serve one rank or many: the only non-local input, the
degrees of the columns a rank touches, is pulled from their owners
(:class:`sparse_dist.pull.Pull`, phase ``other``), so the result does not
depend on the number of ranks.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.comm import Communicator
from sparse_dist.csr import distinct_ids_and_positions, entry_rows
from sparse_dist.layout import RowLayout
from sparse_dist.pull import Pull


def add_remaining_self_loops(rows: sp.csr_matrix, first_row: int) -> sp.csr_matrix:
    """``rows`` (global column ids, row ``k`` is node ``first_row + k``) with a self-loop on every row."""
    rows = sp.csr_matrix(rows, dtype=np.float64)
    rows.sum_duplicates()
    n = rows.shape[0]
    row_ids = entry_rows(rows.indptr)
    has_loop = np.zeros(n, dtype=bool)
    has_loop[row_ids[rows.indices == row_ids + first_row]] = True
    missing = np.flatnonzero(~has_loop)
    loops = sp.csr_matrix((np.ones(missing.size), (missing, missing + first_row)), shape=rows.shape)
    result = sp.csr_matrix(rows + loops)
    result.sort_indices()
    return result


def scale_symmetric(rows: sp.csr_matrix, row_scale: np.ndarray, column_scale_of_entry: np.ndarray) -> sp.csr_matrix:
    """``diag(row_scale) @ rows`` with entry ``e`` further multiplied by ``column_scale_of_entry[e]``.

    Each entry is ``a * (s_row * s_col)``: the product of the two scales is commutative, so a
    symmetric ``A`` gives a bitwise symmetric result (the SpMM then needs no stored transpose).
    """
    out = sp.csr_matrix(rows, copy=True)
    out.data = out.data * (np.repeat(row_scale, np.diff(out.indptr)) * column_scale_of_entry)
    return out


def inverse_sqrt(values: np.ndarray) -> np.ndarray:
    """``values ** -1/2`` with 0 where the value is 0 (isolated nodes stay zero)."""
    out = np.zeros_like(values, dtype=np.float64)
    positive = values > 0
    out[positive] = values[positive] ** -0.5
    return out


def gcn_normalize(comm: Communicator, layout: RowLayout, rows: sp.csr_matrix, group: int) -> sp.csr_matrix:
    """GCN ``Â`` rows of row group ``group`` (collective over ``comm``, one rank per group: rank ``group``)."""
    first_row = layout.offsets[group]
    with_loops = add_remaining_self_loops(rows, first_row)
    degree_inv_sqrt = inverse_sqrt(np.asarray(with_loops.sum(axis=1)).ravel())
    columns, inverse = distinct_ids_and_positions(with_loops.indices, layout.n_rows)
    column_scale = Pull(comm, layout, columns, "other").rows(torch.from_numpy(degree_inv_sqrt)).numpy()
    return scale_symmetric(with_loops, degree_inv_sqrt, column_scale[inverse])


def mean_normalize(rows: sp.csr_matrix) -> sp.csr_matrix:
    """GraphSAGE-mean ``D^-1 A`` (purely local)."""
    rows = sp.csr_matrix(rows, dtype=np.float64)
    rows.sum_duplicates()
    degree = np.asarray(rows.sum(axis=1)).ravel()
    scale = np.zeros_like(degree)
    scale[degree > 0] = 1.0 / degree[degree > 0]
    return sp.csr_matrix(sp.diags(scale) @ rows)
