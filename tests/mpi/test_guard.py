"""The accuracy guard under real mpiexec (tests/mpi/cases/guard_cases.py, one launch at P = 4): it rescues a
pipelined run that falls, decides the same at P = 1, 2, 4 where the signals are the same, resumes bitwise,
and ``--guard off`` changes nothing."""

from datasets_for_tests import cora, write
from mpirun import run_case


def test_guard_rescues_a_falling_policy_and_decides_alike_everywhere(tmp_path) -> None:
    data = write(cora(), tmp_path / "cora", parts=4, partitioner="random")  # 75% of the entries cut
    result = run_case(4, "guard_cases.py", str(data), timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RESCUE P=4" in result.stdout and "SAME P=4,2,1" in result.stdout, result.stdout
    assert "guard cases P=4: all checks pass" in result.stdout, result.stdout + result.stderr
