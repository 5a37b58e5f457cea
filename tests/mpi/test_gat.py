"""GAT exact against the independent reference (tests/support/reference_gat.py) for every plan, P = 1..4 (an empty,
uneven row group at P = 3) and the 1.5D grid, with measured bytes equal to one ``[Z | s]`` exchange per
layer; sampling and staleness at P = 3 and P = 4, c = 2. P = 1 runs in this process, the rest under mpiexec inside
tests/mpi/test_training_cases.py's launches."""

import sys

from mpirun import CASES


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


# Under mpiexec GAT runs in tests/mpi/test_training_cases.py's launches: P = 2, 3 (with sampling and
# staleness), 4 x 2 (with them) and 4 x 1.
