"""Host memory: large CPU tensors on transparent huge pages.

Why: an epoch allocates and frees tensors of the same large sizes over and
over (activations, gradients, SpMM outputs: 100 MB each at 200k rows x 128
columns). glibc hands each one back to the kernel when it is freed (they lie
above its mmap threshold), so every epoch page-faults all of them in again,
4 KiB at a time: on this project's 2-core test machine a fresh 100 MB
result cost 20-70 ms where a write into a warm one took 6 ms.

PyTorch's own switch ``THP_MEM_ALLOC_ENABLE=1`` makes its CPU allocator
align large blocks to 2 MiB and ask for transparent huge pages
(``madvise(MADV_HUGEPAGE)``), so a 100 MB tensor is faulted in with about
50 faults instead of 25,000. Memory is still returned when freed, so the
resident set stays an honest measure of live memory (a kept-heap
``mallopt`` set-up was tried and dropped: torch's aligned allocations do
not fit the blocks it freed, and the heap grew by a block every epoch).

PyTorch reads the variable once, at its first CPU allocation, so it must be
in the environment before ``torch`` is imported: :func:`prefer_huge_pages`
is called by the ``sparse-dist`` entry point first thing. A value the user
set (``THP_MEM_ALLOC_ENABLE=0`` to switch it off) is kept. It matters only
where the kernel's THP mode is ``always`` or ``madvise``
(``/sys/kernel/mm/transparent_hugepage/enabled``).
"""

from __future__ import annotations

import os
import sys

VARIABLE = "THP_MEM_ALLOC_ENABLE"
_KERNEL_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def prefer_huge_pages() -> None:
    """Set ``THP_MEM_ALLOC_ENABLE=1`` unless the user chose a value (before torch is imported)."""
    if "torch" not in sys.modules:
        os.environ.setdefault(VARIABLE, "1")


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
