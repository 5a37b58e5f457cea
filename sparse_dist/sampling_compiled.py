"""The compiled per-row neighbour sampler (numba): bitwise :func:`sparse_dist.sampling.sample_rows`.

Contract (the same as the numpy reference's, so blocks are bitwise those of the numpy path): row ``i``
(global id) of degree ``d`` with fanout ``k < d`` keeps the entries at the ``k`` positions
:func:`sparse_dist.sampling.floyd_positions` draws from ``splitmix64(i ^ key)`` (Floyd's algorithm: for
``j = d - k .. d - 1``, ``t = min(floor(u (j + 1)), j)`` with ``u`` the top 53 bits of
``splitmix64(splitmix64(i ^ key) ^ j)`` times 2^-53, and ``j`` instead where ``t`` was drawn before), in
storage order, each value (as float64) multiplied by ``d / k``; a row with ``d <= k``, or fanout ``None``,
keeps every entry as it is.

How: per row, ``k`` hashes, each checked against the draws before it (``k^2 / 2`` comparisons of a few
registers) and an insertion sort of ``k`` positions; no pass over the row's ``d`` entries beyond the ``k``
it keeps. Rows are independent: the output offsets are known before sampling (``min(d, k)`` per row), and
chunks of rows run in parallel (``numba.prange``) over ``threads`` numba threads, set on the calling thread
before every call (numba's thread count is per thread: the prefetch worker gets the same count as the main
thread). (The earlier rule, keep the ``k`` entries of smallest hash, hashed every entry of a row and ranked
the candidates under a cut; on the 200k synthetic's rows of degree 29 that was six hashes for each entry
kept at fanout 5.)

:class:`BlockColumns` does the requester's side of a hop in the same spirit: the block's source ids
(destinations first, then the new ids in increasing order) and each entry's column position, in linear
passes over a mark per global id (kept between calls) instead of numpy's ``setdiff1d`` and
``searchsorted`` (bitwise the same); :func:`reorder_rows_compiled` puts answered rows back into the
frontier's order. :func:`sample_rows_into` writes a row set's answer into views of one buffer, so a hop's
answers to every peer are one array with no gathering copy.

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
import threading

import numba
import numpy as np
import scipy.sparse as sp
from numba import njit, prange

from sparse_dist.owned_rows import kept_per_row, owned_local_rows
from sparse_dist.splitmix import GOLDEN, MIX1, MIX2, UNIT

if "NUMBA_THREADING_LAYER" not in os.environ:  # before any parallel kernel runs (the module docstring)
    numba.config.THREADING_LAYER = "workqueue"

__all__ = ["ROWS_PER_CHUNK", "BlockColumns", "block_columns_compiled", "reorder_rows_compiled",
           "sample_rows_compiled", "sample_rows_into", "set_threads", "warm_up"]

ROWS_PER_CHUNK = 64  # rows one parallel task samples with one scratch buffer (amortises its allocation)

_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)


@njit(cache=True, inline="always")
def _mix(z: np.uint64) -> np.uint64:  # pragma: no cover - compiled
    """splitmix64's finaliser on one uint64 (wrapping), as :func:`sparse_dist.splitmix.splitmix64`."""
    z = z + GOLDEN
    z = (z ^ (z >> _S30)) * MIX1
    z = (z ^ (z >> _S27)) * MIX2
    return z ^ (z >> _S31)


@njit(cache=True, parallel=True, nogil=True)
def _sample_kernel(indptr, indices, data, local, wanted, key, fanout, kept, offsets,
                   out_columns, out_values):  # pragma: no cover - compiled
    """Fill ``out_columns``/``out_values`` from ``offsets[i]`` on with row ``local[i]``'s kept entries.
    Returns how many rows' ``kept[i]`` is not ``min(degree, fanout)``; such a row is not written, so no row
    writes outside its own slot ``offsets[i] .. offsets[i] + kept[i]`` (the caller raises where it is not 0).
    One pass: each row is checked as it is sampled (a parallel region costs about 0.3 ms to start under
    ``workqueue``)."""
    n = local.size
    chunks = (n + ROWS_PER_CHUNK - 1) // ROWS_PER_CHUNK
    wrong = 0
    for chunk in prange(chunks):
        first, stop = chunk * ROWS_PER_CHUNK, min(n, (chunk + 1) * ROWS_PER_CHUNK)
        chosen = np.empty(max(fanout, 1), dtype=np.int64)
        for i in range(first, stop):
            start = np.int64(indptr[local[i]])
            degree = np.int64(indptr[local[i] + 1]) - start
            if kept[i] != min(degree, fanout):
                wrong += 1
                continue
            out = offsets[i]
            if degree <= fanout:
                for e in range(degree):
                    out_columns[out + e] = indices[start + e]
                    out_values[out + e] = np.float64(data[start + e])
                continue
            node = _mix(np.uint64(wanted[i]) ^ key)
            for s in range(fanout):  # Floyd: draw t in [0, j]; j itself where t was drawn before
                j = degree - fanout + s
                t = min(np.int64(np.float64(_mix(node ^ np.uint64(j)) >> _S11) * UNIT * np.float64(j + 1)), j)
                seen = False
                for q in range(s):
                    seen |= chosen[q] == t
                chosen[s] = j if seen else t
            for s in range(1, fanout):  # storage order: an insertion sort of ``fanout`` positions
                position = chosen[s]
                q = s
                while q > 0 and chosen[q - 1] > position:
                    chosen[q] = chosen[q - 1]
                    q -= 1
                chosen[q] = position
            scale = degree / fanout
            for s in range(fanout):
                e = start + chosen[s]
                out_columns[out + s] = indices[e]
                out_values[out + s] = np.float64(data[e]) * scale
    return wrong


