"""Heralds: a one-element message posted right before each non-blocking exchange, on the same communicator and
with the exchange's own pattern, so that a rank can tell its wait for late partners from the exchange itself
(see "Waits" in :mod:`sparse_dist.comm`).

A herald takes the same logical route as its exchange: a broadcast's herald is a one-byte broadcast from the
same root, a reduce's a one-byte reduce to the same root, a gather's a one-byte gather, an alltoallv's one byte
to each rank the exchange sends rows to (so it arrives from each rank that sends rows here), and an allreduce's a
barrier (every rank contributes to every result). So on each rank the herald completes once the ranks its part
of the exchange depends on have posted it, plus one small message's latency, and it adds no dependency the
exchange does not have. Herald bytes are protocol, not payload: they are not counted (as MPI's own headers are
not). A communicator of one rank has no partners and no herald.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from sparse_dist.comm.startup import MPI

Herald = Callable[[], Any]
"""Starts a herald in MPI and returns its request; it holds its buffers, so keep it until the request completes."""


def _byte() -> np.ndarray:
    return np.zeros(1, dtype=np.uint8)


def bcast_herald(comm: Any, root: int) -> Herald | None:
    """One byte broadcast from ``root``: at a non-root it completes once ``root`` (and the tree above) posted."""
    if comm.Get_size() == 1:
        return None
    buf = _byte()
    return lambda: comm.Ibcast([buf, MPI.BYTE], root=root)


def reduce_herald(comm: Any, root: int) -> Herald | None:
    """One byte reduced (max) to ``root``: at the root it completes once every rank posted."""
    if comm.Get_size() == 1:
        return None
    send, recv = _byte(), _byte()
    is_root = comm.Get_rank() == root
    return lambda: comm.Ireduce([send, MPI.UNSIGNED_CHAR], [recv, MPI.UNSIGNED_CHAR] if is_root else None,
                                op=MPI.MAX, root=root)


def gather_herald(comm: Any, root: int) -> Herald | None:
    """One byte gathered at ``root``: at the root it completes once every rank posted."""
    if comm.Get_size() == 1:
        return None
    send = _byte()
    gathered = np.zeros(comm.Get_size(), dtype=np.uint8) if comm.Get_rank() == root else None
    return lambda: comm.Igather([send, MPI.BYTE], None if gathered is None else [gathered, MPI.BYTE], root=root)


def alltoallv_herald(comm: Any, send_counts: np.ndarray, recv_counts: np.ndarray) -> Herald | None:
    """One byte to each other rank that ``send_counts`` sends to (and one from each that ``recv_counts`` receives
    from): it completes once every rank that sends rows here posted. Every rank's counts agree pairwise (as the
    exchange's must), so the herald's do too."""
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        return None
    sends = (np.asarray(send_counts) > 0).astype(np.int64)
    recvs = (np.asarray(recv_counts) > 0).astype(np.int64)
    sends[rank] = recvs[rank] = 0  # a rank's own segment is a local copy, never late
    send_buf, recv_buf = np.zeros(max(int(sends.sum()), 1), np.uint8), np.zeros(max(int(recvs.sum()), 1), np.uint8)
    send_displs = np.concatenate(([0], np.cumsum(sends)[:-1]))
    recv_displs = np.concatenate(([0], np.cumsum(recvs)[:-1]))
    return lambda: comm.Ialltoallv([send_buf, (sends, send_displs), MPI.BYTE],
                                   [recv_buf, (recvs, recv_displs), MPI.BYTE])


def allreduce_herald(comm: Any) -> Herald | None:
    """A non-blocking barrier: every rank's result depends on every rank."""
    if comm.Get_size() == 1:
        return None
    return comm.Ibarrier
