"""The compiled per-row neighbour sampler (numba): bitwise :func:`sparse_dist.sampling.sample_rows`.

Contract (the same as the numpy reference's, so blocks are bitwise those of the numpy path): row ``i``
(global id) of degree ``d`` with fanout ``k < d`` keeps the ``k`` entries with the smallest
``splitmix64(splitmix64(i ^ key) ^ column)`` (ties, which only a duplicated column can make, go to the
earlier stored entry, as the reference's stable ``lexsort`` does), in storage order, each value (as float64)
multiplied by ``d / k``; a row with ``d <= k``, or fanout ``None``, keeps every entry as it is.

How: the reference hashes every candidate entry of a hop and orders the whole hop with one ``lexsort``
(``O(E log E)`` in numpy, one thread). Here each row is a partial selection: one pass over its ``d``
entries keeps the ``k`` smallest hashes in a sorted buffer of ``k`` (an entry is compared with the
buffer's largest first, so most are rejected in one comparison; expected ``O(d + k^2 log(d/k))``), then the
``k`` positions are sorted back into storage order. Rows are independent: the output offsets are known
before sampling (``min(d, k)`` per row), and chunks of rows run in parallel (``numba.prange``) over
``threads`` numba threads, set on the calling thread before every call (numba's thread count is per
thread: the prefetch worker gets the same count as the main thread).

:func:`block_columns_compiled` does the requester's side of a hop in the same spirit: the block's source ids
(destinations first, then the new ids in increasing order) and each entry's column position, in linear
passes over a mark per global id instead of numpy's ``setdiff1d`` and ``searchsorted`` (bitwise the same).

Compilation: :func:`warm_up` compiles the kernels for the dtypes of the rank's rows (scipy keeps int32 or
int64 indices; float32 or float64 values) when the sampler is built, so no JIT lands in a timed epoch.
``cache=True``: compiled code is kept in numba's cache (``__pycache__`` beside this file, or numba's user
cache directory when that is not writable, or ``NUMBA_CACHE_DIR`` when set), so a later process loads it
in a fraction of a second. Every MPI rank imports numba and may compile at the same moment: numba writes
each cache file to a unique temporary name and renames it into place (atomic on a POSIX file system), so
concurrent writers cannot leave a torn file; the worst a race does is drop one of two index entries, and
the next process compiles again. Tested with two ranks on an empty cache directory.

Threads: one thread of a process samples at a time (the main thread, or the prefetch worker while an
epoch trains), which every numba threading layer allows (``workqueue``, the fallback where neither OpenMP
nor TBB loads, forbids only concurrent launches). The layer is ``workqueue`` unless ``NUMBA_THREADING_LAYER``
says otherwise: numba's default picks OpenMP, whose idle pool threads spin after each kernel and take the
cores from the training step beside them (200k synthetic, P = 2 on two cores: the step's compute 15.2 s an
epoch with the OpenMP pool, 8.2 s with ``workqueue``, 7.5 s with one numba thread).

Pure (no communication). numba is a dependency of the package; where it cannot be imported,
:func:`sparse_dist.sampling.resolve_sampler` falls back to the numpy reference (said once in the log).
"""

from __future__ import annotations

import os

import numba
import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from sparse_dist.splitmix import GOLDEN, MIX1, MIX2

if "NUMBA_THREADING_LAYER" not in os.environ:  # before any parallel kernel runs (the module docstring)
    numba.config.THREADING_LAYER = "workqueue"

__all__ = ["ROWS_PER_CHUNK", "block_columns_compiled", "sample_rows_compiled", "set_threads", "warm_up"]

ROWS_PER_CHUNK = 64  # rows one parallel task samples with one scratch buffer (amortises its allocation)

_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


