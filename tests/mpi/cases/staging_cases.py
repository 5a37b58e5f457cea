"""Host staging under real mpiexec: staged results equal unstaged ones bitwise, and the pool reuses buffers.

Two communicators run the same rounds of exchanges: ``plain`` hands CPU
tensors to MPI directly, ``staged`` sends them through the host-staging path
(pool, deferred starts, write-back). Each round posts several exchanges
(ibcast, ireduce in place and not, ialltoallv; different shapes and dtypes)
before waiting for any, waits in a rank-dependent order (odd ranks in
reverse, one by polling ``test``) and calls a blocking collective on the
other communicator in between, then runs a blocking allreduce. Values are
small integers, so sums are exact whatever order MPI adds them in.

Checks: every received tensor equals ``plain``'s bitwise; counted bytes and
calls are equal; the pool allocates, over many rounds, exactly one buffer per
(numel, dtype) buffer outstanding at once (the most over all rounds), all
within the first cycle of the repeating pattern; a ``split`` child shares the pool.
Prints ``staging cases P=<size>: <n> rounds, ... all passed`` on rank 0.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import torch

from sparse_dist.comm import Communicator, world

SHAPES = [((5, 3), torch.float32), ((17,), torch.float64), ((2, 3, 4), torch.int64), ((0, 4), torch.float32)]


def values(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-50, 50, shape, generator=generator).to(dtype)


def one_round(comm: Communicator, round_index: int, other: Communicator) -> tuple[list[torch.Tensor], Counter]:
    """Post every exchange, wait in a rank-dependent order; the results and the staged buffers' (numel, dtype)."""
    rank, size = comm.rank, comm.size
    seed = 1000 * round_index + 10 * rank
    pending = []
    results: list[torch.Tensor] = []
    buffers: Counter = Counter()
    for k, (shape, dtype) in enumerate(SHAPES):
        root = (k + round_index) % size
        tensor = values(shape, dtype, seed + k) if rank == root else torch.full(shape, -7).to(dtype)
        pending.append(comm.ibcast_(tensor, root=root, phase="forward"))
        results.append(tensor)
        buffers[(tensor.numel(), dtype)] += 1
    for k, (shape, dtype) in enumerate(SHAPES[:3]):
        root = (k + 1 + round_index) % size
        contribution = values(shape, dtype, seed + 100 + k)
        if rank == root:
            result = contribution.clone() if k % 2 == 0 else torch.zeros(shape, dtype=dtype)
            pending.append(comm.ireduce(None if k % 2 == 0 else contribution, result, root=root, phase="backward"))
            results.append(result)
            buffers[(result.numel(), dtype)] += 1 if k % 2 == 0 else 2
        else:
            pending.append(comm.ireduce(contribution, None, root=root, phase="backward"))
            buffers[(contribution.numel(), dtype)] += 1
    width = 3
    send_rows = [(rank + j + round_index) % 4 for j in range(size)]
    recv_rows = [(j + rank + round_index) % 4 for j in range(size)]
    send = values((sum(send_rows), width), torch.float64, seed + 200)
    recv = torch.full((sum(recv_rows), width), -1.0, dtype=torch.float64)
    pending.append(comm.ialltoallv(send, send_rows, recv, recv_rows, phase="forward"))
    results.append(recv)
    buffers[(send.numel(), send.dtype)] += 1
    buffers[(recv.numel(), recv.dtype)] += 1
    other.all_true(True)  # a blocking collective on another communicator while exchanges are posted
    order = list(range(len(pending)))
    if rank % 2 == 1:
        order.reverse()
    for index in order:
        if index == order[0]:
            while not pending[index].test():
                pass
        else:
            pending[index].wait()
    total = values((5, 3), torch.float32, seed + 300)
    comm.allreduce_(total, phase="grad_allreduce")
    results.append(total)
    return results, buffers


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=3, help="times through the rounds' repeating pattern")
    args = parser.parse_args()
    plain = world(gpu_aware="off")
    staged = world(gpu_aware="off", force_host_staging=True)
    period = 4 * plain.size  # root choices and row counts repeat with this period
    failures: list[str] = []
    most_at_once: Counter = Counter()
    after_first_cycle = None
    rounds = args.cycles * period
    for round_index in range(rounds):
        want, _ = one_round(plain, round_index % period, staged)
        got, buffers = one_round(staged, round_index % period, plain)
        for k, (a, b) in enumerate(zip(want, got)):
            if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
                failures.append(f"round {round_index}: result {k} differs: {a.flatten()[:6]} vs {b.flatten()[:6]}")
        most_at_once |= buffers
        if round_index == period - 1:
            after_first_cycle = staged.staging_pool.allocations
    allocations = staged.staging_pool.allocations
    expected = sum(most_at_once.values())
    if allocations != expected or allocations != after_first_cycle:
        failures.append(f"pool allocated {allocations} buffers over {rounds} rounds ({after_first_cycle} after the "
                        f"first {period}); at most {expected} (numel, dtype) buffers were outstanding at once")
    for phase in ("forward", "backward", "grad_allreduce"):
        a, b = plain.stats.snapshot()[phase], staged.stats.snapshot()[phase]
        if any(a[key] != b[key] for key in ("bytes_sent", "bytes_recv", "calls")):
            failures.append(f"{phase}: counted {b} staged vs {a} unstaged")
    child = staged.split(staged.rank % 2, staged.rank)
    if child.staging_pool is not staged.staging_pool or not child.force_host_staging:
        failures.append("split child does not share the staging pool and settings")
    probe = torch.arange(6, dtype=torch.float64) if child.rank == 0 else torch.zeros(6, dtype=torch.float64)
    child.bcast_(probe, root=0, phase="other")
    if not torch.equal(probe, torch.arange(6, dtype=torch.float64)):
        failures.append(f"split child broadcast gave {probe}")
    child.free()
    for failure in failures:
        sys.stderr.write(f"[rank {staged.rank}] FAIL {failure}\n")
    all_passed = plain.all_true(not failures)
    if plain.rank == 0:
        print(f"staging cases P={plain.size}: {rounds} rounds, {staged.staging_pool.allocations} staging buffers "
              f"allocated on rank 0, {'all passed' if all_passed else 'FAILURES'}")
    staged.free()
    plain.free()
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
