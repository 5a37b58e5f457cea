"""Launch a script under real ``mpiexec`` with a hard timeout (never a hang)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = Path(__file__).resolve().parent / "mpi_cases"
BIN = Path(sys.executable).parent


def mpiexec_path() -> str:
    candidate = BIN / "mpiexec"
    return str(candidate) if candidate.exists() else "mpiexec"


def run_mpi(ranks: int, argv: list[str], timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """Run ``mpiexec -n ranks argv...``; kill the whole process group if it outlives ``timeout``."""
    env = dict(os.environ, MPIEXEC_TIMEOUT=str(int(timeout)), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    command = [mpiexec_path(), "-n", str(ranks), *argv]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(f"{' '.join(command)} did not finish within {timeout} s\n{stdout}\n{stderr}") from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def run_case(ranks: int, script: str, *args: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    """Run ``tests/mpi_cases/<script>`` on ``ranks`` ranks."""
    return run_mpi(ranks, [sys.executable, str(CASES / script), *args], timeout=timeout)
