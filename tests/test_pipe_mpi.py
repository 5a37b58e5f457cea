"""Pipelined stale exchange (``pipe:tau=T[,gamma=G]``) under real mpiexec: tau = 0 is bitwise the exact path,
tau = 1 and 2 equal a single-process simulation of T-stale rows and gradients, each epoch uses exactly the
flight of epoch t - tau, bytes equal the exact (or sampled) path's, and a checkpoint with flights outstanding
resumes bitwise (tests/mpi_cases/pipe_cases.py); at c = 1 the same launches check psc's feature cache
(tests/mpi_cases/psc_cases.py)."""

import pytest
from mpirun import run_case

from algorithms.policies import PipeRule, parse_staleness


@pytest.mark.parametrize("ranks,replication", [(2, 1), (3, 1), (4, 2)])
def test_pipelined_exchange_equals_the_stale_simulation(ranks: int, replication: int) -> None:
    result = run_case(ranks, "pipe_cases.py", "--replication", str(replication), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks pass" in result.stdout, result.stdout + result.stderr


def test_pipe_specs_are_parsed_and_checked() -> None:
    assert parse_staleness("pipe:tau=2,gamma=0.95") == PipeRule(2, 0.95)
    assert parse_staleness("pipe:tau=1") == PipeRule(1, 0.0)
    with pytest.raises(ValueError, match="tau must be >= 0"):
        parse_staleness("pipe:tau=-1")
    with pytest.raises(ValueError, match=r"gamma must lie in \[0, 1\)"):
        parse_staleness("pipe:tau=1,gamma=1")
    with pytest.raises(ValueError, match="'1.5' is not a int"):
        parse_staleness("pipe:tau=1.5")
