"""Communicator facade: the only module of the project that imports mpi4py.

A :class:`Communicator` wraps a ``Dup`` of an MPI communicator (so library
messages never meet user messages) and offers the handful of collectives the
project uses, on torch tensors, each counting its bytes and time under a
phase name (:mod:`sparse_dist.accounting`).

Byte convention (logical volume, independent of the algorithm the MPI
library picks, so that counts can be predicted exactly from the layout):

* ``bcast`` of ``n`` bytes in a group of ``g`` ranks: the root sends
  ``n * (g - 1)``, every other rank receives ``n``.
* ``reduce`` (the transpose of a broadcast): every non-root rank sends ``n``,
  the root receives ``n * (g - 1)``.
* ``alltoallv``: the bytes addressed to / arriving from other ranks (the
  rank's own segment is never counted).
* ``allreduce`` of ``m`` elements: ring reduce-scatter plus allgather with
  chunks ``numpy.array_split(m, g)``; rank ``k`` sends and receives
  ``2 * (m - chunk_k) * itemsize``.

Time: the seconds a rank spends inside MPI calls (posting and waiting), i.e.
the exchange time not hidden behind local work.

Initialisation: importing this module does not start MPI; the first
:func:`world` (or anything else that needs the world) does, with
``MPI_THREAD_MULTIPLE`` as mpi4py would, and mpi4py finalises it at exit.
So the single-process tools (``sparse-dist sweep``, ``plot``, ``model``),
which import the library, never become MPI singletons, and the ``mpiexec``
or ``srun`` jobs they launch inherit no MPI state.

Devices: CPU tensors go to MPI as numpy views. CUDA tensors are handed to
MPI directly when the MPI library is CUDA-aware (``gpu_aware='on'``, or
``'auto'`` and detected), after synchronising the producing stream;
otherwise they are staged through pinned host buffers and copied back after
completion. ``force_host_staging=True`` sends CPU tensors through the same
staging path, which is how the fallback is tested on machines without a GPU.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import sys
import time
import traceback
from typing import Any, Callable, Sequence

import mpi4py
import numpy as np
import torch

mpi4py.rc.initialize = False  # started by _initialised() on first use, not at import
mpi4py.rc.finalize = True     # still finalised by mpi4py at exit once started
from mpi4py import MPI  # noqa: E402

from sparse_dist.accounting import CommStats
from sparse_dist.log import get_logger, set_rank

_log = get_logger(__name__)

_MPI_TYPES: dict[torch.dtype, Any] = {
    torch.float32: MPI.FLOAT,
    torch.float64: MPI.DOUBLE,
    torch.int32: MPI.INT32_T,
    torch.int64: MPI.INT64_T,
    torch.uint8: MPI.UINT8_T,
    torch.bool: MPI.C_BOOL,
}
_MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}


class CollectiveError(RuntimeError):
    """Raised identically on every rank when any rank found a problem."""


def mpi_library_version() -> str:
    """The MPI library's own version string (first line)."""
    return MPI.Get_library_version().strip().splitlines()[0]


def mpi_vendor_details() -> dict[str, str]:
    """MPI standard version, library version line and mpi4py version, for results files."""
    import mpi4py

    major, minor = MPI.Get_version()
    return {"mpi_standard": f"{major}.{minor}", "mpi_library": mpi_library_version(), "mpi4py": mpi4py.__version__}


def detect_cuda_aware_mpi() -> bool:
    """Whether the loaded MPI library accepts CUDA device buffers.

    Asks the library itself where it can (Open MPI's
    ``MPIX_Query_cuda_support``, MPICH's ``MPIX_GPU_query_support``), then
    the usual environment switches (Cray ``MPICH_GPU_SUPPORT_ENABLED``,
    MVAPICH2 ``MV2_USE_CUDA``). Anything unknown counts as not aware, so the
    safe host-staging path is used.
    """
    try:
        lib = ctypes.CDLL(None)
    except OSError:
        lib = None
    if lib is not None:
        query = getattr(lib, "MPIX_Query_cuda_support", None)
        if query is not None:
            query.restype = ctypes.c_int
            if query() == 1:
                return True
        gpu_query = getattr(lib, "MPIX_GPU_query_support", None)
        if gpu_query is not None:
            supported = ctypes.c_int(0)
            cuda_kind = 0  # MPIX_GPU_SUPPORT_CUDA
            if gpu_query(ctypes.c_int(cuda_kind), ctypes.byref(supported)) == 0 and supported.value:
                return True
    return os.environ.get("MPICH_GPU_SUPPORT_ENABLED") == "1" or os.environ.get("MV2_USE_CUDA") == "1"


def _resolve_gpu_aware(setting: str | bool) -> bool:
    if isinstance(setting, bool):
        return setting
    if setting == "on":
        return True
    if setting == "off":
        return False
    if setting == "auto":
        return detect_cuda_aware_mpi()
    raise ValueError(f"gpu_aware must be 'on', 'off' or 'auto', got {setting!r}")


