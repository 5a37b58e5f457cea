"""GAT exact against the independent reference (tests/support/reference_gat.py) for every plan, P = 1..4 (an empty,
uneven row group at P = 3) and the 1.5D grid, with measured bytes equal to one ``[Z | s]`` exchange per
layer; sampling and staleness at P = 3 and P = 4, c = 2. P = 1 runs in this process, the rest under mpiexec."""

import sys

import pytest
from mpirun import CASES, run_case


def test_gat_on_one_process_equals_the_reference() -> None:
    sys.path.insert(0, str(CASES))
    from gat_cases import run

    from sparse_dist.comm import world

    comm = world(gpu_aware="off")
    try:
        failures, runs = run(comm, 1, False)
    finally:
        comm.free()
    assert runs == 3 and not failures, "\n".join(failures)


# P = 2, 3 (with sampling and staleness) and 4 x 2 (with them) run in tests/mpi/test_training_cases.py's launches
@pytest.mark.parametrize("ranks,replication,policies", [(4, 1, False)])
def test_gat_equals_the_reference_with_predicted_bytes(ranks: int, replication: int, policies: bool) -> None:
    extra = ["--policies"] if policies else []
    result = run_case(ranks, "gat_cases.py", "--replication", str(replication), *extra, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks pass" in result.stdout, result.stdout + result.stderr
