"""GAT under real mpiexec: exact against the independent reference (tests/reference_gat.py) for every plan,
P = 1..4 (an empty, uneven row group at P = 3) and the 1.5D grid, with measured bytes equal to one
``[Z | s]`` exchange per layer; sampling and staleness at P = 3 and P = 4, c = 2."""

import pytest
from mpirun import run_case


@pytest.mark.parametrize("ranks,replication,policies", [(1, 1, False), (2, 1, False), (3, 1, True), (4, 1, False),
                                                        (4, 2, True)])
def test_gat_equals_the_reference_with_predicted_bytes(ranks: int, replication: int, policies: bool) -> None:
    extra = ["--policies"] if policies else []
    result = run_case(ranks, "gat_cases.py", "--replication", str(replication), *extra, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks pass" in result.stdout, result.stdout + result.stderr