def _ring_allreduce_bytes(numel: int, group_size: int, index: int, itemsize: int) -> int:
    """Bytes one rank sends (and receives) in a ring allreduce of ``numel`` elements."""
    if group_size <= 1:
        return 0
    base, extra = divmod(numel, group_size)
    own_chunk = base + (1 if index < extra else 0)
    return 2 * (numel - own_chunk) * itemsize


class Pending:
    """A posted non-blocking exchange; :meth:`wait` completes it and books its time."""

    def __init__(self, stats: CommStats, phase: str, request: Any, post_seconds: float,
                 finishers: list[Callable[[], None]], keep_alive: list[Any]) -> None:
        self._stats = stats
        self._phase = phase
        self._request = request
        self._post_seconds = post_seconds
        self._finishers = finishers
        self._keep_alive = keep_alive
        self._done = False

    def wait(self) -> None:
        if self._done:
            return
        start = time.perf_counter()
        if self._request is not None:
            self._request.Wait()
        for finish in self._finishers:
            finish()
        self._stats.add_seconds(self._phase, self._post_seconds + time.perf_counter() - start)
        self._done = True
        self._keep_alive.clear()


class Communicator:
    """Torch-tensor collectives over a private duplicate of an MPI communicator.

    Collective: constructing, :meth:`split` and every exchange method must be
    called by every rank of the communicator, in the same order.
    """

    def __init__(self, mpi_comm: Any = None, *, gpu_aware: str | bool = "auto",
                 force_host_staging: bool = False, stats: CommStats | None = None,
                 _owned: Any = None) -> None:
        base = _initialised() if mpi_comm is None else mpi_comm
        self._comm = _owned if _owned is not None else base.Dup()
        self.rank: int = self._comm.Get_rank()
        self.size: int = self._comm.Get_size()
        self.stats = stats if stats is not None else CommStats()
        self.gpu_aware = _resolve_gpu_aware(gpu_aware)
        self.force_host_staging = force_host_staging
        if mpi_comm is None:
            set_rank(self.rank)

    # ----------------------------------------------------------------- setup
    def split(self, color: int, key: int) -> "Communicator":
        """Sub-communicator of the ranks with the same ``color``, ordered by ``key``.

        The sub-communicator books its bytes into this communicator's counters.
        """
        sub = self._comm.Split(color, key)
        return Communicator(gpu_aware=self.gpu_aware, force_host_staging=self.force_host_staging,
                            stats=self.stats, _owned=sub)

    def free(self) -> None:
        """Release the duplicated MPI communicator (collective)."""
        if self._comm != MPI.COMM_NULL:
            self._comm.Free()

    # ------------------------------------------------------------ buffers
    def _buffer(self, tensor: torch.Tensor, *, writes_back: bool,
                finishers: list[Callable[[], None]], keep_alive: list[Any]) -> list[Any]:
        """An MPI buffer spec for ``tensor``; staged copies are written back by ``finishers``."""
        if not tensor.is_contiguous():
            raise ValueError("MPI buffers must be contiguous tensors; call .contiguous() first")
        try:
            mpi_type = _MPI_TYPES[tensor.dtype]
        except KeyError:
            raise TypeError(f"no MPI datatype for torch dtype {tensor.dtype}; "
                            f"supported: {sorted(str(d) for d in _MPI_TYPES)}") from None
        if tensor.is_cuda:
            torch.cuda.current_stream(tensor.device).synchronize()
            if self.gpu_aware:
                keep_alive.append(tensor)
                return [tensor, mpi_type]
        elif not self.force_host_staging:
            keep_alive.append(tensor)
            return [tensor.numpy(), mpi_type]
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=tensor.is_cuda)
        host.copy_(tensor)
        keep_alive.extend((tensor, host))
        if writes_back:
            finishers.append(lambda: tensor.copy_(host))
        return [host.numpy(), mpi_type]

    def _post(self, phase: str, start_op: Callable[[list[Callable[[], None]], list[Any]], Any],
              sent: int, recv: int) -> Pending:
        finishers: list[Callable[[], None]] = []
        keep_alive: list[Any] = []
        start = time.perf_counter()
        request = start_op(finishers, keep_alive)
        self.stats.add_bytes(phase, sent, recv)
        return Pending(self.stats, phase, request, time.perf_counter() - start, finishers, keep_alive)

    # --------------------------------------------------------- collectives
    def ibcast_(self, tensor: torch.Tensor, root: int, phase: str) -> Pending:
        """Post a broadcast of ``tensor`` from ``root`` into ``tensor`` on every rank."""
        nbytes = tensor.numel() * tensor.element_size()
        sent, recv = (nbytes * (self.size - 1), 0) if self.rank == root else (0, nbytes)

        def start(finishers: list, keep_alive: list) -> Any:
            buf = self._buffer(tensor, writes_back=self.rank != root, finishers=finishers, keep_alive=keep_alive)
            return self._comm.Ibcast(buf, root=root)

        return self._post(phase, start, sent, recv)

    def bcast_(self, tensor: torch.Tensor, root: int, phase: str) -> None:
        """Blocking :meth:`ibcast_`."""
        self.ibcast_(tensor, root, phase).wait()

    def ireduce(self, contribution: torch.Tensor | None, result: torch.Tensor | None,
                root: int, phase: str) -> Pending:
        """Post a sum of every rank's ``contribution`` into ``result`` at ``root``.

        At the root, ``contribution=None`` means "my contribution is already in
        ``result``" (in place). Non-roots pass ``result=None``.
        """
        probe = result if self.rank == root else contribution
        if probe is None:
            raise ValueError("ireduce: the root needs `result`, other ranks need `contribution`")
        nbytes = probe.numel() * probe.element_size()
        sent, recv = (0, nbytes * (self.size - 1)) if self.rank == root else (nbytes, 0)

        def start(finishers: list, keep_alive: list) -> Any:
            if self.rank == root:
                assert result is not None
                recv_buf = self._buffer(result, writes_back=True, finishers=finishers, keep_alive=keep_alive)
                send_buf = MPI.IN_PLACE if contribution is None else self._buffer(
                    contribution, writes_back=False, finishers=finishers, keep_alive=keep_alive)
                return self._comm.Ireduce(send_buf, recv_buf, op=MPI.SUM, root=root)
            assert contribution is not None
            send_buf = self._buffer(contribution, writes_back=False, finishers=finishers, keep_alive=keep_alive)
            return self._comm.Ireduce(send_buf, None, op=MPI.SUM, root=root)

        return self._post(phase, start, sent, recv)

    def ialltoallv(self, send: torch.Tensor, send_rows: Sequence[int], recv: torch.Tensor,
                   recv_rows: Sequence[int], phase: str) -> Pending:
        """Post a personalised exchange of row blocks.

        ``send`` holds the rows for rank 0, then rank 1, ... (``send_rows[k]``
        rows for rank ``k``); ``recv`` receives ``recv_rows[k]`` rows from rank
        ``k`` in rank order. Rows are the first dimension; all other
        dimensions must agree between ``send`` and ``recv``.
        """
        if len(send_rows) != self.size or len(recv_rows) != self.size:
            raise ValueError(f"alltoallv needs {self.size} row counts, got {len(send_rows)} and {len(recv_rows)}")
        row_elems = int(np.prod(send.shape[1:], dtype=np.int64)) if send.dim() > 1 else 1
        send_counts = np.asarray(send_rows, dtype=np.int64) * row_elems
        recv_counts = np.asarray(recv_rows, dtype=np.int64) * row_elems
        send_displs = np.concatenate(([0], np.cumsum(send_counts)[:-1]))
        recv_displs = np.concatenate(([0], np.cumsum(recv_counts)[:-1]))
        if send_counts.sum() != send.numel() or recv_counts.sum() != recv.numel():
            raise ValueError(f"alltoallv counts ({send_counts.sum()} / {recv_counts.sum()} elements) do not "
                             f"match the buffers ({send.numel()} / {recv.numel()} elements)")
        item = send.element_size()
        sent = int(send_counts.sum() - send_counts[self.rank]) * item
        received = int(recv_counts.sum() - recv_counts[self.rank]) * item

        def start(finishers: list, keep_alive: list) -> Any:
            send_buf = self._buffer(send, writes_back=False, finishers=finishers, keep_alive=keep_alive)
            recv_buf = self._buffer(recv, writes_back=True, finishers=finishers, keep_alive=keep_alive)
            keep_alive.extend((send_counts, recv_counts, send_displs, recv_displs))
            return self._comm.Ialltoallv([send_buf[0], (send_counts, send_displs), send_buf[1]],
                                         [recv_buf[0], (recv_counts, recv_displs), recv_buf[1]])

        return self._post(phase, start, sent, received)

    def alltoallv(self, send: torch.Tensor, send_rows: Sequence[int], recv: torch.Tensor,
                  recv_rows: Sequence[int], phase: str) -> None:
        """Blocking :meth:`ialltoallv`."""
        self.ialltoallv(send, send_rows, recv, recv_rows, phase).wait()

    def allreduce_(self, tensor: torch.Tensor, phase: str, op: str = "sum") -> None:
        """In-place allreduce (``sum``, ``max`` or ``min``) of a contiguous tensor."""
        moved = _ring_allreduce_bytes(tensor.numel(), self.size, self.rank, tensor.element_size())

        def start(finishers: list, keep_alive: list) -> Any:
            buf = self._buffer(tensor, writes_back=True, finishers=finishers, keep_alive=keep_alive)
            return self._comm.Iallreduce(MPI.IN_PLACE, buf, op=_MPI_OPS[op])

        self._post(phase, start, moved, moved).wait()

    def allgather_array(self, values: np.ndarray, phase: str = "other") -> np.ndarray:
        """Gather an equally shaped int64/float64 array from every rank: shape ``(size, *values.shape)``."""
        values = np.ascontiguousarray(values)
        out = np.empty((self.size, *values.shape), dtype=values.dtype)
        start = time.perf_counter()
        self._comm.Allgather(values, out)
        self.stats.add_bytes(phase, values.nbytes * (self.size - 1), values.nbytes * (self.size - 1))
        self.stats.add_seconds(phase, time.perf_counter() - start)
        return out

    def allgather_object(self, obj: Any, phase: str = "other") -> list[Any]:
        """Gather a small picklable object from every rank (metadata only)."""
        start = time.perf_counter()
        gathered = self._comm.allgather(obj)
        sizes = [len(pickle.dumps(item)) for item in gathered]
        self.stats.add_bytes(phase, sizes[self.rank] * (self.size - 1), sum(sizes) - sizes[self.rank])
        self.stats.add_seconds(phase, time.perf_counter() - start)
        return gathered

    def all_true(self, flag: bool) -> bool:
        """Collective AND of a per-rank flag."""
        out = self.allgather_array(np.array([1 if flag else 0], dtype=np.int64))
        return bool(out.min() == 1)

    def raise_if_any(self, error: str | None, exc_type: type[Exception] = CollectiveError) -> None:
        """Collective validation: if any rank passes an error message, every rank raises.

        The raised message lists each failing rank and its message, so the
        same error appears everywhere and no rank is left inside a collective.
        """
        errors = self.allgather_object(error)
        failed = [(rank, msg) for rank, msg in enumerate(errors) if msg is not None]
        if failed:
            text = "; ".join(f"rank {rank}: {msg}" for rank, msg in failed)
            raise exc_type(text)

    def barrier(self) -> None:
        self._comm.Barrier()

    def idle_barrier(self, poll_seconds: float = 0.005) -> None:
        """A barrier that sleeps instead of spinning, so waiting ranks leave the cores free."""
        request = self._comm.Ibarrier()
        while not request.Test():
            time.sleep(poll_seconds)


