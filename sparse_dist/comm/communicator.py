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
  the root receives ``n * (g - 1)``. A reduce split into segments (below)
  counts as one call with the same totals.
* ``alltoallv``: the bytes addressed to / arriving from other ranks (the
  rank's own segment is never counted).
* ``allreduce`` of ``m`` elements: ring reduce-scatter plus allgather with
  chunks ``numpy.array_split(m, g)``; rank ``k`` sends and receives
  ``2 * (m - chunk_k) * itemsize``.

Time: the seconds a rank spends inside MPI calls (posting, starting and
waiting), i.e. the exchange time not hidden behind local work.

Initialisation: importing this module does not start MPI; the first
:func:`world` (or anything else that needs the world) does, with
``MPI_THREAD_MULTIPLE`` as mpi4py would, and mpi4py finalises it at exit.
So the single-process tools (``sparse-dist sweep``, ``plot``, ``model``),
which import the library, never become MPI singletons, and the ``mpiexec``
or ``srun`` jobs they launch inherit no MPI state.

Devices (``gpu_aware``): CPU tensors go to MPI as numpy views. CUDA tensors
are handed to MPI as device buffers when ``gpu_aware`` is ``'auto'`` and the
library reports CUDA support, ``'on'`` (which refuses, with
:class:`GpuAwareError` before any collective, a library that reports none)
or ``'force'`` (no check); MPI starts only after an event recorded on the
producing stream has completed. Otherwise (``'off'``, or ``'auto'`` without
support) they are staged through host memory:

* Host buffers come from a :class:`StagingPool` shared by a communicator and
  its ``split`` children: allocated once per ``(numel, dtype, pinned)`` and
  reused, pinned for CUDA sources. A buffer is lent to one exchange and
  returns when that exchange completes, so outstanding requests never share.
* The device-to-host copy of a buffer MPI reads runs ``non_blocking`` on a
  side stream (one per communicator and device, created lazily) that waits
  on an event recorded on the producer's current stream; MPI waits for that
  copy's event only, never for the whole device. Received data goes back
  ``non_blocking`` on the side stream after completion, the current stream
  waits on that copy's event, and the pool synchronises the event before it
  lends the host buffer again.
* Deferred starts: a staged exchange is not started in MPI when it is
  posted, so the copy overlaps the caller's next kernel (the plans post an
  exchange, then multiply the local block). It starts at the next call into
  any communicator of this process (a post, a blocking collective, or
  ``wait``/``test`` of any :class:`Pending`), after every exchange posted
  before it: one process-wide FIFO keeps starts in post order, which is the
  same on every rank, as MPI requires for collectives; being process-wide,
  a deferred start can never sit behind a blocking call on another
  communicator. Unstaged exchanges start at once (after that FIFO).

``force_host_staging=True`` (or the environment switch
``SPARSE_DIST_FORCE_HOST_STAGING=1``, read when a world communicator is
made, e.g. to benchmark the fallback with ``sparse-dist bench``) sends CPU
tensors through the same staging path (ordinary host memory, synchronous
copies, same pool, deferral and write-back), which is how the fallback is
tested on machines without a GPU.

Segmented reduce: :meth:`Communicator.ireduce` of more than
``reduce_segment_bytes`` (default :data:`DEFAULT_REDUCE_SEGMENT_BYTES`,
environment ``SPARSE_DIST_REDUCE_SEGMENT_BYTES``; 0 turns it off) posts one
``Ireduce`` per contiguous slice of the flat buffer, all in flight at once,
behind one :class:`Pending`: MPICH reduces a large message far more slowly
than the same bytes as a few MiB pieces. The setting must be the same on
every rank (a world communicator checks this when it is made).
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import functools
import os
import pickle
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import mpi4py
import numpy as np
import torch

mpi4py.rc.initialize = False  # started by _initialised() on first use, not at import
mpi4py.rc.finalize = True     # still finalised by mpi4py at exit once started
from mpi4py import MPI  # noqa: E402

from sparse_dist.accounting import CommStats, ring_allreduce_bytes
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

GPU_AWARE_SETTINGS: tuple[str, ...] = ("auto", "on", "off", "force")
FORCE_HOST_STAGING_ENV = "SPARSE_DIST_FORCE_HOST_STAGING"
REDUCE_SEGMENT_ENV = "SPARSE_DIST_REDUCE_SEGMENT_BYTES"
DEFAULT_REDUCE_SEGMENT_BYTES = 1 << 20
"""Ireduce segment size. A 256 MB float32 reduce on 2 ranks of a 2-core box (MPICH 5.0.2, shared memory) took
0.6-1.1 s whole and 0.25-0.5 s in 0.5-1 MiB segments; 2-4 MiB segments were as good only on an idle machine."""
STAGING_IDLE_LIMIT_BYTES = 1 << 30
"""Idle host staging memory a pool keeps; beyond it the least recently returned buffers are dropped."""

