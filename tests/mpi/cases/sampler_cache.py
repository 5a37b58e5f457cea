"""Two ranks import numba and build the compiled sampler at the same moment, sharing one numba cache
directory (``NUMBA_CACHE_DIR``, empty on the first launch): sampling still works, the compiled blocks are
bitwise the numpy kernel's at P = 2 with 3 batches a round, and each rank says how its kernel was obtained
(``CACHE rank=R hits=H misses=M``: cache hits and misses of numba's dispatcher)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from case_report import finish  # noqa: E402

from sparse_dist import sampling_compiled  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402
from sparse_dist.layout import RowLayout  # noqa: E402
from sparse_dist.sampling import DistributedSampler  # noqa: E402


def main() -> int:
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    rng = np.random.default_rng(4)
    n = 400
    whole = sp.random(n, n, density=0.04, format="csr", random_state=rng)
    layout = RowLayout.balanced(n, comm.size)
    first, last = int(layout.offsets[comm.rank]), int(layout.offsets[comm.rank + 1])
    mine = whole[first:last]
    samplers = {kernel: DistributedSampler(comm, layout, comm.rank, mine, [5, 3], seed=2, kernel=kernel)
                for kernel in ("numba", "numpy")}
    own = np.arange(first, last)
    seeds = [np.sort(rng.choice(own, size=8, replace=False)) for _ in range(3)]
    blocks = {kernel: sampler.sample_many(seeds, 1, [0, 1, 2]) for kernel, sampler in samplers.items()}
    failures = []
    for batch_numba, batch_numpy in zip(blocks["numba"], blocks["numpy"]):
        for x, y in zip(batch_numba, batch_numpy):
            if not (np.array_equal(x.src, y.src) and all(np.array_equal(getattr(x.matrix, f), getattr(y.matrix, f))
                                                         for f in ("indptr", "indices", "data"))):
                failures.append("the compiled blocks are not the numpy kernel's")
    stats = sampling_compiled._sample_kernel.stats
    print(f"CACHE rank={comm.rank} hits={sum(stats.cache_hits.values())} "
          f"misses={sum(stats.cache_misses.values())}", flush=True)
    return finish(comm, failures, f"sampler cache P={comm.size}")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
