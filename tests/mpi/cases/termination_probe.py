"""A signal reaches a job whose rank 0 waits inside MPI (a Barrier) while rank 1 is in Python (``time.sleep``).

Rank 1 acts on SIGTERM (``SystemExit``); rank 0 cannot (Python runs handlers between bytecodes, and it is inside
``MPI_Barrier``), so only :mod:`runners.termination`'s watcher ends it. Each rank says which MPICH shared-memory segments it
maps and when it is in place, so the test signals the job only then and can look for the segments after.
"""

from __future__ import annotations

import sys
import time

from runners import termination
from sparse_dist.comm import world

GRACE_SECONDS = 1.0


def main() -> int:
    comm = world(gpu_aware="off")
    assert termination.install("probe", grace=GRACE_SECONDS)
    comm.barrier()
    with open("/proc/self/maps", encoding="utf-8") as maps:
        segments = sorted({line.split()[-1] for line in maps if "/dev/shm/mpich_shm_" in line})
    print(f"rank {comm.rank} maps {' '.join(segments) or '-'}", flush=True)
    print(f"rank {comm.rank} in place", flush=True)
    if comm.rank == 1:
        time.sleep(120)
    comm.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
