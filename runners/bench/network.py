"""``sparse-dist bench network``: alpha and beta of this MPI, for the performance model.

Broadcasts of 8 B to 16 MiB over all ranks (run it with 2 ranks, placed as
the runs you want to model). Each sample times a chain of broadcasts whose
root alternates between ranks 0 and 1, so each one waits for the one before
(no pipelining), and divides by the chain's length; median of
``--repeats`` samples, slowest rank. The model's broadcast formula
(:func:`sparse_dist.cost.bcast_time`) is fitted: ``alpha`` from the
small messages, ``beta`` by least squares on the large ones. Prints the
table, the fit, and the flags to hand ``sparse-dist cost``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from runners.argtypes import at_least
from sparse_dist.cost import BCAST_SHORT
from sparse_dist.comm import Communicator

SIZES = [8 * 4 ** k for k in range(13)]  # 8 B .. 128 MiB
LARGE_FROM = 1 << 20
"""Messages of at least this many bytes (and MPICH's short-broadcast limit) fit beta."""
FIT_FROM = next(size for size in SIZES if size >= max(BCAST_SHORT, LARGE_FROM))
"""The smallest message size beta is fitted on (2 MiB): ``--max-bytes`` may not lie below it (no fit, no beta)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=at_least(1), default=20,
                        help="timed samples per message size, >= 1 (default: %(default)s)")
    parser.add_argument("--max-bytes", type=at_least(FIT_FROM), default=16 * 2 ** 20,
                        help=f"largest message, >= {FIT_FROM} (beta is fitted on messages of at least that size; "
                             f"default 16 MiB, the size of typical exchanged blocks)")


def collective_seconds(comm: Communicator, work: Callable[[], None], repeats: int) -> float:
    """The slowest rank's median seconds of ``work`` (a collective over ``comm``) over ``repeats`` samples after one
    untimed, each sample started together behind a barrier. Collective."""
    samples = []
    for _ in range(repeats + 1):
        comm.barrier()
        start = time.perf_counter()
        work()
        samples.append(max(comm.allgather_object(time.perf_counter() - start)))
    return statistics.median(samples[1:])


def broadcast_seconds(comm: Communicator, size: int, chain: int, repeats: int) -> float:
    """Seconds of one broadcast of ``size`` bytes over ``comm``: chains of ``chain`` broadcasts whose root alternates
    between ranks 0 and 1, each waiting for the one before; the slowest rank's median of ``repeats`` samples after
    one untimed (:func:`collective_seconds`). Collective."""
    buffer = torch.zeros(size, dtype=torch.uint8)

    def chained() -> None:
        for link in range(chain):
            comm.bcast_(buffer, link % 2, "other")

    return collective_seconds(comm, chained, repeats) / chain


def fit_alpha_beta(rows: list[tuple[int, float]], groups: int, large_from: int = LARGE_FROM) -> tuple[float, float]:
    """``(alpha, beta)`` from ``(bytes, seconds)`` of broadcasts over ``groups`` ranks: alpha from the messages of at
    most 512 bytes (binomial: ``steps`` latencies), beta by least squares on those of at least ``large_from``
    bytes (scatter + ring allgather: ``(steps + g - 1) alpha + 2 (g - 1) / g m beta``; ``large_from`` is raised
    to MPICH's short-broadcast limit)."""
    steps = max(int(np.ceil(np.log2(groups))), 1)
    alpha = statistics.median([t / steps for size, t in rows if size <= 512])
    large = [(size, t) for size, t in rows if size >= max(BCAST_SHORT, large_from)]
    factor = 2.0 * (groups - 1) / groups
    x = np.array([factor * s for s, _ in large])
    y = np.array([t - (steps + groups - 1) * alpha for _, t in large])
    return alpha, float((x @ y) / (x @ x))


def main(comm: Communicator, args: argparse.Namespace) -> int:
    if comm.size < 2:
        raise SystemExit("bench network needs at least 2 ranks (mpiexec -n 2 sparse-dist bench network)")
    g = comm.size
    rows = [(size, broadcast_seconds(comm, size, max(2, min(200, (1 << 22) // size)), args.repeats))
            for size in SIZES if size <= args.max_bytes]
    alpha, beta = fit_alpha_beta(rows, g)
    if comm.rank == 0:
        print(f"{'bytes':>12} {'seconds':>12} {'GB/s':>8}")
        for size, seconds in rows:
            print(f"{size:>12} {seconds:>12.3e} {size / seconds / 1e9:>8.2f}")
        print(f"fit over {g} ranks: alpha {alpha * 1e6:.2f} us, beta {beta * 1e9:.4f} ns/B "
              f"({1e-9 / beta:.2f} GB/s)")
        print(f"sparse-dist cost ... --alpha {alpha:.3g} --beta-gbs {1e-9 / beta:.3g}")
    return 0
