"""Large CPU tensors on transparent huge pages where the user asks (torch's ``THP_MEM_ALLOC_ENABLE=1``: far fewer
page faults for a fresh tensor; off by default), and freed memory kept for reuse on request (the pages of a freed
block stay for the next one)."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import resource
from sparse_dist.hostmem import huge_page_state
import torch
block = torch.ones(16 << 20)  # warm up torch's own first allocations
del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = torch.ones(16 << 20)  # 64 MiB, written in full
print(huge_page_state(), "|", resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
KERNEL = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _faults(value: str | None) -> tuple[str, int]:
    env = {key: val for key, val in os.environ.items() if key != "THP_MEM_ALLOC_ENABLE"}
    if value is not None:
        env["THP_MEM_ALLOC_ENABLE"] = value
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    state, faults = result.stdout.strip().rsplit("|", 1)
    return state.strip(), int(faults)


@pytest.mark.skipif(not KERNEL.exists() or "[never]" in KERNEL.read_text(), reason="no transparent huge pages")
def test_huge_pages_are_off_by_default_and_the_user_can_ask_for_them() -> None:
    default_state, default_faults = _faults(None)
    on_state, on_faults = _faults("1")
    assert default_state.startswith("THP_MEM_ALLOC_ENABLE off"), default_state
    assert on_state.startswith("THP_MEM_ALLOC_ENABLE=1"), on_state
    pages = (64 << 20) // 4096
    assert on_faults < pages // 20  # 2 MiB pages: 32 faults for the block
    if "[madvise]" in KERNEL.read_text():  # in "always" mode the kernel may use huge pages unasked
        assert default_faults > pages // 2  # 4 KiB pages: one fault each


REUSE_PROBE = """
from sparse_dist.hostmem import freed_memory_state, keep_freed_memory
keep_freed_memory()
import torch
def resident_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
block = torch.ones(16 << 20)  # 64 MiB, written in full
held = resident_mib()
del block
print(freed_memory_state(), "|", held - resident_mib())
"""


def _probe(code: str, value: str | None) -> subprocess.CompletedProcess[str]:
    """``code`` run in a fresh interpreter with ``SPARSE_DIST_FREED_MEMORY`` set to ``value`` (unset for None)."""
    env = {key: val for key, val in os.environ.items() if key != "SPARSE_DIST_FREED_MEMORY"}
    if value is not None:
        env["SPARSE_DIST_FREED_MEMORY"] = value
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    return result


def _returned_mib(value: str | None) -> tuple[str, int]:
    """The probe's freed-memory state and how many MiB freeing a 64 MiB block gave back to the kernel."""
    result = _probe(REUSE_PROBE, value)
    state, returned = result.stdout.strip().rsplit("|", 1)
    return state.strip(), int(returned)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_memory_is_returned_by_default_and_kept_on_request() -> None:
    kept_state, kept_returned = _returned_mib("keep")
    default_state, default_returned = _returned_mib(None)
    assert kept_state.startswith("kept for reuse"), kept_state
    assert default_state == "returned to the kernel (the default)", default_state
    assert default_returned >= 60, default_returned  # the block's pages go back when it is freed
    assert kept_returned <= 4, kept_returned  # they stay, for the next block of that size


THREAD_PROBE = """
import ctypes, threading
from sparse_dist.hostmem import freed_memory_state, one_heap_where_kept
one_heap_where_kept()  # as the entry point does, before torch
import torch
from sparse_dist.hostmem import keep_freed_memory
keep_freed_memory()
def helper():
    block = torch.ones(16 << 20)  # 64 MiB, from the heap this thread allocates from
    del block
for _ in range(2):  # a new thread each time, as each evaluation beside a step gets
    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()
print(freed_memory_state(), flush=True)
ctypes.CDLL(None).malloc_stats()  # glibc: one "Arena N:" paragraph per heap, on stderr
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
@pytest.mark.parametrize("value", ["keep", None])
def test_helper_threads_allocate_from_the_heap_that_keeps_freed_memory(value: str | None) -> None:
    """With keep every thread allocates from the main heap, which keeps what they free for the next one (an
    evaluation beside a step runs in a new helper thread each time); released, each helper gets a heap of its
    own as glibc's default gives."""
    result = _probe(THREAD_PROBE, value)
    heaps = [line for line in result.stderr.splitlines() if line.startswith("Arena ")]
    if value == "keep":
        assert result.stdout.strip().endswith("no mmap, no trim, one heap)"), result.stdout
        assert heaps == ["Arena 0:"], result.stderr
    else:
        assert len(heaps) >= 2, result.stderr