@njit(cache=True, nogil=True)
def _block_columns_kernel(dst, columns, mark):  # pragma: no cover - compiled
    """``src`` (``dst``, then the other ids of ``columns`` once each, increasing) and each column's position
    in it, of the marks' dtype (int32 below 2^31 ids: the index dtype scipy would convert int64 positions to).
    ``mark`` (one int32 or int64 per global id, all 0 on entry and again on return) holds 0: unseen,
    -1: new, else position + 1. The new ids come out increasing by a scan of the marks where that is cheaper than
    sorting them (many new ids in a small graph), else by a sort."""
    n_global = mark.size
    for ids in (dst, columns):  # every id in range before the first mark is written (marks stay clean)
        for i in range(ids.size):
            if ids[i] < 0 or ids[i] >= n_global:
                raise IndexError("block ids must lie in [0, n_global)")
    for i in range(dst.size):
        mark[dst[i]] = i + 1
    new = np.empty(columns.size, dtype=np.int64)
    count = 0
    for e in range(columns.size):
        if mark[columns[e]] == 0:
            mark[columns[e]] = -1
            new[count] = columns[e]
            count += 1
    if count * 24 > n_global:  # a sort costs about count log count, the scan n_global cheap steps
        count = 0
        for g in range(n_global):
            if mark[g] == -1:
                new[count] = g
                count += 1
    else:
        new[:count] = np.sort(new[:count])
    src = np.empty(dst.size + count, dtype=np.int64)
    src[:dst.size] = dst
    for j in range(count):
        src[dst.size + j] = new[j]
        mark[new[j]] = dst.size + j + 1
    positions = np.empty(columns.size, dtype=mark.dtype)  # a position + 1 fits a mark
    for e in range(columns.size):
        positions[e] = mark[columns[e]] - 1
    for i in range(src.size):  # leave every mark 0 for the next call
        mark[src[i]] = 0
    return src, positions


@njit(cache=True, nogil=True)
def _reorder_kernel(kept, columns, values, new_order):  # pragma: no cover - compiled
    """Rows (counts, columns, values) permuted: input row ``new_order[i]`` comes ``i``-th."""
    starts = np.empty(kept.size, dtype=np.int64)
    total = 0
    for r in range(kept.size):
        starts[r] = total
        total += kept[r]
    out_kept = np.empty(new_order.size, dtype=np.int64)
    out_columns = np.empty(total, dtype=np.int64)
    out_values = np.empty(total, dtype=np.float64)
    j = 0
    for i in range(new_order.size):
        r = new_order[i]
        out_kept[i] = kept[r]
        for e in range(starts[r], starts[r] + kept[r]):
            out_columns[j] = columns[e]
            out_values[j] = values[e]
            j += 1
    return out_kept, out_columns, out_values


