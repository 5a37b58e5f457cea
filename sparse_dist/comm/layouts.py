"""Argument checks and buffer layouts of the tensor collectives: alltoallv counts and displacements, reduce
segments (see "Segmented reduce" in :mod:`sparse_dist.comm`). Local: nothing here talks to other ranks."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from sparse_dist.comm.buffers import mpi_datatype


def _segments(numel: int, itemsize: int, segment_bytes: int) -> list[tuple[int, int]]:
    """Element ranges ``[lo, hi)`` cutting ``numel`` elements into pieces of at most ``segment_bytes``."""
    if segment_bytes <= 0 or numel * itemsize <= segment_bytes:
        return [(0, numel)]
    step = max(1, segment_bytes // itemsize)
    return [(lo, min(numel, lo + step)) for lo in range(0, numel, step)]


def reduce_probe(contribution: torch.Tensor | None, result: torch.Tensor | None, is_root: bool) -> torch.Tensor:
    """The buffer that sizes a reduce (``result`` at the root, else ``contribution``), after checking both."""
    probe = result if is_root else contribution
    if probe is None:
        raise ValueError("ireduce: the root needs `result`, other ranks need `contribution`")
    mpi_datatype(probe)
    if is_root and contribution is not None:
        mpi_datatype(contribution)
        if contribution.numel() != probe.numel() or contribution.dtype != probe.dtype:
            raise ValueError(f"ireduce: contribution ({contribution.numel()} x {contribution.dtype}) and result "
                             f"({probe.numel()} x {probe.dtype}) differ")
    return probe


def alltoallv_layout(send: torch.Tensor, send_rows: Sequence[int], recv: torch.Tensor, recv_rows: Sequence[int],
                     size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(send_counts, send_displs, recv_counts, recv_displs)`` in elements of an alltoallv of row blocks
    (``send_rows[k]`` rows to rank ``k``, ``recv_rows[k]`` from it), after checking them against the buffers."""
    if len(send_rows) != size or len(recv_rows) != size:
        raise ValueError(f"alltoallv needs {size} row counts, got {len(send_rows)} and {len(recv_rows)}")
    row_elems = int(np.prod(send.shape[1:], dtype=np.int64)) if send.dim() > 1 else 1
    send_counts = np.asarray(send_rows, dtype=np.int64) * row_elems
    recv_counts = np.asarray(recv_rows, dtype=np.int64) * row_elems
    send_displs = np.concatenate(([0], np.cumsum(send_counts)[:-1]))
    recv_displs = np.concatenate(([0], np.cumsum(recv_counts)[:-1]))
    if send_counts.sum() != send.numel() or recv_counts.sum() != recv.numel():
        raise ValueError(f"alltoallv counts ({send_counts.sum()} / {recv_counts.sum()} elements) do not "
                         f"match the buffers ({send.numel()} / {recv.numel()} elements)")
    mpi_datatype(send)
    mpi_datatype(recv)
    return send_counts, send_displs, recv_counts, recv_displs
