"""Rows a rank is asked for, checked against what it owns: the guard both sampler kernels stand on.

A requester names rows by global id; the owner turns them into positions in its block of rows. A negative
position would wrap around to another row in numpy, and the compiled kernel
(:mod:`sparse_dist.sampling_compiled`) reads and writes its arrays unchecked, so every id is checked here
first (one pass over the wanted ids, not over their entries).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["kept_per_row", "owned_local_rows"]


def owned_local_rows(rows: sp.csr_matrix, first_row: int, wanted: np.ndarray) -> np.ndarray:
    """``wanted`` (global ids) as positions in ``rows`` (int64); IndexError if one is not among them (a
    negative position would otherwise wrap around to another row, and the compiled kernel would read and
    write past its arrays)."""
    local = np.asarray(wanted, dtype=np.int64) - first_row
    if local.size and (int(local.min()) < 0 or int(local.max()) >= rows.shape[0]):
        raise IndexError(f"rows asked of this rank must lie in [{first_row}, {first_row + rows.shape[0]}), "
                         f"got ids in [{int(local.min()) + first_row}, {int(local.max()) + first_row}]")
    return local


def kept_per_row(rows: sp.csr_matrix, first_row: int, wanted: np.ndarray, fanout: int | None) -> np.ndarray:
    """How many entries each wanted row (global id, owned) keeps (int64): its degree, at most ``fanout``."""
    local = owned_local_rows(rows, first_row, wanted)
    degrees = (rows.indptr[local + 1] - rows.indptr[local]).astype(np.int64)
    return degrees if fanout is None else np.minimum(degrees, int(fanout))