class BlockColumns:
    """:func:`sparse_dist.sampling.assemble_block`'s ``block_columns`` for ids below ``n_global``, compiled
    and bitwise numpy's: ``src`` = ``dst`` (distinct global ids) then the other ids of ``columns`` once each
    in increasing order; ``positions[e]`` = where ``columns[e]`` lies in ``src``. Linear passes over one mark
    per global id; the marks (``4 n_global`` bytes, 8 beyond 2^31 ids) are kept between calls (a fresh array
    per call costs page faults on a large graph), one set per thread that calls at the same time."""

    def __init__(self, n_global: int) -> None:
        self.n_global = int(n_global)
        # a mark holds -1, 0 or a position + 1 <= n_global: 4 bytes where that fits (half the cache lines)
        self._mark_dtype = np.int32 if self.n_global < np.iinfo(np.int32).max else np.int64
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def __call__(self, dst: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            mark = self._free.pop() if self._free else np.zeros(self.n_global, dtype=self._mark_dtype)
        try:
            return _block_columns_kernel(np.ascontiguousarray(dst, dtype=np.int64),
                                         np.ascontiguousarray(columns, dtype=np.int64), mark)
        finally:
            with self._lock:
                self._free.append(mark)


def block_columns_compiled(dst: np.ndarray, columns: np.ndarray, n_global: int) -> tuple[np.ndarray, np.ndarray]:
    """:class:`BlockColumns` of ``n_global`` ids, called once (marks allocated for the call)."""
    return BlockColumns(n_global)(dst, columns)


def reorder_rows_compiled(rows: tuple[np.ndarray, np.ndarray, np.ndarray], new_order: np.ndarray) -> tuple[
        np.ndarray, np.ndarray, np.ndarray]:
    """:func:`sparse_dist.sampling.reorder_rows`, bitwise, compiled: input row ``new_order[i]`` comes ``i``-th."""
    kept, columns, values = rows
    return _reorder_kernel(np.ascontiguousarray(kept, dtype=np.int64), np.ascontiguousarray(columns, dtype=np.int64),
                           np.ascontiguousarray(values, dtype=np.float64),
                           np.ascontiguousarray(new_order, dtype=np.int64))


def set_threads(threads: int) -> None:
    """Run the kernel on ``threads`` numba threads from the calling thread on (at most numba's pool size)."""
    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))


def sample_rows_compiled(rows: sp.csr_matrix, first_row: int, wanted: np.ndarray, fanout: int | None,
                         key: np.ndarray, threads: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`sparse_dist.sampling.sample_rows`, bitwise, compiled (the module docstring): per wanted row
    the number of kept entries, then the kept entries' global column ids (int64) and scaled values
    (float64), rows one after another in ``wanted``'s order."""
    kept = kept_per_row(rows, first_row, wanted, fanout)
    total = int(kept.sum())
    columns, values = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.float64)
    sample_rows_into(rows, first_row, wanted, fanout, key, threads, kept, columns, values)
    return kept, columns, values


def sample_rows_into(rows: sp.csr_matrix, first_row: int, wanted: np.ndarray, fanout: int | None,
                     key: np.ndarray, threads: int, kept: np.ndarray, columns: np.ndarray,
                     values: np.ndarray) -> None:
    """:func:`sample_rows_compiled` written into ``columns`` (int64) and ``values`` (float64) of
    ``kept.sum()`` entries each, ``kept`` being each row's kept count (its degree, at most ``fanout``) (views of one answer
    buffer, so that no copy gathers the answer)."""
    wanted = np.ascontiguousarray(wanted, dtype=np.int64)
    local = owned_local_rows(rows, first_row, wanted)  # the kernel reads and writes unchecked: check here
    kept = np.ascontiguousarray(kept, dtype=np.int64)
    total = int(kept.sum())
    if kept.size != wanted.size:
        raise ValueError(f"kept must hold one count per wanted row, got {kept.size} for {wanted.size} rows")
    if columns.size < total or values.size < total:
        raise ValueError(f"columns and values must hold {total} entries, got {columns.size} and {values.size}")
    if total == 0:  # no rows, rows of degree 0, or fanout 0 (which the command line refuses)
        return
    offsets = np.zeros(kept.size, dtype=np.int64)
    np.cumsum(kept[:-1], out=offsets[1:])
    limit = int(kept.max(initial=0)) if fanout is None else int(fanout)  # None keeps every entry: the widest row
    set_threads(threads)
    if _sample_kernel(rows.indptr, rows.indices, rows.data, local, wanted, np.uint64(key[0]),
                      np.int64(limit), kept, offsets, columns, values):
        raise ValueError("kept must be kept_per_row of the wanted rows (the kernel writes that many entries a row)")


def warm_up(rows: sp.csr_matrix) -> None:
    """Compile (or load from the cache) the kernels for the dtypes of ``rows``, by calls on no rows."""
    empty = np.zeros(0, dtype=np.int64)
    block_columns_compiled(empty, empty, 1)
    reorder_rows_compiled((empty, empty, np.zeros(0, dtype=np.float64)), empty)
    _sample_kernel(rows.indptr, rows.indices, rows.data, empty, empty, np.uint64(0), np.int64(1), empty, empty,
                   empty, np.zeros(0, dtype=np.float64))
