"""Host memory: freed memory kept for reuse, and what the process does with transparent huge pages.

Why: an epoch allocates and frees tensors of the same large sizes over and
over (activations, gradients, SpMM outputs: 100 MB each at 200k rows x 128
columns). glibc hands each one back to the kernel when it is freed (they lie
above its mmap threshold), so every epoch page-faults all of them in again,
4 KiB at a time: on this project's 2-core test machine a fresh 100 MB
result cost 20-70 ms where a write into a warm one took 6 ms.

PyTorch's own switch ``THP_MEM_ALLOC_ENABLE=1`` makes its CPU allocator
align large blocks to 2 MiB and ask for transparent huge pages
(``madvise(MADV_HUGEPAGE)``), so a 100 MB tensor is faulted in with about
50 faults instead of 25,000. ``sparse-dist`` leaves it at torch's default
(off); a user sets it before the launch (it is read at torch's first CPU
allocation). It was the entry point's default until measured against: on the
2-core test machine (2026-12-05; its kernel pages cold memory out, DAMON's
``pageout``, and its THP defrag is ``madvise``) the 200k synthetic at P = 2
(psc with adaptive widths, field evaluations, 12 epochs, two interleaved
pairs) reached its first row in 8.4-8.8 s without huge pages against
13.6-15.6 s with them, and ended in 21.0-24.6 s against 31.6-34.0 s, with
2.9-6.6 s of system time against 12.3-14.0 s, whether freed memory was kept
or not. ``huge_page_state`` reports the choice in every results file.

Fewer faults still zero every page: over an emulated 1 Gbit/s network (200k
synthetic, P = 2, ``pipe:tau=1``) the kernel's page clearing was a tenth of
all CPU samples. ``SPARSE_DIST_FREED_MEMORY=keep`` makes the trainer, once
its set-up is done, tell glibc never to return freed memory to the kernel
(:func:`keep_freed_memory`: ``mallopt``, no ``mmap`` for large blocks, no
trimming of the heap), so an epoch reuses the pages the last one freed: that
pipe epoch fell from 1.03-1.05 s to 0.70-0.75 s and its system time from
0.34-0.48 s to 0.15-0.21 s. It is not the default because the heap then keeps
its peak and fragments: the resident set of a rank rose from 1.35-1.39 GiB to
1.66-1.70 GiB after 5 epochs and went on growing by a 50 MB block now and
then, to 1.81-2.18 GiB after 90 epochs. A job with memory to spare turns it
on; a C library without ``mallopt`` (not glibc) is left alone.

Kept memory is reused only by threads that allocate from the heap that kept
it. glibc gives every further thread that allocates an arena of its own, whose
blocks are trimmed and mapped afresh whatever the settings above: an exact
evaluation run beside a step in a helper thread (``--overlap-evaluation``)
page-faulted its 300 MB of layer outputs in again every time (from the
receptive field, 200k synthetic, P = 2: 1.6-2.5 s with 1.3-2.1 s of system
time, against 0.26 s from the main heap). So with ``keep`` every thread
allocates from the main heap (``M_ARENA_MAX`` = 1; the helper and the step
take turns, they never allocate at once). glibc fixes its arena limit when a
second thread first allocates, so :func:`one_heap_where_kept` sets it at the
entry point, before torch starts any thread; :func:`keep_freed_memory` sets
it again for library callers, where it holds if no second thread has
allocated yet.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable

from sparse_dist.log import get_logger

VARIABLE = "THP_MEM_ALLOC_ENABLE"
FREED_VARIABLE = "SPARSE_DIST_FREED_MEMORY"  # keep, or release (the default)
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8  # glibc's mallopt parameters (malloc.h)
_kept = False
_one_heap = False
_log = get_logger(__name__)
_KERNEL_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def _mallopt() -> Callable[[int, int], int] | None:
    """The C library's ``mallopt``, or None where it has none (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt


def one_heap_where_kept() -> bool:
    """Where ``SPARSE_DIST_FREED_MEMORY=keep``: every thread allocates from the main heap (module docstring);
    True when set. Call before any second thread allocates (the entry point does, before torch is imported)."""
    global _one_heap
    if os.environ.get(FREED_VARIABLE, "release") != "keep":
        return False
    mallopt = _mallopt()
    _one_heap = _one_heap or (mallopt is not None and mallopt(_M_ARENA_MAX, 1) == 1)
    return _one_heap


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse where ``SPARSE_DIST_FREED_MEMORY=keep`` (see the module
    docstring); True when it now does. Rank-local; the trainer calls it once its set-up is done."""
    global _kept
    choice = os.environ.get(FREED_VARIABLE, "release")
    if choice not in ("keep", "release"):
        _log.warning("%s=%r is neither keep nor release: freed memory is returned (the default)", FREED_VARIABLE,
                     choice)
    if choice != "keep":
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    _kept = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    one_heap_where_kept()  # holds where no second thread has allocated yet (a library caller)
    return _kept


def freed_memory_state() -> str:
    """Whether freed memory is kept or returned, for results files (rank-local)."""
    if _kept:
        return f"kept for reuse ({FREED_VARIABLE}=keep: no mmap, no trim{', one heap' if _one_heap else ''})"
    if os.environ.get(FREED_VARIABLE, "release") == "keep":
        return f"returned to the kernel ({FREED_VARIABLE}=keep, but this C library has no mallopt)"
    return "returned to the kernel (the default)"


def huge_page_state() -> str:
    """What this process does, for results files and reports (rank-local, no communication)."""
    requested = os.environ.get(VARIABLE, "0") not in ("", "0")
    try:
        with open(_KERNEL_SETTING) as handle:
            kernel = handle.read().strip()
    except OSError:
        kernel = "unknown"
    mode = kernel[kernel.find("[") + 1:kernel.find("]")] if "[" in kernel else kernel
    if not requested:
        return f"{VARIABLE} off (kernel THP: {mode})"
    if mode == "never":
        return f"{VARIABLE}=1 but the kernel's THP mode is never: 4 KiB pages"
    return f"{VARIABLE}=1: large CPU tensors on huge pages (kernel THP: {mode})"
