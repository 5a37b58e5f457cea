"""Host memory: keep large freed blocks in the process instead of handing them back to the kernel.

Why: glibc serves every allocation above its mmap threshold (at most 32 MiB)
with a fresh ``mmap`` and returns it with ``munmap`` when freed. A training
epoch allocates and frees tensors of the same large sizes over and over
(activations, gradients, SpMM outputs: 100 MB each at 200k rows x 128
columns), so every one of them is page-faulted in again, zeroed by the
kernel, every epoch. On the 200k-node case that was a large share of the
CPU epoch: a fresh 100 MB tensor cost 20-70 ms, a copy into a warm one 6 ms.

:func:`tune_host_allocator` asks glibc (``mallopt``) to serve large blocks
from its heap (``M_MMAP_MAX = 0``) and to keep up to ``keep_bytes`` of freed
memory at the top of the heap (``M_TRIM_THRESHOLD``), so the second epoch
reuses the first one's pages. This is what preloading jemalloc or tcmalloc
does for PyTorch on CPUs, without a preload. The cost: the process's
resident size stays near its peak between epochs. It changes the whole
process (PyTorch, NumPy and the MPI library allocate through it), so it is
a decision of the command (``--host-allocator``), never of library code
that merely imports this module. Other C libraries (musl) are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

from sparse_dist.log import get_logger

_log = get_logger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
DEFAULT_KEEP_BYTES = 1 << 30

_applied: str | None = None


def tune_host_allocator(keep_bytes: int = DEFAULT_KEEP_BYTES) -> str:
    """Serve large blocks from the reusable heap (glibc); returns what was done, for results files.

    Idempotent; rank-local (no communication).
    """
    global _applied
    if _applied is not None:
        return _applied
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        _applied = f"default (not glibc: {platform.system()} {platform.libc_ver()[0] or 'unknown libc'})"
        return _applied
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_MAX, 0) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, int(keep_bytes)) == 1
    except (OSError, AttributeError) as exc:
        _applied = f"default (mallopt unavailable: {exc})"
        return _applied
    _applied = (f"glibc heap: mmap off, keep {keep_bytes >> 20} MiB freed" if ok
                else "default (mallopt refused the settings)")
    _log.info("host allocator: %s", _applied)
    return _applied


def host_allocator_state() -> str:
    """What :func:`tune_host_allocator` did in this process, or ``default``."""
    return _applied or "default"
