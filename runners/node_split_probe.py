"""The node's compute under each ranks x threads split, measured in one process, for ``sparse-dist cost node-split``.

A split ``r x t`` runs ``r`` Python threads at once, each with torch's ``t`` intra-op threads (torch releases the
GIL inside its kernels, so the ``r`` units compute concurrently, as ``r`` ranks would, on ``r t`` cores). Each
thread computes one unit of a layer: an SpMM of :data:`SPLIT_ROWS` rows at the graph's mean degree by ``width``
columns (rows enough that its operands leave the caches, as a rank's do), then the dense part, a ``width x width``
product and the elementwise passes a layer makes over its output (ReLU, a dropout mask drawn and applied, the bias). A split's seconds are the median over
:data:`REPEATS` of the time until every thread is done. :func:`runners.perf.node_split.efficiency_of` turns them
into efficiencies. What it leaves out: MPI's own copies and each rank's separate Python (a process per rank).
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch

from runners.perf.node_split import NodeSplit
from sparse_dist.csr import torch_csr

REPEATS = 3
SPLIT_ROWS = 1 << 17
"""Rows of a unit: 64 MiB of float32 features at width 128, past any core's cache (at 16k rows the SpMM, 8 MiB of
features, ran no faster on two threads than on one on the 2-core machine, where a rank's half of the 200k graph
runs 1.8-2.0x faster)."""


def _units(degree: int, width: int) -> tuple[Callable[[], None], Callable[[], None]]:
    """The SpMM unit and the dense unit of the module docstring, over inputs made once (shared read-only)."""
    generator = torch.Generator().manual_seed(0)
    rows = SPLIT_ROWS
    columns = torch.randint(0, rows, (rows * degree,), generator=generator).numpy()
    matrix = torch_csr(sp.csr_matrix((np.ones(rows * degree, dtype=np.float32), columns,
                                      np.arange(0, rows * degree + 1, degree)), shape=(rows, rows)),
                       torch.float32, torch.device("cpu"))
    features = torch.randn(rows, width, generator=generator)
    weight = torch.randn(width, width, generator=generator)
    bias = torch.randn(width, generator=generator)

    def spmm() -> None:
        torch.sparse.mm(matrix, features)

    def dense() -> None:
        out = (features @ weight).relu_()
        out.mul_(torch.rand_like(out) >= 0.5).add_(bias)

    return spmm, dense


def _concurrent_seconds(unit: Callable[[], None], copies: int) -> float:
    """Median seconds until ``copies`` threads, started together, have each run ``unit`` once."""
    samples = []
    for _ in range(REPEATS + 1):  # the first is a warm-up
        start = threading.Barrier(copies + 1)
        workers = [threading.Thread(target=lambda: (start.wait(), unit())) for _ in range(copies)]
        for worker in workers:
            worker.start()
        start.wait()
        began = time.perf_counter()
        for worker in workers:
            worker.join()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples[1:])


def split_seconds(splits: list[NodeSplit], degree: int, width: int
                   ) -> tuple[dict[NodeSplit, tuple[float, float]], tuple[float, float]]:
    """(SpMM, dense) seconds of one unit per split (its ranks at once), and one thread's alone. Local; restores
    torch's thread count."""
    spmm, dense = _units(max(degree, 1), width)
    threads_before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = (_concurrent_seconds(spmm, 1), _concurrent_seconds(dense, 1))
        seconds = {}
        for split in splits:
            torch.set_num_threads(split.threads)
            seconds[split] = (_concurrent_seconds(spmm, split.ranks_per_node),
                               _concurrent_seconds(dense, split.ranks_per_node))
    finally:
        torch.set_num_threads(threads_before)
    return seconds, alone


__all__ = ["SPLIT_ROWS", "REPEATS", "split_seconds"]
