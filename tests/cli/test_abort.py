"""A rank that raises mid-exchange ends the whole job non-zero, well before the timeout."""

import time

from mpirun import run_case


def test_failure_on_one_rank_aborts_the_job() -> None:
    start = time.monotonic()
    result = run_case(3, "abort_midexchange.py", timeout=120)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert "[rank 1] RuntimeError: injected failure on rank 1 inside the exchange" in result.stderr
    assert elapsed < 60, f"abort took {elapsed:.1f} s"