_CUDA_ENV_SWITCHES = ("MPICH_GPU_SUPPORT_ENABLED", "MV2_USE_CUDA")  # Cray MPICH, MVAPICH2
_MPIX_GPU_SUPPORT_CUDA = 0  # MPICH mpi.h: MPIX_GPU_SUPPORT_CUDA


DISTINCT_MESSAGES_SHOWN = 5
"""How many distinct messages :func:`ranked_messages` lists before it only counts the rest."""


def rank_ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"ranks 0-2, 5, 7-8"``; one rank: ``"rank 3"``."""
    ordered = sorted(set(ranks))
    spans: list[str] = []
    start = previous = ordered[0]
    for rank in ordered[1:] + [None]:  # type: ignore[list-item]
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        spans.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(spans)


def ranked_messages(failed: Sequence[tuple[int, str]], size: int) -> str:
    """One text for the messages ``(rank, message)`` of several ranks: each distinct message once, prefixed with
    the ranks that said it (in order of the lowest such rank), at most :data:`DISTINCT_MESSAGES_SHOWN`, then
    ``and N more distinct messages (ranks ...)``. A job of one rank gets the bare message."""
    if size == 1:
        return "; ".join(message for _, message in failed)
    by_message: dict[str, list[int]] = {}
    for rank, message in failed:
        by_message.setdefault(message, []).append(rank)
    items = sorted(by_message.items(), key=lambda item: min(item[1]))
    shown = [f"{rank_ranges(ranks)}: {message}" for message, ranks in items[:DISTINCT_MESSAGES_SHOWN]]
    rest = items[DISTINCT_MESSAGES_SHOWN:]
    if rest:
        shown.append(f"and {len(rest)} more distinct message{'s' if len(rest) > 1 else ''} "
                     f"({rank_ranges([rank for _, ranks in rest for rank in ranks])})")
    return "; ".join(shown)


class CollectiveError(RuntimeError):
    """Raised identically on every rank when any rank found a problem."""


class GpuAwareError(ValueError):
    """``gpu_aware='on'`` but the MPI library reports no CUDA support.

    Raised before ``Dup`` or any collective and without communicating: the
    decision depends only on the loaded MPI library and the environment,
    which are the same on every rank of a job, so every rank raises it.
    """


def mpi_library_version() -> str:
    """The MPI library's own version string (first line)."""
    return MPI.Get_library_version().strip().splitlines()[0]


def mpi_vendor_details() -> dict[str, str]:
    """MPI standard version, library version line and mpi4py version, for results files."""
    major, minor = MPI.Get_version()
    return {"mpi_standard": f"{major}.{minor}", "mpi_library": mpi_library_version(), "mpi4py": mpi4py.__version__}


# ------------------------------------------------------------------ CUDA-aware MPI detection
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


def _reduce_segment_setting(value: int | None) -> int:
    """The reduce segment size in bytes: ``value``, else the environment, else the default (0: no segments)."""
    if value is None:
        text = os.environ.get(REDUCE_SEGMENT_ENV)
        if text is None or not text.strip():
            return DEFAULT_REDUCE_SEGMENT_BYTES
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{REDUCE_SEGMENT_ENV} must be a whole number of bytes, got {text!r}") from None
    return max(0, int(value))


