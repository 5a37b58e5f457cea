"""The :class:`Communicator`: torch-tensor collectives over a private duplicate of an MPI communicator, with the
byte convention, the MPI datatypes and the segmented reduce described in :mod:`sparse_dist.comm`."""

from __future__ import annotations

import os
import pickle
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from sparse_dist.accounting import CommStats, ring_allreduce_bytes
from sparse_dist.comm.abort import CollectiveError, ranked_messages, said_once
from sparse_dist.comm.cuda_aware import gpu_path_report
from sparse_dist.comm.requests import Pending, _deferred, _deferred_lock, _start_deferred
from sparse_dist.comm.staging import FORCE_HOST_STAGING_ENV, StagingPool, _Loan
from sparse_dist.comm.startup import MPI, _initialised
from sparse_dist.log import set_rank

_MPI_TYPES: dict[torch.dtype, Any] = {
    torch.float32: MPI.FLOAT,
    torch.float64: MPI.DOUBLE,
    torch.int32: MPI.INT32_T,
    torch.int64: MPI.INT64_T,
    torch.uint8: MPI.UINT8_T,
    torch.bool: MPI.C_BOOL,
}
_MPI_OPS = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}

REDUCE_SEGMENT_ENV = "SPARSE_DIST_REDUCE_SEGMENT_BYTES"
DEFAULT_REDUCE_SEGMENT_BYTES = 1 << 20
"""Ireduce segment size. A 256 MB float32 reduce on 2 ranks of a 2-core box (MPICH 5.0.2, shared memory) took
0.6-1.1 s whole and 0.25-0.5 s in 0.5-1 MiB segments; 2-4 MiB segments were as good only on an idle machine."""


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


class Communicator:
    """Torch-tensor collectives over a private duplicate of an MPI communicator.

    Collective: constructing, :meth:`split` and every exchange method must be
    called by every rank of the communicator, in the same order. Settings:
    ``gpu_aware`` (``auto``/``on``/``off``/``force``, see
    :mod:`sparse_dist.comm`; checked before ``Dup``), ``force_host_staging``,
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
            raise said_once(exception) if self.size == _initialised().Get_size() else exception

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


def world(*, gpu_aware: str | bool = "auto", force_host_staging: bool = False,
          reduce_segment_bytes: int | None = None) -> Communicator:
    """The facade over a duplicate of ``MPI.COMM_WORLD`` (collective; starts MPI on first use).

    Raises :class:`GpuAwareError` on every rank, before any collective, for
    ``gpu_aware='on'`` with an MPI library that reports no CUDA support.
    """
    return Communicator(None, gpu_aware=gpu_aware, force_host_staging=force_host_staging,
                        reduce_segment_bytes=reduce_segment_bytes)
