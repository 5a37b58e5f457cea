"""CUDA-aware MPI detection and the ``--gpu-aware auto|on|off|force`` decision.

The detection logic runs against fake MPI libraries and environments (no GPU
needed); the refusal of ``on`` is checked under real mpiexec with this
venv's MPICH, which is not CUDA-aware. CUDA staging runs where a GPU is.
"""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch
from mpirun import BIN, run_mpi

from sparse_dist.comm import CudaAwareness, GpuAwareError, detect_cuda_aware_mpi, gpu_path_report

SPARSE_DIST = str(BIN / "sparse-dist")
LIBRARY = "Open MPI v5.0.3"


class FakeOpenMPI:
    """Exports only Open MPI's query."""

    def __init__(self, answer: int) -> None:
        self.answer = answer

    def MPIX_Query_cuda_support(self) -> int:  # noqa: N802 - the C name
        return self.answer


class FakeMPICH:
    """Exports MPICH's queries: the Open MPI-compatible one says 0, the GPU query says ``flag``."""

    def __init__(self, flag: int, status: int = 0) -> None:
        self.flag = flag
        self.status = status
        self.kinds: list[int] = []

    def MPIX_Query_cuda_support(self) -> int:  # noqa: N802
        return 0

    def MPIX_GPU_query_support(self, kind: ctypes.c_int, flag: "ctypes._Pointer[ctypes.c_int]") -> int:  # noqa: N802
        self.kinds.append(kind.value)
        flag.contents.value = self.flag
        return self.status


class Nothing:
    """A library that exports neither query."""


def test_open_mpi_query_says_yes() -> None:
    found = detect_cuda_aware_mpi(lib=FakeOpenMPI(1), environ={})
    assert found.supported and bool(found)
    assert found.reason == "MPIX_Query_cuda_support() = 1"


def test_mpich_gpu_query_says_yes_for_cuda() -> None:
    lib = FakeMPICH(1)
    found = detect_cuda_aware_mpi(lib=lib, environ={})
    assert found == CudaAwareness(True, "MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA) = 1")
    assert lib.kinds == [0]  # MPIX_GPU_SUPPORT_CUDA


def test_no_support_names_every_query() -> None:
    found = detect_cuda_aware_mpi(lib=FakeMPICH(0), environ={"MV2_USE_CUDA": "0"})
    assert not found.supported and not found
    assert found.reason == ("MPIX_Query_cuda_support() = 0, MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA) = 0, "
                            "MPICH_GPU_SUPPORT_ENABLED and MV2_USE_CUDA not set to 1")
    assert "failed with error code 15" in detect_cuda_aware_mpi(lib=FakeMPICH(1, status=15), environ={}).reason
    assert "MPIX_Query_cuda_support not exported" in detect_cuda_aware_mpi(lib=Nothing(), environ={}).reason
    assert "no MPI library symbols" in detect_cuda_aware_mpi(lib=None, environ={}).reason


@pytest.mark.parametrize("switch", ["MPICH_GPU_SUPPORT_ENABLED", "MV2_USE_CUDA"])
def test_environment_switches_say_yes(switch: str) -> None:
    found = detect_cuda_aware_mpi(lib=Nothing(), environ={switch: "1"})
    assert found.supported and found.reason.startswith(f"{switch}=1 in the environment")


def test_path_report_for_each_setting() -> None:
    yes = CudaAwareness(True, "MPIX_Query_cuda_support() = 1")
    no = CudaAwareness(False, "MPIX_Query_cuda_support() = 0")
    assert gpu_path_report("auto", yes, LIBRARY) == (
        True, "CUDA-aware MPI: --gpu-aware auto and Open MPI v5.0.3 reports CUDA support "
              "(MPIX_Query_cuda_support() = 1)")
    assert gpu_path_report("auto", no, LIBRARY) == (
        False, "host staging: --gpu-aware auto and Open MPI v5.0.3 reports no CUDA support "
               "(MPIX_Query_cuda_support() = 0)")
    assert gpu_path_report("on", yes, LIBRARY)[0] is True
    assert gpu_path_report("off", yes, LIBRARY) == (False, "host staging: --gpu-aware off")
    assert gpu_path_report("force", no, LIBRARY)[0] is True
    with pytest.raises(ValueError, match="auto, on, off, force"):
        gpu_path_report("maybe", yes, LIBRARY)


def test_on_without_support_is_one_sentence_naming_library_queries_and_ways_out() -> None:
    no = detect_cuda_aware_mpi(lib=FakeMPICH(0), environ={})
    with pytest.raises(GpuAwareError) as caught:
        gpu_path_report("on", no, "MPICH Version:      5.0.2")
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)
    for part in ("MPICH Version: 5.0.2", "MPIX_Query_cuda_support() = 0", "MPIX_GPU_query_support",
                 "MPICH_GPU_SUPPORT_ENABLED", "--gpu-aware auto or off", "--gpu-aware force"):
        assert part in message
    assert "\n" not in message and message.count(". ") == 0


def test_loaded_library_is_found_and_queried() -> None:
    """This venv's MPICH exports both queries (its symbols are not global: found via the mapped files)."""
    found = detect_cuda_aware_mpi(environ={})
    assert "not exported" not in found.reason and "no MPI library" not in found.reason, found.reason


def test_on_refuses_once_per_job_without_traceback() -> None:
    result = run_mpi(2, [SPARSE_DIST, "--gpu-aware", "on", "info"], timeout=120)
    assert result.returncode != 0
    assert result.stderr.count("sparse-dist: error: --gpu-aware on needs an MPI library") == 1, result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    assert "aborting" not in result.stderr
    assert "python" not in result.stdout  # refused before info printed anything


def test_force_runs_and_info_says_which_path() -> None:
    result = run_mpi(2, [SPARSE_DIST, "--gpu-aware", "force", "info"], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gpu path    CUDA-aware MPI: --gpu-aware force" in result.stdout
    auto = run_mpi(2, [SPARSE_DIST, "info"], timeout=120)
    assert auto.returncode == 0, auto.stdout + auto.stderr
    assert "gpu path    host staging: --gpu-aware auto and MPICH" in auto.stdout


def test_force_host_staging_environment_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARSE_DIST_FORCE_HOST_STAGING", "1")
    result = run_mpi(1, [sys.executable, "-m", "runners.cli", "info"], timeout=120)
    assert result.returncode == 0, result.stderr
    assert "host staging forced" in result.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_staging_round_trips_through_pinned_pool() -> None:
    """Staged CUDA buffers (side-stream copies, events, pool) give the data back on the current stream."""
    from sparse_dist.comm import world

    comm = world(gpu_aware="off")
    device = torch.device("cuda", 0)
    for _ in range(3):
        send = torch.arange(4096, dtype=torch.float32, device=device).reshape(64, 64) * 2  # a kernel on the stream
        recv = torch.empty_like(send)
        pending = comm.ialltoallv(send, [64], recv, [64], phase="other")
        busy = send @ send  # the caller's next kernel, overlapping the staging copy
        pending.wait()
        assert torch.equal(recv * 1, send) and busy.shape == (64, 64)
        total = torch.ones(1000, dtype=torch.float64, device=device)
        comm.allreduce_(total, "grad_allreduce")
        assert float(total.sum()) == 1000.0
        result = torch.full((100,), 5.0, device=device)
        comm.ireduce(None, result, root=0, phase="backward").wait()
        assert torch.equal(result, torch.full((100,), 5.0, device=device))
    assert comm.staging_pool.allocations == 4  # (4096 f32) x 2, (1000 f64), (100 f32): reused every round
    comm.free()
