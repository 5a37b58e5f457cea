"""Where the ``mpiexec`` of this installation is: the one beside the Python interpreter (the ``mpich`` wheel puts
it in the virtual environment's ``bin``), else the first on ``PATH``."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def find_mpiexec() -> str | None:
    """Path of the ``mpiexec`` to launch ranks with, or None when there is none."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")
