"""The end of every tests/mpi/cases script: each rank says its failures, all ranks agree, rank 0 sums up."""

from __future__ import annotations

import sys


def finish(comm, failures: list[str], summary: str) -> int:
    """Write this rank's failures to stderr, agree over all ranks (collective), and let rank 0 print
    ``summary`` followed by ``all checks pass`` or ``FAILURES``; the exit status for every rank."""
    for failure in failures:
        sys.stderr.write(f"[rank {comm.rank}] FAIL {failure}\n")
    ok = comm.all_true(not failures)
    if comm.rank == 0:
        print(f"{summary}: {'all checks pass' if ok else 'FAILURES'}", flush=True)
    return 0 if ok else 1