def _segments(numel: int, itemsize: int, segment_bytes: int) -> list[tuple[int, int]]:
    """Element ranges ``[lo, hi)`` cutting ``numel`` elements into pieces of at most ``segment_bytes``."""
    if segment_bytes <= 0 or numel * itemsize <= segment_bytes:
        return [(0, numel)]
    step = max(1, segment_bytes // itemsize)
    return [(lo, min(numel, lo + step)) for lo in range(0, numel, step)]


def _mpi_type(tensor: torch.Tensor) -> Any:
    """The MPI datatype of a contiguous tensor; clear errors for anything MPI cannot take."""
    if not tensor.is_contiguous():
        raise ValueError("MPI buffers must be contiguous tensors; call .contiguous() first")
    try:
        return _MPI_TYPES[tensor.dtype]
    except KeyError:
        raise TypeError(f"no MPI datatype for torch dtype {tensor.dtype}; "
                        f"supported: {sorted(str(d) for d in _MPI_TYPES)}") from None


# ------------------------------------------------------------------ host staging pool
class _Loan:
    """One host staging buffer and the CUDA event of the last copy that reads it (if any)."""

    __slots__ = ("tensor", "key", "copy_done")

    def __init__(self, tensor: torch.Tensor, key: tuple[int, torch.dtype, bool]) -> None:
        self.tensor = tensor
        self.key = key
        self.copy_done: Any = None

    def settle(self) -> None:
        """Wait for a host-to-device copy still reading this buffer."""
        if self.copy_done is not None:
            self.copy_done.synchronize()
            self.copy_done = None


class StagingPool:
    """Host staging buffers allocated once per ``(numel, dtype, pinned)`` and reused.

    A buffer is lent to one exchange at a time (:meth:`acquire`) and comes
    back when that exchange completes (:meth:`release`), so outstanding
    requests never share one. Idle buffers beyond ``idle_limit_bytes`` are
    dropped, least recently returned first, so shapes that change every
    epoch (sampled exchanges) cannot grow the pool without bound.
    ``allocations`` counts buffers ever allocated (for tests and logs).
    """

    def __init__(self, idle_limit_bytes: int = STAGING_IDLE_LIMIT_BYTES) -> None:
        self.idle_limit_bytes = idle_limit_bytes
        self.allocations = 0
        self._idle: list[_Loan] = []
        self._idle_bytes = 0
        self._lock = threading.Lock()

    def acquire(self, numel: int, dtype: torch.dtype, pinned: bool) -> _Loan:
        """A host buffer of ``numel`` elements, exclusively the caller's until :meth:`release`."""
        key = (numel, dtype, pinned)
        loan = None
        with self._lock:
            for index in range(len(self._idle) - 1, -1, -1):
                if self._idle[index].key == key:
                    loan = self._idle.pop(index)
                    self._idle_bytes -= loan.tensor.nbytes
                    break
        if loan is None:
            loan = _Loan(torch.empty(numel, dtype=dtype, pin_memory=pinned), key)
            with self._lock:
                self.allocations += 1
            _log.debug("staging pool: new %s buffer of %d elements (%s)", dtype, numel,
                       "pinned" if pinned else "pageable")
        loan.settle()
        return loan

    def release(self, loan: _Loan) -> None:
        """Return a buffer; drop the oldest idle ones while idle memory exceeds the limit."""
        dropped = []
        with self._lock:
            self._idle.append(loan)
            self._idle_bytes += loan.tensor.nbytes
            while self._idle_bytes > self.idle_limit_bytes and len(self._idle) > 1:
                old = self._idle.pop(0)
                self._idle_bytes -= old.tensor.nbytes
                dropped.append(old)
        for old in dropped:
            old.settle()

    @property
    def idle_buffers(self) -> int:
        return len(self._idle)


# ------------------------------------------------------------------ pending exchanges
_deferred: collections.deque["Pending"] = collections.deque()
_deferred_lock = threading.RLock()


def _start_deferred() -> None:
    """Start every deferred exchange of this process, oldest first (post order, the same on every rank)."""
    with _deferred_lock:
        while _deferred:
            _deferred.popleft()._start()


class Pending:
    """A posted non-blocking exchange; :meth:`wait` (or a true :meth:`test`) completes it and books its time.

    A staged exchange may not be started in MPI yet (see "Deferred starts"
    in the module docstring); ``wait`` and ``test`` first start it and every
    exchange posted before it.
    """

    def __init__(self, stats: CommStats, phase: str) -> None:
        self._stats = stats
        self._phase = phase
        self._starts: list[Callable[[], Any]] = []
        self._requests: list[Any] = []
        self._ready: list[Any] = []       # CUDA events MPI must wait for before it starts
        self._finishers: list[Callable[[], None]] = []
        self._keep_alive: list[Any] = []
        self._loans: list[tuple[StagingPool, _Loan]] = []
        self._staged = False
        self._started = False
        self._done = False
        self._seconds = 0.0

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        begin = time.perf_counter()
        for event in self._ready:
            event.synchronize()
        self._ready.clear()
        self._requests = [start() for start in self._starts]
        self._starts.clear()
        self._seconds += time.perf_counter() - begin

    def test(self) -> bool:
        """True (and completed) if the exchange has finished; never blocks on it."""
        if self._done:
            return True
        _start_deferred()
        begin = time.perf_counter()
        finished = bool(MPI.Request.Testall(self._requests))
        self._seconds += time.perf_counter() - begin
        if finished:
            self._complete()
        return finished

    def wait(self) -> None:
        """Block until the exchange has finished; received data is then in the caller's tensors."""
        if self._done:
            return
        _start_deferred()
        begin = time.perf_counter()
        MPI.Request.Waitall(self._requests)
        self._seconds += time.perf_counter() - begin
        self._complete()

    def _complete(self) -> None:
        begin = time.perf_counter()
        for finish in self._finishers:
            finish()
        for pool, loan in self._loans:
            pool.release(loan)
        self._stats.add_seconds(self._phase, self._seconds + time.perf_counter() - begin)
        self._done = True
        self._finishers.clear()
        self._loans.clear()
        self._keep_alive.clear()


# ------------------------------------------------------------------ communicator
class Communicator:
    """Torch-tensor collectives over a private duplicate of an MPI communicator.

    Collective: constructing, :meth:`split` and every exchange method must be
    called by every rank of the communicator, in the same order. Settings:
    ``gpu_aware`` (``auto``/``on``/``off``/``force``, see the module
    docstring; checked before ``Dup``), ``force_host_staging``,
    ``reduce_segment_bytes``; ``split`` children inherit them, the stats and
    the staging pool.
    """

    def __init__(self, mpi_comm: Any = None, *, gpu_aware: str | bool = "auto",
                 force_host_staging: bool = False, stats: CommStats | None = None,
                 reduce_segment_bytes: int | None = None, _owned: Any = None,
                 _parent: Communicator | None = None) -> None:
        base = _initialised() if mpi_comm is None else mpi_comm
        if _parent is not None:
            self.gpu_aware, self.gpu_path = _parent.gpu_aware, _parent.gpu_path
            self.staging_pool = _parent.staging_pool
            self.reduce_segment_bytes = _parent.reduce_segment_bytes
            force_host_staging = _parent.force_host_staging
        else:
            # Before Dup: `on` with a library without CUDA support raises here on every rank.
            self.gpu_aware, self.gpu_path = gpu_path_report(gpu_aware)
            self.staging_pool = StagingPool()
            self.reduce_segment_bytes = _reduce_segment_setting(reduce_segment_bytes)
            force_host_staging = force_host_staging or os.environ.get(FORCE_HOST_STAGING_ENV) == "1"
        self.force_host_staging = force_host_staging
        if _owned is None:
            _start_deferred()
        self._comm = _owned if _owned is not None else base.Dup()
        self.rank: int = self._comm.Get_rank()
        self.size: int = self._comm.Get_size()
        self.stats = stats if stats is not None else CommStats()
        self._side_streams: dict[int, Any] = {}
        if mpi_comm is None and _owned is None:
            set_rank(self.rank)
        if _parent is None:
            settings = self._comm.allgather(self.reduce_segment_bytes)
            if len(set(settings)) > 1:
                raise CollectiveError(f"reduce segment size differs between ranks ({settings} bytes; "
                                      f"check {REDUCE_SEGMENT_ENV}); it must be the same on every rank")

    # ----------------------------------------------------------------- setup
    def split(self, color: int, key: int) -> "Communicator":
        """Sub-communicator of the ranks with the same ``color``, ordered by ``key`` (collective).

        The sub-communicator books its bytes into this communicator's
        counters and shares its staging pool and settings.
        """
        _start_deferred()
        sub = self._comm.Split(color, key)
        return Communicator(stats=self.stats, _owned=sub, _parent=self)

    def free(self) -> None:
        """Release the duplicated MPI communicator (collective)."""
        _start_deferred()
        if self._comm != MPI.COMM_NULL:
            self._comm.Free()

    # ------------------------------------------------------------ buffers
    def _side_stream(self, device: torch.device) -> Any:
        """This communicator's copy stream on ``device``, created on first use."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._side_streams:
            self._side_streams[index] = torch.cuda.Stream(device=index)
        return self._side_streams[index]

    def _buffer(self, pending: Pending, tensor: torch.Tensor, *, reads: bool, writes_back: bool) -> tuple[Any, Any]:
        """A flat MPI buffer for ``tensor`` and its datatype.

        ``reads``: MPI reads the tensor's data (a send, an in-place or
        allreduce buffer); ``writes_back``: MPI's result must land in the
        tensor. Staged buffers are copied in now and back by ``pending``'s
        finishers.
        """
        mpi_type = _mpi_type(tensor)
        flat = tensor.detach().view(-1)
        if tensor.is_cuda and self.gpu_aware:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(tensor.device))
            pending._ready.append(ready)  # MPI starts after the producer's queued kernels, not after the whole device
            pending._keep_alive.append(tensor)
            return flat, mpi_type
        if not tensor.is_cuda and not self.force_host_staging:
            pending._keep_alive.append(tensor)
            return flat.numpy(), mpi_type
        loan = self.staging_pool.acquire(flat.numel(), flat.dtype, pinned=tensor.is_cuda)
        pending._loans.append((self.staging_pool, loan))
        pending._keep_alive.append(tensor)
        pending._staged = True
        host = loan.tensor
        if tensor.is_cuda:
            self._stage_cuda(pending, flat, loan, reads=reads, writes_back=writes_back)
        else:
            if reads:
                host.copy_(flat)
            if writes_back:
                pending._finishers.append(lambda: flat.copy_(host))
        return host.numpy(), mpi_type

    def _stage_cuda(self, pending: Pending, flat: torch.Tensor, loan: _Loan, *, reads: bool,
                    writes_back: bool) -> None:
        """Queue the copies between a CUDA tensor and its pinned host buffer on the side stream."""
        host = loan.tensor
        side = self._side_stream(flat.device)
        if reads:
            produced = torch.cuda.Event()
            produced.record(torch.cuda.current_stream(flat.device))
            side.wait_event(produced)
            with torch.cuda.device(flat.device), torch.cuda.stream(side):
                host.copy_(flat, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(side)
            flat.record_stream(side)
            pending._ready.append(copied)
        if writes_back:
            def write_back() -> None:
                consumer = torch.cuda.current_stream(flat.device)
                side.wait_stream(consumer)  # after the consumer's queued work on this memory
                with torch.cuda.device(flat.device), torch.cuda.stream(side):
                    flat.copy_(host, non_blocking=True)
                done = torch.cuda.Event()
                done.record(side)
                consumer.wait_event(done)  # later kernels on the current stream see the data
                flat.record_stream(side)
                loan.copy_done = done      # the pool waits for it before lending the buffer again

            pending._finishers.append(write_back)

    def _post(self, phase: str, build: Callable[[Pending], list[Callable[[], Any]]], sent: int,
              recv: int) -> Pending:
        """Stage buffers (``build`` returns the MPI starts) and start now, or defer if staged."""
        pending = Pending(self.stats, phase)
        begin = time.perf_counter()
        pending._starts = build(pending)
        self.stats.add_bytes(phase, sent, recv)
        pending._seconds += time.perf_counter() - begin
        with _deferred_lock:
            _start_deferred()  # earlier posts first, in post order
            if pending._staged:
                _deferred.append(pending)
            else:
                pending._start()
        return pending

    # --------------------------------------------------------- collectives
    def ibcast_(self, tensor: torch.Tensor, root: int, phase: str) -> Pending:
        """Post a broadcast of ``tensor`` from ``root`` into ``tensor`` on every rank."""
        _mpi_type(tensor)
        nbytes = tensor.numel() * tensor.element_size()
        is_root = self.rank == root
        sent, recv = (nbytes * (self.size - 1), 0) if is_root else (0, nbytes)

        def build(pending: Pending) -> list[Callable[[], Any]]:
            buf, mpi_type = self._buffer(pending, tensor, reads=is_root, writes_back=not is_root)
            return [lambda: self._comm.Ibcast([buf, mpi_type], root=root)]

        return self._post(phase, build, sent, recv)

    def bcast_(self, tensor: torch.Tensor, root: int, phase: str) -> None:
        """Blocking :meth:`ibcast_`."""
        self.ibcast_(tensor, root, phase).wait()

    def ireduce(self, contribution: torch.Tensor | None, result: torch.Tensor | None,
                root: int, phase: str) -> Pending:
        """Post a sum of every rank's ``contribution`` into ``result`` at ``root``.

        At the root, ``contribution=None`` means "my contribution is already in
        ``result``" (in place). Non-roots pass ``result=None``. Buffers above
        ``reduce_segment_bytes`` go as several ``Ireduce`` calls on
        contiguous slices (in place too), all in flight, one :class:`Pending`.
        """
        is_root = self.rank == root
        probe = result if is_root else contribution
        if probe is None:
            raise ValueError("ireduce: the root needs `result`, other ranks need `contribution`")
        _mpi_type(probe)
        if is_root and contribution is not None:
            _mpi_type(contribution)
            if contribution.numel() != probe.numel() or contribution.dtype != probe.dtype:
                raise ValueError(f"ireduce: contribution ({contribution.numel()} x {contribution.dtype}) and result "
                                 f"({probe.numel()} x {probe.dtype}) differ")
        itemsize = probe.element_size()
        segments = _segments(probe.numel(), itemsize, self.reduce_segment_bytes)
        # Counted per segment; the totals equal one unsegmented reduce of the whole buffer.
        nbytes = sum((hi - lo) * itemsize for lo, hi in segments)
        sent, recv = (0, nbytes * (self.size - 1)) if is_root else (nbytes, 0)

        def build(pending: Pending) -> list[Callable[[], Any]]:
            send_buf: Any = None
            recv_buf: Any = None
            if is_root:
                assert result is not None
                recv_buf, mpi_type = self._buffer(pending, result, reads=contribution is None, writes_back=True)
                if contribution is not None:
                    send_buf, _ = self._buffer(pending, contribution, reads=True, writes_back=False)
            else:
                assert contribution is not None
                send_buf, mpi_type = self._buffer(pending, contribution, reads=True, writes_back=False)

            def segment(lo: int, hi: int) -> Callable[[], Any]:
                def start() -> Any:
                    if not is_root:
                        return self._comm.Ireduce([send_buf[lo:hi], mpi_type], None, op=MPI.SUM, root=root)
                    send = MPI.IN_PLACE if send_buf is None else [send_buf[lo:hi], mpi_type]
                    return self._comm.Ireduce(send, [recv_buf[lo:hi], mpi_type], op=MPI.SUM, root=root)
                return start

            return [segment(lo, hi) for lo, hi in segments]

        return self._post(phase, build, sent, recv)

    def igather_(self, piece: torch.Tensor | None, gathered: torch.Tensor | None, root: int, phase: str) -> Pending:
        """Post a gather of equal pieces to ``root``: every other rank passes its ``piece``; the root passes
        ``gathered`` (``size`` pieces, flat along the first dimension) and its own slot is left untouched.

        Counted like the reduce it stands in for (a sum MPI cannot do, e.g. of compressed rows): every
        other rank sends its piece, the root receives ``size - 1`` pieces.
        """
        is_root = self.rank == root
        probe = gathered if is_root else piece
        if probe is None:
            raise ValueError("igather_: the root needs `gathered`, other ranks need `piece`")
        _mpi_type(probe)
        nbytes = probe.numel() * probe.element_size()
        sent, recv = (0, nbytes // self.size * (self.size - 1)) if is_root else (nbytes, 0)

        def build(pending: Pending) -> list[Callable[[], Any]]:
            if is_root:
                assert gathered is not None
                buf, mpi_type = self._buffer(pending, gathered, reads=True, writes_back=True)
                count = gathered.numel() // self.size
                return [lambda: self._comm.Igather(MPI.IN_PLACE, [buf, count, mpi_type], root=root)]
            assert piece is not None
            buf, mpi_type = self._buffer(pending, piece, reads=True, writes_back=False)
            return [lambda: self._comm.Igather([buf, mpi_type], None, root=root)]

        return self._post(phase, build, sent, recv)

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
        _mpi_type(send)
        _mpi_type(recv)
        item = send.element_size()
        sent = int(send_counts.sum() - send_counts[self.rank]) * item
        received = int(recv_counts.sum() - recv_counts[self.rank]) * item

        def build(pending: Pending) -> list[Callable[[], Any]]:
            send_buf, send_type = self._buffer(pending, send, reads=True, writes_back=False)
            recv_buf, recv_type = self._buffer(pending, recv, reads=False, writes_back=True)
            pending._keep_alive.extend((send_counts, recv_counts, send_displs, recv_displs))
            return [lambda: self._comm.Ialltoallv([send_buf, (send_counts, send_displs), send_type],
                                                  [recv_buf, (recv_counts, recv_displs), recv_type])]

        return self._post(phase, build, sent, received)

    def alltoallv(self, send: torch.Tensor, send_rows: Sequence[int], recv: torch.Tensor,
                  recv_rows: Sequence[int], phase: str) -> None:
        """Blocking :meth:`ialltoallv`."""
        self.ialltoallv(send, send_rows, recv, recv_rows, phase).wait()

    def allreduce_(self, tensor: torch.Tensor, phase: str, op: str = "sum") -> None:
        """In-place allreduce (``sum``, ``max`` or ``min``) of a contiguous tensor."""
        _mpi_type(tensor)
        moved = ring_allreduce_bytes(tensor.numel(), self.size, self.rank, tensor.element_size())

        def build(pending: Pending) -> list[Callable[[], Any]]:
            buf, mpi_type = self._buffer(pending, tensor, reads=True, writes_back=True)
            return [lambda: self._comm.Iallreduce(MPI.IN_PLACE, [buf, mpi_type], op=_MPI_OPS[op])]

        self._post(phase, build, moved, moved).wait()

    def allgather_array(self, values: np.ndarray, phase: str = "other") -> np.ndarray:
        """Gather an equally shaped int64/float64 array from every rank: shape ``(size, *values.shape)``."""
        _start_deferred()
        values = np.ascontiguousarray(values)
        out = np.empty((self.size, *values.shape), dtype=values.dtype)
        start = time.perf_counter()
        self._comm.Allgather(values, out)
        self.stats.add_bytes(phase, values.nbytes * (self.size - 1), values.nbytes * (self.size - 1))
        self.stats.add_seconds(phase, time.perf_counter() - start)
        return out

    def allgather_object(self, obj: Any, phase: str = "other") -> list[Any]:
        """Gather a small picklable object from every rank (metadata only)."""
        _start_deferred()
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

        Each distinct message is said once, with the world ranks that passed it (``ranks 0-7: MSG``; at most
        :data:`DISTINCT_MESSAGES_SHOWN` of them, then how many more), so the same text is raised everywhere and
        no rank is left inside a collective. On a communicator that holds every rank of the world, the
        exception is marked ``every_rank`` so that :func:`run_or_abort` says it once (world rank 0) and ends
        the job without ``MPI_Abort``; on a smaller communicator the ranks outside it did not raise, so it is
        left unmarked and ends the job through ``MPI_Abort``.
        """
        errors = self.allgather_object((_initialised().Get_rank(), error))
        failed = [(rank, message) for rank, message in errors if message is not None]
        if failed:
            exception = exc_type(ranked_messages(failed, self.size))
            if self.size == _initialised().Get_size():
                exception.every_rank = True  # type: ignore[attr-defined]
            raise exception

    def barrier(self) -> None:
        """Blocking barrier (collective)."""
        _start_deferred()
        self._comm.Barrier()

    def idle_barrier(self, poll_seconds: float = 0.005) -> None:
        """A barrier that sleeps instead of spinning, so waiting ranks leave the cores free."""
        _start_deferred()
        request = self._comm.Ibarrier()
        while not request.Test():
            time.sleep(poll_seconds)


