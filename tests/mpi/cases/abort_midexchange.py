"""One rank raises in the middle of an exchange; the job must end non-zero, not hang.

Ranks other than the failing one are already waiting inside the p2p
alltoallv when it raises, so only MPI_Abort (run_or_abort) can free them.
"""

from __future__ import annotations

import sys
import time

import scipy.sparse as sp
import torch

from sparse_dist.comm import run_or_abort, world
from sparse_dist.dcsr import DistCSR
from sparse_dist.layout import RowLayout
from sparse_dist.spmm import DistSpMM

FAILING_RANK = 1


def main() -> int:
    comm = world(gpu_aware="off")
    layout = RowLayout.balanced(30, comm.size)
    a = sp.random(30, 30, density=0.3, format="csr", random_state=7)
    lo, hi = layout.row_range(comm.rank)
    op = DistSpMM(DistCSR(comm, layout, a[lo:hi]), "p2p", dtype=torch.float64)
    if comm.rank == FAILING_RANK:
        col_comm = op.plan.col_comm

        def failing_exchange(*args, **kwargs):
            time.sleep(0.5)  # let the other ranks enter the exchange first
            raise RuntimeError(f"injected failure on rank {comm.rank} inside the exchange")

        col_comm.ialltoallv = failing_exchange  # type: ignore[method-assign]
    op.forward(torch.ones(hi - lo, 4, dtype=torch.float64))
    return 0


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
