"""Bad input on one rank is refused on EVERY rank with the same message (no hang).

Each scenario corrupts the input of one rank only; all ranks must raise
ValueError naming that rank, and the job then exits 0 after checking it.
"""

from __future__ import annotations

import sys

import numpy as np
import scipy.sparse as sp

from sparse_dist.comm import run_or_abort, world
from sparse_dist.dcsr import DistCSR
from sparse_dist.layout import RowLayout


def scenarios(rank: int, size: int, replication: int):
    n = 12
    a = sp.random(n, n, density=0.3, format="csr", random_state=3)
    groups = size // replication
    layout = RowLayout.balanced(n, groups)
    lo, hi = layout.row_range(rank // replication)
    bad = size - 1
    rows = a[lo:hi]
    wrong_shape = sp.csr_matrix((hi - lo + 1, n)) if rank == bad else rows
    yield "wrong shape", layout, wrong_shape, "expected"
    out_of_range = rows.copy()
    if rank == bad:
        out_of_range = sp.csr_matrix((np.ones(1), ([0], [0])), shape=(hi - lo, n + 5))
    yield "column out of range", layout, out_of_range, "expected"
    non_finite = rows.copy()
    if rank == bad and non_finite.nnz:
        non_finite.data[0] = np.nan
    elif rank == bad:
        non_finite = sp.csr_matrix((np.array([np.inf]), ([0], [0])), shape=(hi - lo, n))
    yield "non-finite value", layout, non_finite, "non-finite"
    yield "wrong layout parts", RowLayout.balanced(n, groups + 1), rows, "row groups"
    if replication > 1:
        mismatched = rows.copy()
        if rank == bad:
            mismatched = sp.csr_matrix(mismatched * 2.0)
        yield "replicas differ", layout, mismatched, "different rows"


def main() -> int:
    comm = world(gpu_aware="off")
    replication = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    failures = []
    for name, layout, rows, needle in scenarios(comm.rank, comm.size, replication):
        try:
            DistCSR(comm, layout, rows, replication=replication, name="bad")
            failures.append(f"{name}: accepted")
        except ValueError as exc:
            if needle not in str(exc):
                failures.append(f"{name}: message {exc!s} lacks {needle!r}")
    for failure in failures:
        sys.stderr.write(f"[rank {comm.rank}] FAIL {failure}\n")
    ok = comm.all_true(not failures)
    if comm.rank == 0 and ok:
        print("bad input refused on every rank")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