class ProgressThread:
    """Drives MPI's progress engine while non-blocking exchanges are outstanding (a daemon thread).

    Every ``interval`` seconds, while ``busy()`` is true, it calls ``MPI_Iprobe`` on a private duplicate of
    ``comm``: the probe completes no request, so it never races the main thread's waits and tests, but an
    MPI library that progresses on every call (MPICH, Open MPI) moves the outstanding transfers on meanwhile.
    Needs ``MPI_THREAD_MULTIPLE`` (which :func:`world` asks for). Construction is collective over ``comm``
    (one ``Dup``); the thread stops at :meth:`stop` or at interpreter exit, before MPI is finalised.
    """

    def __init__(self, comm: Communicator, busy: Callable[[], bool], interval: float = 1e-4) -> None:
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            raise CollectiveError("a progress thread needs MPI_THREAD_MULTIPLE; this MPI gave "
                                  f"thread level {MPI.Query_thread()}")
        _start_deferred()
        self._probe = comm._comm.Dup()
        self._busy, self._interval = busy, interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mpi-progress", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # runs before mpi4py's finalize (registered at import, so later in LIFO)

    def _run(self) -> None:
        while not self._stopped.is_set():
            if self._busy():
                self._probe.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
                time.sleep(self._interval)
            else:
                self._stopped.wait(10 * self._interval)

    def stop(self) -> None:
        """Stop the thread (local; idempotent)."""
        self._stopped.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()


