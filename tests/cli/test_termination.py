"""SIGTERM ends an MPI job whose ranks wait inside MPI (runners/termination.py), never a hang.

Python acts on a signal between bytecodes, so a rank inside a blocking MPI call (a collective, or ``MPI_Init``
waiting for a rank that died before it) cannot. Both cases are signalled the way ``timeout`` does (SIGTERM to
``mpiexec``, which passes it on to the ranks) and must end within seconds; the test's own timeout kills what is
left.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from datasets_for_tests import cora, write
from mpirun import BIN, CASES, ROOT, finish, mpiexec_path


def _start(argv: list[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _signal_after(process: subprocess.Popen[str], ready: str, count: int, timeout: float) -> str:
    """Read stdout until ``ready`` was printed ``count`` times, then SIGTERM ``mpiexec``; what was read."""
    deadline = time.monotonic() + timeout
    seen, read = 0, ""
    assert process.stdout is not None
    while seen < count:
        line = process.stdout.readline()
        assert line and time.monotonic() < deadline, f"the job never said {ready!r} {count} times"
        seen += line.count(ready)
        read += line
    time.sleep(0.5)  # into the blocking call
    process.send_signal(signal.SIGTERM)
    return read


def test_a_rank_waiting_in_a_collective_ends_after_the_grace() -> None:
    process = _start([mpiexec_path(), "-n", "2", sys.executable, str(CASES / "termination_probe.py")])
    said = _signal_after(process, "in place", 2, timeout=60)
    signalled = time.monotonic()
    result = finish(process, 60, "the probe after SIGTERM")
    elapsed = time.monotonic() - signalled
    assert result.returncode != 0
    assert elapsed < 15, f"the job took {elapsed:.1f} s to end after SIGTERM"
    assert result.stderr.count("probe: error: SIGTERM not acted on within 1 s") == 1, result.stderr
    mapped = set(re.findall(r"/dev/shm/mpich_shm_[0-9a-f]+_[0-9]+", said))
    assert mapped and not [path for path in mapped if os.path.exists(path)]  # unlinked as an abort would


def test_a_rank_waiting_in_mpi_init_for_a_rank_that_never_came_ends_on_sigterm(tmp_path) -> None:
    """Rank 1's command line is refused before MPI starts (an MPMD launch); rank 0 waits in ``MPI_Init`` for it.
    SIGTERM must end rank 0 there: ``sparse-dist`` installs its handler only once MPI has started."""
    data = write(cora(), tmp_path / "cora", parts=2)
    sparse_dist = str(BIN / "sparse-dist")
    good = [sparse_dist, "train", "--data", str(data), "--epochs", "2", "--out", str(tmp_path / "run.jsonl")]
    process = _start([mpiexec_path(), "-n", "1", *good, ":", "-n", "1", *good, "--no-such-flag"])
    time.sleep(8.0)  # rank 1 refused its flag and exited (silently: launcher rank 0 says flag errors); rank 0 waits
    assert process.poll() is None, "the job ended before the signal"
    process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    result = finish(process, 60, "the MPMD job after SIGTERM")
    assert result.returncode != 0
    assert time.monotonic() - signalled < 15
    assert not (tmp_path / "run.jsonl").exists()
