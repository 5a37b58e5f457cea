"""Invalid distributed-matrix input on one rank: every rank raises the same clear error."""

import pytest
from mpirun import run_case


@pytest.mark.parametrize("ranks,replication", [(3, 1), (4, 2)])
def test_bad_input_is_refused_collectively(ranks: int, replication: int) -> None:
    result = run_case(ranks, "bad_input.py", str(replication))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bad input refused on every rank" in result.stdout
