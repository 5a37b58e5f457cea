"""What the grid's cost model needs measured on this machine: compute rates of the grid's own kernels, and the
link as the grid uses it (allreduces), for ``train --grid auto`` and ``sparse-dist cost predict --plans grid:...``.

* **Compute** (:func:`probe_seconds`, local): an SpMM of :data:`PROBE_ROWS` square rows at the graph's mean degree
  by ``width`` columns (``torch.sparse.mm``, the forward aggregation's kernel), a GEMM of those rows by a
  ``width x width`` matrix (a layer's product), and one elementwise pass over the ``PROBE_ROWS x width`` block
  (``add_``: a read and a write of each value, what the bias, the ReLU and the loss's passes cost a value).
  :func:`probe_rates` turns them into :class:`runners.perf.cost_model.Rates` per core: the SpMM per entry and
  column, the dense work per ``rows * F_in * F_out`` of a layer (its three products: forward, the weights'
  gradient and the aggregation's, :data:`GEMMS_PER_LAYER`), and element passes.
* **Link** (:func:`allreduce_link`, collective): the grid moves everything by allreduce, so the link is fitted from
  allreduces over the job's communicator (in pieces, as the layers run them) of :data:`SMALL_VALUES` and
  :data:`LARGE_VALUES` float32 values, against :func:`sparse_dist.cost.allreduce_time`'s two regimes. Over shared
  memory an allreduce's copies and sums run on the ranks' own cores, so this is what a step's allreduces see on an
  oversubscribed machine, where broadcast chains of 256 KiB (``--policy auto``'s link) could not tell the
  bandwidth from zero (beta fitted at or below zero, on the 2-core machine at P = 4).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
import torch

from runners.bench.network import collective_seconds
from runners.perf.cost_model import Rates
from runners.policy_auto import median_seconds
from sparse_dist.comm import Communicator
from sparse_dist.cost import ALLREDUCE_SHORT, log2_steps
from sparse_dist.csr import torch_csr
from sparse_dist.grid_links import allreduce_pieces

PROBE_ROWS = 16_384
"""Rows of the compute probes (as ``--policy auto``'s)."""
GEMMS_PER_LAYER = 3
"""A grid layer's products a step: ``T W`` forward, ``T^T G`` (the weights' gradient), ``G W^T`` (the aggregation's
gradient; layer 0 has none, priced alike): the grid model's dense work of a layer is one ``n_d f_i f'_o``."""
SMALL_VALUES = 64
LARGE_VALUES = 1 << 20
"""The link probe's allreduces: 256 bytes (latency) and 4 MiB (bandwidth: one piece of the layers' allreduces)."""
_REPEATS = 3


def _pass_seconds(width: int, device: torch.device) -> float:
    """Seconds of one elementwise pass (``add_``) over a :data:`PROBE_ROWS` x ``width`` block (local)."""
    scratch = torch.randn(PROBE_ROWS, width, generator=torch.Generator().manual_seed(1)).to(device)
    return median_seconds(lambda: scratch.add_(1.0), device)


def probe_seconds(degree: int, width: int, device: torch.device) -> tuple[float, float, float]:
    """Seconds of the SpMM, the GEMM and the elementwise pass of the module docstring (local)."""
    generator = torch.Generator().manual_seed(0)
    rows = PROBE_ROWS
    columns = torch.randint(0, rows, (rows * degree,), generator=generator).numpy()
    probe = sp.csr_matrix((np.ones(rows * degree, dtype=np.float32), columns, np.arange(0, rows * degree + 1, degree)),
                          shape=(rows, rows))
    matrix = torch_csr(probe, torch.float32, device)
    dense = torch.randn(rows, width, generator=generator).to(device)
    weight = torch.randn(width, width, generator=generator).to(device)
    return (median_seconds(lambda: torch.sparse.mm(matrix, dense), device),
            median_seconds(lambda: dense @ weight, device), _pass_seconds(width, device))


def probe_rates(seconds: tuple[float, float, float] | np.ndarray, degree: int, width: int, threads: int,
                source: str) -> Rates:
    """Per-core :class:`Rates` from :func:`probe_seconds`'s ``(spmm, gemm, elementwise)`` seconds, measured with
    ``threads`` cores."""
    spmm, gemm, passes = (max(float(s), 1e-12) for s in seconds)
    values = PROBE_ROWS * width
    return Rates(spmm=values * degree / spmm / threads,
                 dense=values * width / (GEMMS_PER_LAYER * gemm) / threads,
                 elementwise=values / passes / threads, source=source)


def elementwise_rate(width: int) -> float:
    """Element passes per core-second of this process's CPU threads (the pass of :func:`probe_seconds` at
    ``width``; ``cost predict`` prices the grid's elementwise work with it beside a calibration run's SpMM and dense
    rates)."""
    return PROBE_ROWS * width / max(_pass_seconds(width, torch.device("cpu")), 1e-12) / torch.get_num_threads()


def allreduce_link(comm: Communicator) -> tuple[float, float]:
    """``(alpha, beta)`` of ``comm``'s allreduces (module docstring): the slowest rank's median of :data:`_REPEATS`
    after one untimed (:func:`runners.bench.network.collective_seconds`), fitted to
    :func:`sparse_dist.cost.allreduce_time`. Collective."""
    if comm.size <= 1:
        return 0.0, 1e-12
    seconds = []
    for values in (SMALL_VALUES, LARGE_VALUES):
        buffer = torch.ones(values, dtype=torch.float32)
        seconds.append(collective_seconds(comm, lambda: allreduce_pieces(comm, buffer, "other"), _REPEATS))
    return fit_allreduce_link(seconds[0], seconds[1], comm.size)


def fit_allreduce_link(small: float, large: float, size: int) -> tuple[float, float]:
    """``(alpha, beta)`` that give :func:`sparse_dist.cost.allreduce_time` ``small`` seconds for an allreduce of
    :data:`SMALL_VALUES` float32 values over ``size`` ranks (a tree of ``ceil(log2 size)`` latencies) and
    ``large`` for :data:`LARGE_VALUES` (``2 ceil(log2 size)`` latencies and ``2 (size - 1) / size`` of the message
    at beta); beta at least 1e-12 s a byte."""
    assert SMALL_VALUES * 4 < ALLREDUCE_SHORT <= LARGE_VALUES * 4
    steps = log2_steps(size)
    if steps == 0:
        return 0.0, 1e-12
    small_bytes, large_bytes = SMALL_VALUES * 4, LARGE_VALUES * 4
    # small = steps (alpha + small_bytes beta); large = 2 steps alpha + share beta: two equations, two unknowns
    share = 2.0 * (size - 1) / size * large_bytes
    beta = (large - 2.0 * small) / (share - 2.0 * steps * small_bytes)
    beta = beta if math.isfinite(beta) and beta > 1e-12 else 1e-12
    alpha = max(small / steps - small_bytes * beta, 0.0)
    return alpha, beta


__all__ = ["GEMMS_PER_LAYER", "LARGE_VALUES", "PROBE_ROWS", "SMALL_VALUES", "allreduce_link", "elementwise_rate",
           "fit_allreduce_link", "probe_rates", "probe_seconds"]
