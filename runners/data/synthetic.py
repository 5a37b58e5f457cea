"""Synthetic sparse graphs generated row-range by row-range, identical for any rank count.

Rows are produced in fixed chunks of :data:`CHUNK_ROWS`, each from its own
seeded generator, so any rank can generate exactly its own rows ``[start,
stop)`` (no rank ever holds the whole graph) and a single process can
regenerate the same matrix for reference timings.

Graphs (directed, ``degree`` out-edges per row before duplicates merge):

* ``random``: targets uniform over all nodes.
* ``clustered``: nodes form contiguous communities of ``community_size``;
  each edge stays inside its row's community, except with probability
  ``mixing`` it goes to a uniform random node. With contiguous row blocks
  the boundary sets are then small, as after a good (METIS-like) partition.

Values are uniform in ``(0, 1] / degree`` so products keep unit scale.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

CHUNK_ROWS = 1 << 16
GRAPH_KINDS = ("random", "clustered")


def _chunk(kind: str, chunk: int, n_nodes: int, degree: int, seed: int, community_size: int,
           mixing: float) -> tuple[np.ndarray, np.ndarray]:
    """Column ids and values (``rows x degree``) of chunk ``chunk``."""
    rng = np.random.default_rng([seed, chunk])
    first = chunk * CHUNK_ROWS
    rows = np.arange(first, min(first + CHUNK_ROWS, n_nodes), dtype=np.int64)
    if kind == "random":
        cols = rng.integers(0, n_nodes, size=(rows.size, degree), dtype=np.int64)
    elif kind == "clustered":
        base = (rows // community_size) * community_size
        size = np.minimum(community_size, n_nodes - base)
        inside = base[:, None] + (rng.random((rows.size, degree)) * size[:, None]).astype(np.int64)
        outside = rng.integers(0, n_nodes, size=(rows.size, degree), dtype=np.int64)
        cols = np.where(rng.random((rows.size, degree)) < mixing, outside, inside)
    else:
        raise ValueError(f"unknown synthetic graph kind {kind!r}; expected one of {GRAPH_KINDS}")
    values = (1.0 - rng.random((rows.size, degree))) / degree
    return cols, values


def synthetic_rows(kind: str, start: int, stop: int, n_nodes: int, degree: int, *, seed: int = 0,
                   community_size: int = 1000, mixing: float = 0.01) -> sp.csr_matrix:
    """Rows ``[start, stop)`` of the ``n_nodes x n_nodes`` synthetic matrix (global column ids)."""
    if not 0 <= start <= stop <= n_nodes:
        raise ValueError(f"row range [{start}, {stop}) is outside [0, {n_nodes})")
    if degree < 1 or community_size < 1 or not 0.0 <= mixing <= 1.0:
        raise ValueError(f"need degree >= 1, community_size >= 1, 0 <= mixing <= 1; "
                         f"got {degree=}, {community_size=}, {mixing=}")
    n_rows = stop - start
    if n_rows == 0:
        return sp.csr_matrix((0, n_nodes))
    col_parts, value_parts = [], []
    for chunk in range(start // CHUNK_ROWS, (stop - 1) // CHUNK_ROWS + 1):
        cols, values = _chunk(kind, chunk, n_nodes, degree, seed, community_size, mixing)
        first = chunk * CHUNK_ROWS
        lo, hi = max(start - first, 0), min(stop - first, cols.shape[0])
        col_parts.append(cols[lo:hi].ravel())
        value_parts.append(values[lo:hi].ravel())
    indptr = np.arange(0, n_rows * degree + 1, degree, dtype=np.int64)
    matrix = sp.csr_matrix((np.concatenate(value_parts), np.concatenate(col_parts), indptr),
                           shape=(n_rows, n_nodes))
    matrix.sum_duplicates()
    return matrix
