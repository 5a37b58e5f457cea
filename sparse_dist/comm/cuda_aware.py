"""CUDA-aware MPI detection and the ``gpu_aware`` decision (see "Devices" in :mod:`sparse_dist.comm`).

Local and deterministic: the answer depends only on the loaded MPI library and the environment, so every
rank reaches the same one without communicating.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass
from typing import Any, Mapping

from sparse_dist.comm.startup import _initialised, mpi_library_version

GPU_AWARE_SETTINGS: tuple[str, ...] = ("auto", "on", "off", "force")

_CUDA_ENV_SWITCHES = ("MPICH_GPU_SUPPORT_ENABLED", "MV2_USE_CUDA")  # Cray MPICH, MVAPICH2
_MPIX_GPU_SUPPORT_CUDA = 0  # MPICH mpi.h: MPIX_GPU_SUPPORT_CUDA


class GpuAwareError(ValueError):
    """``gpu_aware='on'`` but the MPI library reports no CUDA support.

    Raised before ``Dup`` or any collective and without communicating: the
    decision depends only on the loaded MPI library and the environment,
    which are the same on every rank of a job, so every rank raises it.
    """


@dataclass(frozen=True)
class CudaAwareness:
    """What the MPI library (or the environment) says about CUDA buffers, and which query said it."""

    supported: bool
    reason: str

    def __bool__(self) -> bool:
        return self.supported


@functools.lru_cache(maxsize=1)
def _mpi_library_handle() -> Any | None:
    """A ctypes handle on the loaded MPI library, or None.

    mpi4py loads libmpi as a dependency of its extension with ``RTLD_LOCAL``,
    so its symbols are usually not in the global namespace (``CDLL(None)``);
    then look among the shared objects mapped into this process.
    """
    try:
        everything = ctypes.CDLL(None)
        if hasattr(everything, "MPI_Init"):
            return everything
    except OSError:
        pass
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = [line.split()[-1] for line in maps if "/" in line]
    except OSError:
        return None
    candidates = [p for p in dict.fromkeys(paths) if ".so" in os.path.basename(p) and "mpi" in os.path.basename(p)]
    candidates.sort(key=lambda p: not os.path.basename(p).startswith("libmpi"))
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(lib, "MPI_Init"):
            return lib
    return None


_LOADED = object()


def detect_cuda_aware_mpi(lib: Any = _LOADED, environ: Mapping[str, str] | None = None) -> CudaAwareness:
    """Whether the MPI library accepts CUDA device buffers, and which query answered.

    Asks the library first (Open MPI's ``MPIX_Query_cuda_support()``, then
    MPICH's ``MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &flag)``), then
    the usual environment switches (Cray ``MPICH_GPU_SUPPORT_ENABLED=1``,
    MVAPICH2 ``MV2_USE_CUDA=1``). Anything unknown counts as not supported,
    so the safe host-staging path is used. ``lib`` (an object with those
    functions as attributes, None for "no library") and ``environ`` default
    to the loaded MPI library and ``os.environ``; tests pass fakes. Local:
    no communication, but MPICH aborts a query made before ``MPI_Init``, so
    asking the loaded library starts MPI first (as :func:`world` would).
    """
    if lib is _LOADED:
        _initialised()
        lib = _mpi_library_handle()
    env = os.environ if environ is None else environ
    asked: list[str] = []
    if lib is None:
        asked.append("no MPI library symbols found to query")
    else:
        query = getattr(lib, "MPIX_Query_cuda_support", None)
        if query is None:
            asked.append("MPIX_Query_cuda_support not exported")
        else:
            _set_int_result(query)
            value = int(query())
            if value:
                return CudaAwareness(True, f"MPIX_Query_cuda_support() = {value}")
            asked.append(f"MPIX_Query_cuda_support() = {value}")
        gpu_query = getattr(lib, "MPIX_GPU_query_support", None)
        if gpu_query is None:
            asked.append("MPIX_GPU_query_support not exported")
        else:
            _set_int_result(gpu_query)
            flag = ctypes.c_int(0)
            status = int(gpu_query(ctypes.c_int(_MPIX_GPU_SUPPORT_CUDA), ctypes.pointer(flag)))
            answer = f"MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA) = {flag.value}"
            if status == 0 and flag.value:
                return CudaAwareness(True, answer)
            asked.append(answer if status == 0 else f"MPIX_GPU_query_support failed with error code {status}")
    for name in _CUDA_ENV_SWITCHES:
        if env.get(name) == "1":
            return CudaAwareness(True, f"{name}=1 in the environment (library: {', '.join(asked)})")
    asked.append(f"{' and '.join(_CUDA_ENV_SWITCHES)} not set to 1")
    return CudaAwareness(False, ", ".join(asked))


def _set_int_result(function: Any) -> None:
    """Declare a ctypes function's C ``int`` result (fakes without ``restype`` are left alone)."""
    try:
        function.restype = ctypes.c_int
    except (AttributeError, TypeError):
        pass


def gpu_path_report(setting: str | bool, awareness: CudaAwareness | None = None,
                    library: str | None = None) -> tuple[bool, str]:
    """Whether CUDA tensors go to MPI as device buffers, and one line saying why.

    ``setting`` is ``auto``, ``on``, ``off``, ``force`` (or a bool: decided
    by the caller). Raises :class:`GpuAwareError` for ``on`` with a library
    that reports no CUDA support. Local and deterministic (library and
    environment only), so every rank reaches the same answer without
    communicating. ``awareness`` and ``library`` default to the loaded
    library's (tests pass their own).
    """
    if isinstance(setting, bool):
        return setting, ("CUDA-aware MPI" if setting else "host staging") + ": chosen by the caller"
    if setting not in GPU_AWARE_SETTINGS:
        raise ValueError(f"gpu_aware must be one of {', '.join(GPU_AWARE_SETTINGS)}, got {setting!r}")
    if setting == "off":
        return False, "host staging: --gpu-aware off"
    if setting == "force":
        return True, "CUDA-aware MPI: --gpu-aware force hands device buffers to MPI without checking the library"
    if awareness is None:
        awareness = detect_cuda_aware_mpi()
    library = " ".join((library if library is not None else mpi_library_version()).split())
    if awareness.supported:
        return True, f"CUDA-aware MPI: --gpu-aware {setting} and {library} reports CUDA support ({awareness.reason})"
    if setting == "auto":
        return False, f"host staging: --gpu-aware auto and {library} reports no CUDA support ({awareness.reason})"
    raise GpuAwareError(
        f"--gpu-aware on needs an MPI library that accepts CUDA buffers, but {library} reports no CUDA support "
        f"({awareness.reason}); use --gpu-aware auto or off to stage CUDA buffers through host memory, "
        f"or --gpu-aware force if this library does accept CUDA buffers without reporting it")
