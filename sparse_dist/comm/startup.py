"""Starting MPI: mpi4py is told not to initialise at import, and the first use starts it.

See "Initialisation" in :mod:`sparse_dist.comm`. Every module of the package takes ``MPI`` from here, so the
``mpi4py.rc`` settings are in place before ``mpi4py.MPI`` is first imported.
"""

from __future__ import annotations

import os
from typing import Any

import mpi4py

mpi4py.rc.initialize = False  # started by _initialised() on first use, not at import
mpi4py.rc.finalize = True     # still finalised by mpi4py at exit once started
from mpi4py import MPI  # noqa: E402

__all__ = ["MPI", "mpi_library_version", "mpi_vendor_details", "separate_endpoints", "threads_may_call_mpi",
           "world_rank"]

ENDPOINTS_VARIABLE = "MPIR_CVAR_CH4_NUM_VCIS"
"""MPICH's number of virtual communication interfaces (VCIs); it spreads communicators over them."""


def separate_endpoints(count: int = 2) -> None:
    """Ask MPICH for ``count`` VCIs unless the environment sets ``MPIR_CVAR_CH4_NUM_VCIS``; before MPI starts
    (then nothing). MPICH spreads communicators over its VCIs, each with its own network endpoint, so between
    nodes a transfer on one communicator need not queue behind another's on one TCP connection (measured over
    an emulated 1 Gbit/s link: 100 KB posted behind 27 MB on another communicator arrived after 0.01-0.02 s
    with two VCIs, 0.23-0.27 s with one). Other MPI libraries ignore the variable."""
    if not MPI.Is_initialized():
        os.environ.setdefault(ENDPOINTS_VARIABLE, str(count))


def mpi_library_version() -> str:
    """The MPI library's own version string (first line)."""
    return MPI.Get_library_version().strip().splitlines()[0]


def mpi_vendor_details() -> dict[str, str]:
    """MPI standard version, library version line and mpi4py version, for results files."""
    major, minor = MPI.Get_version()
    return {"mpi_standard": f"{major}.{minor}", "mpi_library": mpi_library_version(), "mpi4py": mpi4py.__version__}


def _initialised() -> Any:
    """``MPI.COMM_WORLD``, starting MPI first if this process has not yet."""
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    return MPI.COMM_WORLD


def threads_may_call_mpi() -> bool:
    """Whether this process's MPI lets several threads call it at once (``MPI_THREAD_MULTIPLE``; starts MPI)."""
    _initialised()
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


def world_rank() -> int:
    return _initialised().Get_rank()
