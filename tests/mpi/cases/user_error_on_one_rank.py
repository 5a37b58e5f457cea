"""A user error on one rank while the others wait in a collective: said once, the job ends, no segments left.

Rank 1 writes the MPICH shared-memory segments it maps (``/dev/shm/mpich_shm_*``,
read from /proc/self/maps) to the file named by argv[1], then raises a
ValueError (declared a user error here) while every other rank is blocked in a
barrier that only MPI_Abort can end.
"""

from __future__ import annotations

import sys
import time

from sparse_dist.comm import run_or_abort, world

FAILING_RANK = 1


def mapped_mpich_segments() -> list[str]:
    with open("/proc/self/maps") as maps:
        fields = [line.split(maxsplit=5) for line in maps]
    return sorted({f[5].strip() for f in fields
                   if len(f) == 6 and f[5].startswith("/dev/shm/mpich_shm_") and "(deleted)" not in f[5]})


def main() -> int:
    comm = world(gpu_aware="off")
    if comm.rank == FAILING_RANK:
        with open(sys.argv[1], "w") as handle:
            handle.write("\n".join(mapped_mpich_segments()))
        time.sleep(0.3)  # the others are inside the barrier by now
        raise ValueError(f"injected user error on rank {comm.rank}: input.txt has a bad value")
    comm.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(run_or_abort(main, user_errors=(ValueError,), prog="case"))
