"""Water-filling: the per-entry keep probabilities that minimise a sampled sum's variance under a budget.

The closed form of PSC-GCN's Theorem 2, shared by the ``psc`` sampler (per edge, :mod:`algorithms.policies.psc`) and
the ``dgs`` sampler (per node and per feature column, :mod:`algorithms.policies.dgs`). Pure numpy; imports no policy.
"""

from __future__ import annotations

import numpy as np

from sparse_dist.csr import entry_rows

FLOOR = 1e-3  # an entry's importance is at least this share of its row's mean: every p > 0 (unbiased)


def water_fill(indptr: np.ndarray, importance: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Per-entry ``p`` minimising ``sum v^2 / p`` per row subject to ``sum p = budget[row]``, ``0 < p <= 1``.

    ``indptr``: CSR row pointers of the entries; ``importance``: ``v >= 0`` per entry; ``budget``: ``B`` per
    row. A row whose budget covers all its entries keeps them all; a row of zero importance spreads its
    budget evenly. Vectorised over rows (one sort of all entries).
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    counts = np.diff(indptr)
    rows = entry_rows(indptr)
    v = np.asarray(importance, dtype=np.float64)
    p = np.ones(v.size)
    if v.size == 0:
        return p
    mean = np.bincount(rows, weights=v, minlength=counts.size) / np.maximum(counts, 1)
    v = np.where(mean[rows] > 0, np.maximum(v, FLOOR * mean[rows]), 1.0)  # zero rows: uniform
    b = np.minimum(np.asarray(budget, dtype=np.float64), counts)
    order = np.lexsort((-v, rows))                # by row, then importance descending (rows stay in place)
    vs = v[order]
    position = np.arange(v.size) - indptr[rows]
    before = np.concatenate(([0.0], np.cumsum(vs)))  # before[x] = sum of vs[:x]
    suffix = before[indptr[1:]][rows] - before[:-1]  # this entry and the smaller ones of its row
    # with the `position` largest capped at 1, entry `position` is the first uncapped: valid if its p <= 1
    left = b[rows] - position
    valid = (left > 0) & (left * vs <= suffix * (1 + 1e-12))
    first = np.full(counts.size, np.iinfo(np.int64).max)
    np.minimum.at(first, rows[valid], position[valid])
    capped = np.minimum(first, counts)            # rows without a valid split keep everything
    m = capped[rows]
    at_split = position == m
    s_m_row = np.zeros(counts.size)
    s_m_row[rows[at_split]] = suffix[at_split]
    s_m = s_m_row[rows]
    share = np.divide((b[rows] - m) * vs, s_m, out=np.ones(v.size), where=s_m > 0)
    ps = np.where(position < m, 1.0, np.minimum(share, 1.0))
    p[order] = ps
    return np.where(counts[rows] <= b[rows], 1.0, p)