def _initialised() -> Any:
    """``MPI.COMM_WORLD``, starting MPI first if this process has not yet."""
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    return MPI.COMM_WORLD


def world(*, gpu_aware: str | bool = "auto", force_host_staging: bool = False,
          reduce_segment_bytes: int | None = None) -> Communicator:
    """The facade over a duplicate of ``MPI.COMM_WORLD`` (collective; starts MPI on first use).

    Raises :class:`GpuAwareError` on every rank, before any collective, for
    ``gpu_aware='on'`` with an MPI library that reports no CUDA support.
    """
    return Communicator(None, gpu_aware=gpu_aware, force_host_staging=force_host_staging,
                        reduce_segment_bytes=reduce_segment_bytes)


def world_rank() -> int:
    return _initialised().Get_rank()


def run_or_abort(main: Callable[[], int], *, user_errors: tuple[type[BaseException], ...] = (),
                 debug: bool = False, prog: str = "error",
                 describe: Callable[[BaseException], tuple[str, int] | None] | None = None) -> int:
    """Run ``main``; if it raises on any rank, end the whole job non-zero, never hanging.

    Internal errors: the failing rank writes its traceback, prefixed with its
    rank, to stderr and calls ``MPI_Abort`` on the world communicator, so
    ranks waiting in a collective are killed instead of hanging (the
    semantics of ``python -m mpi4py``). A non-zero ``SystemExit`` (also what
    the command's SIGTERM handler raises) counts as a failure too.

    User errors (instances of ``user_errors``: bad input, named by the
    message) are one line ``PROG: error: MESSAGE`` and exit status 2, with
    no traceback unless ``debug``:

    * raised on every rank at the same point (collective validation, e.g.
      :meth:`Communicator.raise_if_any` on the world, marks the exception with
      a true ``every_rank`` attribute; its message already names the ranks of
      each distinct message): world rank 0 alone writes the line and every
      rank returns 2; no abort is needed, since no rank is left inside a
      collective. An internal error marked ``every_rank`` is likewise written
      once (rank 0, with its traceback) and every rank returns 1;
    * otherwise (possibly this rank alone): this rank writes the line, the
      others write nothing, and the job is aborted with status 2.

    ``describe(exc)`` may turn any other exception into ``(sentence, status)``
    (out of memory, a full disk, an interrupt): the sentence is one line
    ``PROG: error: SENTENCE``, written by this rank, and the job ends with
    ``status``. ``KeyboardInterrupt`` and ``SystemExit`` (signals, which reach
    every rank of a job) are said by world rank 0, and by another rank only if
    rank 0's abort has not ended it within a grace (:func:`_report_sentence`).

    Before ``MPI_Abort`` the aborting rank unlinks the MPICH shared-memory
    segments it has mapped (``/dev/shm/mpich_shm_*``), which MPICH removes
    only in ``MPI_Finalize`` and an aborted job would leave behind.
    """
    try:
        return main()
    except SystemExit as exc:
        if exc.code in (None, 0):
            raise
        code = exc.code if isinstance(exc.code, int) else 1
        described = describe(exc) if describe is not None else None
        if described is not None:
            return _report_sentence(exc, prog, debug, *described)
        _abort_with(f"exit status {exc.code}", code)
    except user_errors as exc:
        return _report_user_error(exc, prog, debug)
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        described = describe(exc) if describe is not None else None
        if described is not None:
            return _report_sentence(exc, prog, debug, *described)
        if getattr(exc, "every_rank", False):
            if _initialised().Get_rank() == 0:
                _write_traceback(exc)
                sys.stderr.flush()
            return 1
        _write_traceback(exc)
        _abort_with(f"{type(exc).__name__}: {exc}", 1)
    return 1


