"""Ranks of one node exchanging halo rows: MPI's alltoallv against an MPI-3 shared-memory window (figures of
docs/results.md, "Ranks on one node: a shared window against alltoallv").

Each rank owns ``OWNED`` rows of width ``WIDTH`` and sends ``ROWS`` of them (a seeded random choice) to every
other rank, as the p2p plan's exchange does. ``mpi``: gather the rows (``index_select``), then
``Alltoallv`` into the receive buffer. ``window``: gather the rows straight into this rank's segment of a window
allocated with ``MPI.Win.Allocate_shared`` over ``Split_type(COMM_TYPE_SHARED)``, a barrier, copy each peer's
rows for this rank out of its segment into the receive buffer, a barrier (the segment is free again). Both
give the same receive buffer, checked bitwise; both timings include the gather. Every rank must be on one node.

    mpiexec -n 2 .venv/bin/python docs/shared_window_probe.py [ROWS [WIDTH [OWNED [REPEATS]]]]
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from mpi4py import MPI


def main() -> None:
    rows, width, owned, repeats = (int(a) for a in (sys.argv[1:] + ["38000", "128", "60000", "20"][len(sys.argv) - 1:]))
    comm = MPI.COMM_WORLD
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    if node.size != comm.size:
        raise SystemExit("shared_window_probe: every rank must be on one node")
    size, me = comm.size, comm.rank
    owned_rows = torch.randn(owned, width, generator=torch.Generator().manual_seed(me))
    picks = np.random.default_rng(me)
    send_index = torch.from_numpy(np.concatenate([picks.choice(owned, rows, replace=False)
                                                  for peer in range(size) if peer != me]))
    per_peer = np.array([0 if peer == me else rows * width for peer in range(size)])
    displs = np.concatenate(([0], np.cumsum(per_peer)[:-1]))
    received = torch.empty((size - 1) * rows, width)

    def through_mpi() -> None:
        sent = owned_rows.index_select(0, send_index)
        comm.Alltoallv([sent.numpy(), (per_peer, displs), MPI.FLOAT], [received.numpy(), (per_peer, displs), MPI.FLOAT])

    capacity = int(send_index.numel() * width * 4)
    window = MPI.Win.Allocate_shared(capacity, 4, comm=node)
    window.Lock_all(MPI.MODE_NOCHECK)
    segments = [torch.frombuffer(window.Shared_query(rank)[0], dtype=torch.float32, count=capacity // 4)
                for rank in range(node.size)]
    mine = segments[node.rank][:send_index.numel() * width].view(-1, width)

    def through_window() -> None:
        torch.index_select(owned_rows, 0, send_index, out=mine)
        window.Sync()
        node.Barrier()
        window.Sync()
        at = 0
        for peer in range(size):
            if peer == me:
                continue
            first = (me if me < peer else me - 1) * rows  # the peer's rows for me, in its segment
            received[at:at + rows].copy_(segments[peer][first * width:(first + rows) * width].view(-1, width))
            at += rows
        node.Barrier()

    through_mpi()
    expected = received.clone()
    through_window()
    if not torch.equal(expected, received):
        raise SystemExit("shared_window_probe: the window gave other rows than alltoallv")
    megabytes = received.numel() * 4 / 1e6
    for name, exchange in (("alltoallv", through_mpi), ("window", through_window)) * 2:
        comm.Barrier()
        began = time.perf_counter()
        for _ in range(repeats):
            exchange()
        seconds = (time.perf_counter() - began) / repeats
        slowest = comm.allreduce(seconds, op=MPI.MAX)
        if me == 0:
            print(f"P={size} {name:9s}: {slowest * 1e3:7.2f} ms an exchange (slowest rank), {megabytes:.1f} MB "
                  f"received a rank, {megabytes / 1e3 / slowest:.2f} GB/s", flush=True)
    window.Unlock_all()
    window.Free()


if __name__ == "__main__":
    main()
