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
from sparse_dist.comm.buffers import TensorBuffers, mpi_datatype
from sparse_dist.comm.cuda_aware import gpu_path_report
from sparse_dist.comm.heralds import (Herald, allreduce_herald, alltoallv_herald, bcast_herald, gather_herald,
                                      reduce_herald)
from sparse_dist.comm.layouts import _segments, alltoallv_layout, reduce_probe
from sparse_dist.comm.requests import Pending, _deferred, _deferred_lock, _start_deferred
from sparse_dist.comm.staging import FORCE_HOST_STAGING_ENV, StagingPool
from sparse_dist.comm.startup import MPI, _initialised
from sparse_dist.log import set_rank

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


def _world_settings(gpu_aware: str | bool, force_host_staging: bool,
                    reduce_segment_bytes: int | None) -> tuple[bool, str, StagingPool, int, bool]:
    """A world communicator's ``(gpu_aware, gpu_path, staging_pool, reduce_segment_bytes, force_host_staging)``
    from its arguments and the environment (``split`` children inherit them). Local, before ``Dup``."""
    aware, path = gpu_path_report(gpu_aware)
    forced = force_host_staging or os.environ.get(FORCE_HOST_STAGING_ENV) == "1"
    return aware, path, StagingPool(), _reduce_segment_setting(reduce_segment_bytes), forced