ABORT_GRACE_SECONDS = 0.5
SIGNAL_GRACE_SECONDS = 2.0
USER_ERROR_STATUS = 2
_MPICH_SEGMENT_PREFIX = "/dev/shm/mpich_shm_"


def _write_traceback(exc: BaseException) -> None:
    rank = _initialised().Get_rank()
    details = "".join(traceback.format_exception(exc))
    sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in details.rstrip().splitlines()))


def _report_user_error(exc: BaseException, prog: str, debug: bool) -> int:
    """One line for a user error (see :func:`run_or_abort`); aborts unless every rank raised it."""
    world_comm = _initialised()
    rank, size = world_comm.Get_rank(), world_comm.Get_size()
    if getattr(exc, "every_rank", False):
        if rank == 0:
            if debug:
                _write_traceback(exc)
            sys.stderr.write(f"{prog}: error: {exc}\n")
            sys.stderr.flush()
        return USER_ERROR_STATUS
    if debug:
        _write_traceback(exc)
    where = f" (rank {rank} of {size}; ending the job)" if size > 1 else ""
    sys.stderr.write(f"{prog}: error: {exc}{where}\n")
    _abort_with(None, USER_ERROR_STATUS)
    return USER_ERROR_STATUS


def _report_sentence(exc: BaseException, prog: str, debug: bool, sentence: str, status: int) -> int:
    """One line for an exception :func:`run_or_abort`'s ``describe`` explained, then end the job with ``status``.

    Signals (``KeyboardInterrupt``, ``SystemExit``) reach every rank of a job, so world rank 0 says them and
    aborts at once; another signalled rank waits :data:`SIGNAL_GRACE_SECONDS` (a little longer the higher its rank)
    for that abort to end it, and says the sentence and aborts itself only if it is still running then (rank 0 may
    be blocked inside a collective this rank left, where it cannot see its own signal). Anything else is said by
    the rank that raised it, with its rank when there are several.
    """
    world_comm = _initialised()
    rank, size = world_comm.Get_rank(), world_comm.Get_size()
    signalled = isinstance(exc, (KeyboardInterrupt, SystemExit))
    if signalled and rank != 0:
        try:
            time.sleep(SIGNAL_GRACE_SECONDS + 0.25 * min(rank, 8))
        except (KeyboardInterrupt, SystemExit):  # a second signal: stop waiting
            pass
    if debug:
        _write_traceback(exc)
    where = f" (rank {rank} of {size}; ending the job)" if size > 1 and not signalled else ""
    sys.stderr.write(f"{prog}: error: {sentence}{where}\n")
    _abort_with(None, status)
    return status


