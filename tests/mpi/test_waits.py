"""A rank's own exchange time and its wait for late partners, apart (issue 54, part 5), under real mpiexec:
tests/mpi/cases/wait_cases.py makes the last rank late on purpose and checks that the others book the delay as
``wait_seconds`` / ``exchange_wait`` (every herald kind, and training steps of every plan) while their own
exchange time and the late rank's wait stay near zero."""

import pytest
from mpirun import run_case


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_late_rank_shows_in_its_partners_wait_not_in_their_exchange(ranks: int) -> None:
    result = run_case(ranks, "wait_cases.py", timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"waits P={ranks} (3 plans, 2 steps" in result.stdout and "all checks pass" in result.stdout, \
        result.stdout + result.stderr
