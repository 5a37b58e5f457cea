"""Segmented ireduce under real mpiexec: bitwise equal to one unsegmented reduce, same counted bytes.

A reference communicator reduces whole buffers (``reduce_segment_bytes=0``);
others cut them into segments of a few bytes (many segments; sizes not
divisible by the segment) and of a size that does not divide the element
size, both plain and through host staging. Every root in turn, in place
(``contribution=None``) and not, several reduces outstanding at once and
waited in reverse order. Values are small integers (int64, float64,
float32), so sums are exact whatever order MPI adds them in.

Prints ``reduce segments P=<size>: <n> reduces, all passed`` on rank 0.
"""

from __future__ import annotations

import sys

import torch

from sparse_dist.comm import Communicator, world

SIZES = [0, 1, 7, 301]
"""Elements a reduce: none, one, fewer than a segment, and many segments that do not divide them (a larger size
checks nothing 301 does not: with 3-byte segments, one element a segment, 1001 elements took most of the launch)."""
DTYPES = [torch.int64, torch.float64, torch.float32]


def contribution(numel: int, dtype: torch.dtype, rank: int, salt: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7919 * salt + rank)
    return torch.randint(-1000, 1000, (numel,), generator=generator).to(dtype)


def reduce_all(comm: Communicator) -> list[torch.Tensor]:
    """For every root, dtype and in-place choice: post one reduce per size, then wait newest first."""
    out: list[torch.Tensor] = []
    salt = 0
    for root in range(comm.size):
        for dtype in DTYPES:
            for in_place in (True, False):
                pending = []
                for numel in SIZES:
                    salt += 1
                    mine = contribution(numel, dtype, comm.rank, salt)
                    if comm.rank == root:
                        result = mine.clone() if in_place else torch.full((numel,), 3).to(dtype)
                        pending.append(comm.ireduce(None if in_place else mine, result, root=root, phase="backward"))
                        out.append(result)
                    else:
                        pending.append(comm.ireduce(mine, None, root=root, phase="backward"))
                for request in reversed(pending):
                    request.wait()
    return out


def main() -> int:
    reference = world(gpu_aware="off", reduce_segment_bytes=0)
    variants = {
        "16-byte segments": world(gpu_aware="off", reduce_segment_bytes=16),
        "100-byte segments": world(gpu_aware="off", reduce_segment_bytes=100),
        "100-byte segments, staged": world(gpu_aware="off", reduce_segment_bytes=100, force_host_staging=True),
        "3-byte segments, staged": world(gpu_aware="off", reduce_segment_bytes=3, force_host_staging=True),
    }
    want = reduce_all(reference)
    counted = reference.stats.snapshot()["backward"]
    failures: list[str] = []
    for name, comm in variants.items():
        got = reduce_all(comm)
        for k, (a, b) in enumerate(zip(want, got)):
            if a.dtype != b.dtype or not torch.equal(a, b):
                failures.append(f"{name}: result {k} ({a.numel()} x {a.dtype}) differs from the unsegmented reduce")
        mine = comm.stats.snapshot()["backward"]
        if any(mine[key] != counted[key] for key in ("bytes_sent", "bytes_recv", "calls")):
            failures.append(f"{name}: counted {mine}, unsegmented counted {counted}")
    for failure in failures:
        sys.stderr.write(f"[rank {reference.rank}] FAIL {failure}\n")
    all_passed = reference.all_true(not failures)
    if reference.rank == 0:
        print(f"reduce segments P={reference.size}: {len(want)} reduces per root-side variant, "
              f"{'all passed' if all_passed else 'FAILURES'}")
    for comm in (*variants.values(), reference):
        comm.free()
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