def _abort_with(reason: str | None, code: int) -> None:
    """Write ``reason`` (if any), then end the job: ``MPI_Abort`` when there are other ranks."""
    rank = _initialised().Get_rank()
    if reason is not None:
        sys.stderr.write(f"[rank {rank}] error: {reason}; aborting all ranks\n")
    sys.stderr.flush()
    if MPI.COMM_WORLD.Get_size() > 1:
        _unlink_mpich_segments()
        # Let the launcher forward this message before MPI_Abort tears the job down (without the pause an
        # abort from every rank at once sometimes lost all output).
        time.sleep(ABORT_GRACE_SECONDS)
        MPI.COMM_WORLD.Abort(code)
    raise SystemExit(code)


def _unlink_mpich_segments() -> None:
    """Unlink the MPICH shared-memory files this process maps; the mappings stay valid until exit.

    Only this job's processes map them, and the job is about to be aborted, so nothing attaches to them again.
    Segments on other nodes (mapped only by ranks there) are not reached.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            fields = [line.rstrip("\n").split(maxsplit=5) for line in maps]
    except OSError:
        return
    paths = {f[5] for f in fields if len(f) == 6 and f[5].startswith(_MPICH_SEGMENT_PREFIX)
             and not f[5].endswith("(deleted)")}
    for path in sorted(paths):
        try:
            os.unlink(path)
            _log.debug("removed MPICH shared-memory segment %s before aborting", path)
        except OSError:
            pass


def ranks_on_this_node() -> int:
    """How many ranks of the world share this node (for a default thread count; collective over the world)."""
    _start_deferred()
    local = _initialised().Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_size()
    finally:
        local.Free()


def default_threads_per_rank() -> int:
    """``SLURM_CPUS_PER_TASK`` if set, else the cores this process may use divided by the ranks on its node.

    Collective over the world: the ranks on this node are counted on every rank, whatever its
    environment says, so a variable set on some ranks only cannot leave others in the split.
    """
    on_node = ranks_on_this_node()
    slurm = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm and slurm.isdigit():
        return int(slurm)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // on_node)
