"""Host staging and segmented reduce under real mpiexec (tests/mpi/cases/staging_cases.py, reduce_segments.py).

Staging: results through the staging pool (deferred starts, write-back,
several requests outstanding, rank-dependent wait order) equal the direct
path bitwise, bytes are counted the same, and the pool allocates one buffer
per (numel, dtype) outstanding at once, however many rounds run.
Segmented reduce: bitwise equal to one unsegmented reduce (in place and
not, sizes not divisible by the segment, tiny segments), same counted bytes.
"""

import pytest
from mpirun import run_case


@pytest.mark.parametrize("ranks", [2, 3])
def test_staged_exchanges_equal_direct_ones_and_reuse_buffers(ranks: int) -> None:
    result = run_case(ranks, "staging_cases.py", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"staging cases P={ranks}:" in result.stdout and "all passed" in result.stdout, result.stdout


@pytest.mark.parametrize("ranks", [2, 3])
def test_segmented_reduce_equals_unsegmented(ranks: int) -> None:
    result = run_case(ranks, "reduce_segments.py", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"reduce segments P={ranks}:" in result.stdout and "all passed" in result.stdout, result.stdout
