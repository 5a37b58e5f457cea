"""Distributed SpMM under real mpiexec vs a single-process scipy reference.

Each launch checks 6 matrices (random directed with empty rows, a group with
zero rows, mostly empty blocks, fewer rows than groups, no nonzeros, symmetric) x
F in {1, 64} x {float32, float64} x every plan (PLAN_NAMES): forward, transpose, autograd,
and counted bytes == predicted bytes on every rank (tests/mpi/cases/spmm_cases.py).
"""

import pytest
import torch
from mpirun import run_case

from sparse_dist.plans import PLAN_NAMES

CHECKS_PER_RANK = 6 * 2 * 2 * len(PLAN_NAMES)  # matrices x widths x dtypes x plans

# P = 2, 3, 4 (c = 1) and 4 x 2 ride in tests/mpi/test_training_cases.py's launches (its "spmm" section)
CONFIGS = [
    (1, 1, False), (2, 2, False),
    (3, 1, True), (4, 2, True),  # host-staging path used for non-CUDA-aware MPI
]


SLOW_LANE = {(4, 2, True)}  # staged at c = 2: the main lane stages at P = 3 and replicates at P = 2 (and P = 4 in
#                              tests/mpi/test_training_cases.py)


@pytest.mark.parametrize("ranks,replication,staging",
                         [pytest.param(*config, marks=pytest.mark.slow) if config in SLOW_LANE else config
                          for config in CONFIGS],
                         ids=[f"P{p}-c{c}{'-staged' if s else ''}" for p, c, s in CONFIGS])
def test_spmm_matches_scipy(ranks: int, replication: int, staging: bool) -> None:
    args = ["--replication", str(replication)] + (["--force-staging"] if staging else [])
    result = run_case(ranks, "spmm_cases.py", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{CHECKS_PER_RANK} checked per rank, all passed" in result.stdout, result.stdout + result.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("gpu_aware", ["off", "auto"])
def test_spmm_on_cuda(gpu_aware: str) -> None:
    result = run_case(2, "spmm_cases.py", "--device", "cuda", "--gpu-aware", gpu_aware)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all passed" in result.stdout
