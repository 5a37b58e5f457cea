"""Launch a script under real ``mpiexec`` with a hard timeout (never a hang)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "mpi" / "cases"
BIN = Path(sys.executable).parent


def mpiexec_path() -> str:
    candidate = BIN / "mpiexec"
    return str(candidate) if candidate.exists() else "mpiexec"


def finish(process: subprocess.Popen[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    """Wait for ``process`` (started with ``start_new_session=True``); past ``timeout`` kill its whole process
    group and fail naming ``what``, so a hang is a failed test, never a hung suite."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{what} did not finish within {timeout} s\n{stdout}\n{stderr}") from None
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run_with_timeout(argv: list[str], *, timeout: float, cwd: Path = ROOT,
                     env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in its own process group with ``env`` (default: this one, one OpenMP thread, unbuffered
    Python, ``MPIEXEC_TIMEOUT``), under :func:`finish`'s timeout."""
    env = env or dict(os.environ, MPIEXEC_TIMEOUT=str(int(timeout)), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    began = time.perf_counter()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        return finish(process, timeout, " ".join(argv))
    finally:
        _log_launch(argv, time.perf_counter() - began)


def _log_launch(argv: list[str], seconds: float) -> None:
    """With SPARSE_DIST_TEST_LAUNCH_LOG=FILE, append ``seconds test argv`` per launch (where suite time goes)."""
    path = os.environ.get("SPARSE_DIST_TEST_LAUNCH_LOG")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(path, "a") as log:
            log.write(f"{seconds:.2f}\t{test}\t{' '.join(argv)[:300]}\n")


def run_mpi(ranks: int, argv: list[str], timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """Run ``mpiexec -n ranks argv...``; kill the whole process group if it outlives ``timeout``."""
    return run_with_timeout([mpiexec_path(), "-n", str(ranks), *argv], timeout=timeout)


def run_case(ranks: int, script: str, *args: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """Run ``tests/mpi/cases/<script>`` on ``ranks`` ranks."""
    return run_mpi(ranks, [sys.executable, str(CASES / script), *args], timeout=timeout)