@njit(cache=True, inline="always")
def _mix(z: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """splitmix64's finaliser on one uint64 (wrapping), as :func:`sparse_dist.splitmix.splitmix64`."""
    z = z + GOLDEN
    z = (z ^ (z >> _S30)) * MIX1
    z = (z ^ (z >> _S27)) * MIX2
    return z ^ (z >> _S31)


@njit(cache=True, parallel=True, nogil=True)
def _sample_kernel(indptr, indices, data, local, wanted, key, fanout, offsets,
                   out_columns, out_values):  # pragma: no cover - compiled
    """Fill ``out_columns``/``out_values`` from ``offsets[i]`` on with row ``local[i]``'s kept entries."""
    n = local.size
    chunks = (n + ROWS_PER_CHUNK - 1) // ROWS_PER_CHUNK
    for chunk in prange(chunks):
        best_hash = np.empty(max(fanout, 1), dtype=np.uint64)
        best_pos = np.empty(max(fanout, 1), dtype=np.int64)
        for i in range(chunk * ROWS_PER_CHUNK, min(n, (chunk + 1) * ROWS_PER_CHUNK)):
            start = np.int64(indptr[local[i]])
            degree = np.int64(indptr[local[i] + 1]) - start
            out = offsets[i]
            if degree <= fanout:
                for e in range(degree):
                    out_columns[out + e] = indices[start + e]
                    out_values[out + e] = np.float64(data[start + e])
                continue
            node = _mix(np.uint64(wanted[i]) ^ key)
            count = 0
            for e in range(degree):
                h = _mix(node ^ np.uint64(indices[start + e]))
                if count == fanout:
                    if h >= best_hash[fanout - 1]:
                        continue  # not among the k smallest (an equal hash stored earlier ranks first)
                    j = fanout - 1
                else:
                    j = count
                    count += 1
                while j > 0 and best_hash[j - 1] > h:  # insertion into the sorted buffer
                    best_hash[j] = best_hash[j - 1]
                    best_pos[j] = best_pos[j - 1]
                    j -= 1
                best_hash[j] = h
                best_pos[j] = e
            for a in range(1, fanout):  # the k positions back into storage order
                p = best_pos[a]
                b = a
                while b > 0 and best_pos[b - 1] > p:
                    best_pos[b] = best_pos[b - 1]
                    b -= 1
                best_pos[b] = p
            scale = degree / fanout
            for j in range(fanout):
                e = start + best_pos[j]
                out_columns[out + j] = indices[e]
                out_values[out + j] = np.float64(data[e]) * scale


@njit(cache=True, nogil=True)
def _block_columns_kernel(dst, columns, n_global):  # pragma: no cover - compiled
    """``src`` (``dst``, then the other ids of ``columns`` once each, increasing) and each column's position
    in it; a mark per global id (0: unseen, -1: new, else position + 1)."""
    mark = np.zeros(n_global, dtype=np.int64)
    for i in range(dst.size):
        mark[dst[i]] = i + 1
    new = np.empty(columns.size, dtype=np.int64)
    count = 0
    for e in range(columns.size):
        if mark[columns[e]] == 0:
            mark[columns[e]] = -1
            new[count] = columns[e]
            count += 1
    new = np.sort(new[:count])
    src = np.empty(dst.size + count, dtype=np.int64)
    src[:dst.size] = dst
    for j in range(count):
        src[dst.size + j] = new[j]
        mark[new[j]] = dst.size + j + 1
    positions = np.empty(columns.size, dtype=np.int64)
    for e in range(columns.size):
        positions[e] = mark[columns[e]] - 1
    return src, positions


def block_columns_compiled(dst: np.ndarray, columns: np.ndarray, n_global: int) -> tuple[np.ndarray, np.ndarray]:
    """A sampled block's source ids and column positions (:func:`sparse_dist.sampling.assemble_block`'s,
    bitwise): ``src`` = ``dst`` (distinct global ids) then the other ids of ``columns`` once each in increasing
    order; ``positions[e]`` = where ``columns[e]`` lies in ``src``. Linear passes and one sort of the new
    ids, with one mark per global id (``n_global`` int64, allocated per call)."""
    return _block_columns_kernel(np.ascontiguousarray(dst, dtype=np.int64),
                                 np.ascontiguousarray(columns, dtype=np.int64), np.int64(n_global))


def set_threads(threads: int) -> None:
    """Run the kernel on ``threads`` numba threads from the calling thread on (at most numba's pool size)."""
    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))


def sample_rows_compiled(rows: sp.csr_matrix, first_row: int, wanted: np.ndarray, fanout: int | None,
                         key: np.ndarray, threads: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`sparse_dist.sampling.sample_rows`, bitwise, compiled (the module docstring): per wanted row
    the number of kept entries, then the kept entries' global column ids (int64) and scaled values
    (float64), rows one after another in ``wanted``'s order."""
    wanted = np.ascontiguousarray(wanted, dtype=np.int64)
    local = wanted - first_row
    indptr = rows.indptr
    degrees = (indptr[local + 1] - indptr[local]).astype(np.int64)
    limit = int(degrees.max(initial=0)) if fanout is None else int(fanout)
    kept = np.minimum(degrees, limit)
    offsets = np.zeros(kept.size, dtype=np.int64)
    np.cumsum(kept[:-1], out=offsets[1:])
    total = int(kept.sum())
    columns, values = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.float64)
    if total == 0:  # no rows, rows of degree 0, or fanout 0 (which the command line refuses)
        return kept, columns, values
    set_threads(threads)
    _sample_kernel(indptr, rows.indices, rows.data, local, wanted, np.uint64(key[0]), np.int64(limit), offsets,
                   columns, values)
    return kept, columns, values


def warm_up(rows: sp.csr_matrix) -> None:
    """Compile (or load from the cache) the kernels for the dtypes of ``rows``, by calls on no rows."""
    empty = np.zeros(0, dtype=np.int64)
    block_columns_compiled(empty, empty, 1)
    _sample_kernel(rows.indptr, rows.indices, rows.data, empty, empty, np.uint64(0), np.int64(1), empty,
                   empty, np.zeros(0, dtype=np.float64))