def _agree_segment_bytes(mpi_comm: Any, segment_bytes: int) -> None:
    """Raise on every rank unless the reduce segment size is the same everywhere (collective)."""
    settings = mpi_comm.allgather(segment_bytes)
    if len(set(settings)) > 1:
        raise CollectiveError(f"reduce segment size differs between ranks ({settings} bytes; "
                              f"check {REDUCE_SEGMENT_ENV}); it must be the same on every rank")


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
            settings = (_parent.gpu_aware, _parent.gpu_path, _parent.staging_pool, _parent.reduce_segment_bytes,
                        _parent.force_host_staging)
        else:  # before Dup: `on` with a library without CUDA support raises here on every rank
            settings = _world_settings(gpu_aware, force_host_staging, reduce_segment_bytes)
        self.gpu_aware, self.gpu_path, self.staging_pool, self.reduce_segment_bytes, self.force_host_staging = settings
        if _owned is None:
            _start_deferred()
        self._comm = _owned if _owned is not None else base.Dup()
        self.rank: int = self._comm.Get_rank()
        self.size: int = self._comm.Get_size()
        self.stats = stats if stats is not None else CommStats()
        self._buffers = TensorBuffers(self.gpu_aware, self.force_host_staging, self.staging_pool)
        if mpi_comm is None and _owned is None:
            set_rank(self.rank)
        if _parent is None:
            _agree_segment_bytes(self._comm, self.reduce_segment_bytes)

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

    def _post(self, phase: str, build: Callable[[Pending], list[Callable[[], Any]]], sent: int,
              recv: int, herald: Herald | None) -> Pending:
        """Stage buffers (``build`` returns the MPI starts) and start now, or defer if staged; ``herald`` starts
        right before them (:mod:`sparse_dist.comm.heralds`)."""
        pending = Pending(self.stats, phase)
        begin = time.perf_counter()
        pending._herald_start = herald
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
        mpi_datatype(tensor)
        nbytes = tensor.numel() * tensor.element_size()
        is_root = self.rank == root
        sent, recv = (nbytes * (self.size - 1), 0) if is_root else (0, nbytes)

        def build(pending: Pending) -> list[Callable[[], Any]]:
            buf, mpi_type = self._buffers.buffer(pending, tensor, reads=is_root, writes_back=not is_root)
            return [lambda: self._comm.Ibcast([buf, mpi_type], root=root)]

        return self._post(phase, build, sent, recv, bcast_herald(self._comm, root))

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
        probe = reduce_probe(contribution, result, is_root)
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
                recv_buf, mpi_type = self._buffers.buffer(pending, result, reads=contribution is None, writes_back=True)
                if contribution is not None:
                    send_buf, _ = self._buffers.buffer(pending, contribution, reads=True, writes_back=False)
            else:
                assert contribution is not None
                send_buf, mpi_type = self._buffers.buffer(pending, contribution, reads=True, writes_back=False)

            def segment(lo: int, hi: int) -> Callable[[], Any]:
                def start() -> Any:
                    if not is_root:
                        return self._comm.Ireduce([send_buf[lo:hi], mpi_type], None, op=MPI.SUM, root=root)
                    send = MPI.IN_PLACE if send_buf is None else [send_buf[lo:hi], mpi_type]
                    return self._comm.Ireduce(send, [recv_buf[lo:hi], mpi_type], op=MPI.SUM, root=root)
                return start

            return [segment(lo, hi) for lo, hi in segments]

        return self._post(phase, build, sent, recv, reduce_herald(self._comm, root))

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
        mpi_datatype(probe)
        nbytes = probe.numel() * probe.element_size()
        sent, recv = (0, nbytes // self.size * (self.size - 1)) if is_root else (nbytes, 0)

        def build(pending: Pending) -> list[Callable[[], Any]]:
            if is_root:
                assert gathered is not None
                buf, mpi_type = self._buffers.buffer(pending, gathered, reads=True, writes_back=True)
                count = gathered.numel() // self.size
                return [lambda: self._comm.Igather(MPI.IN_PLACE, [buf, count, mpi_type], root=root)]
            assert piece is not None
            buf, mpi_type = self._buffers.buffer(pending, piece, reads=True, writes_back=False)
            return [lambda: self._comm.Igather([buf, mpi_type], None, root=root)]

        return self._post(phase, build, sent, recv, gather_herald(self._comm, root))

    def ialltoallv(self, send: torch.Tensor, send_rows: Sequence[int], recv: torch.Tensor,
                   recv_rows: Sequence[int], phase: str) -> Pending:
        """Post a personalised exchange of row blocks.

        ``send`` holds the rows for rank 0, then rank 1, ... (``send_rows[k]``
        rows for rank ``k``); ``recv`` receives ``recv_rows[k]`` rows from rank
        ``k`` in rank order. Rows are the first dimension; all other
        dimensions must agree between ``send`` and ``recv``.
        """
        send_counts, send_displs, recv_counts, recv_displs = alltoallv_layout(send, send_rows, recv, recv_rows,
                                                                              self.size)
        item = send.element_size()
        sent = int(send_counts.sum() - send_counts[self.rank]) * item
        received = int(recv_counts.sum() - recv_counts[self.rank]) * item

        def build(pending: Pending) -> list[Callable[[], Any]]:
            send_buf, send_type = self._buffers.buffer(pending, send, reads=True, writes_back=False)
            recv_buf, recv_type = self._buffers.buffer(pending, recv, reads=False, writes_back=True)
            pending._keep_alive.extend((send_counts, recv_counts, send_displs, recv_displs))
            return [lambda: self._comm.Ialltoallv([send_buf, (send_counts, send_displs), send_type],
                                                  [recv_buf, (recv_counts, recv_displs), recv_type])]

        return self._post(phase, build, sent, received, alltoallv_herald(self._comm, send_counts, recv_counts))

    def alltoallv(self, send: torch.Tensor, send_rows: Sequence[int], recv: torch.Tensor,
                  recv_rows: Sequence[int], phase: str) -> None:
        """Blocking :meth:`ialltoallv`."""
        self.ialltoallv(send, send_rows, recv, recv_rows, phase).wait()

    def allreduce_(self, tensor: torch.Tensor, phase: str, op: str = "sum") -> None:
        """In-place allreduce (``sum``, ``max`` or ``min``) of a contiguous tensor."""
        mpi_datatype(tensor)
        moved = ring_allreduce_bytes(tensor.numel(), self.size, self.rank, tensor.element_size())

        def build(pending: Pending) -> list[Callable[[], Any]]:
            buf, mpi_type = self._buffers.buffer(pending, tensor, reads=True, writes_back=True)
            return [lambda: self._comm.Iallreduce(MPI.IN_PLACE, [buf, mpi_type], op=_MPI_OPS[op])]

        self._post(phase, build, moved, moved, allreduce_herald(self._comm)).wait()

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