def _initialised() -> Any:
    """``MPI.COMM_WORLD``, starting MPI first if this process has not yet."""
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    return MPI.COMM_WORLD


def world(*, gpu_aware: str | bool = "auto", force_host_staging: bool = False) -> Communicator:
    """The facade over a duplicate of ``MPI.COMM_WORLD`` (collective; starts MPI on first use)."""
    return Communicator(None, gpu_aware=gpu_aware, force_host_staging=force_host_staging)


def world_rank() -> int:
    return _initialised().Get_rank()


def run_or_abort(main: Callable[[], int]) -> int:
    """Run ``main``; if it raises on any rank, end the whole job non-zero.

    The failing rank writes its traceback, prefixed with its rank, to stderr
    and calls ``MPI_Abort`` on the world communicator, so ranks waiting in a
    collective are killed instead of hanging (the semantics of
    ``python -m mpi4py``). A non-zero ``SystemExit`` counts as a failure too.
    """
    try:
        return main()
    except SystemExit as exc:
        if exc.code in (None, 0):
            raise
        _abort_with(f"exit status {exc.code}", exc.code if isinstance(exc.code, int) else 1)
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        rank = _initialised().Get_rank()
        details = "".join(traceback.format_exception(exc))
        sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in details.rstrip().splitlines()))
        _abort_with(f"{type(exc).__name__}: {exc}", 1)
    return 1


ABORT_GRACE_SECONDS = 0.5


def _abort_with(reason: str, code: int) -> None:
    rank = _initialised().Get_rank()
    sys.stderr.write(f"[rank {rank}] error: {reason}; aborting all ranks\n")
    sys.stderr.flush()
    if MPI.COMM_WORLD.Get_size() > 1:
        # Let the launcher forward this message before MPI_Abort tears the job down (without the pause an
        # abort from every rank at once sometimes lost all output).
        time.sleep(ABORT_GRACE_SECONDS)
        MPI.COMM_WORLD.Abort(code)
    raise SystemExit(code)


def ranks_on_this_node() -> int:
    """How many ranks of the world share this node (for a default thread count)."""
    local = _initialised().Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_size()
    finally:
        local.Free()


def default_threads_per_rank() -> int:
    """``SLURM_CPUS_PER_TASK`` if set, else the cores this process may use divided by the ranks on its node."""
    slurm = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm and slurm.isdigit():
        return int(slurm)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // ranks_on_this_node())
