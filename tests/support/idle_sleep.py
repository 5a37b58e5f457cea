"""Build the suite's ``sched_yield`` replacement (idle_sleep/idle_sleep.c) and preload it in every process the
session starts, so that ranks waiting in MPI on the oversubscribed CI machine sleep instead of spinning.

Test harness only: the project's code does not depend on it, and a machine without a C compiler (or
``SPARSE_DIST_TEST_IDLE_SLEEP=off``) runs the suite as before, only slower (about 5% on the 2-core machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "idle_sleep" / "idle_sleep.c"
SWITCH = "SPARSE_DIST_TEST_IDLE_SLEEP"


def install(folder: Path) -> Path | None:
    """Compile the replacement into ``folder`` and add it to this process's ``LD_PRELOAD`` (so to every later
    process's, the zygotes' included); its path, or None where switched off or no compiler built it."""
    if os.environ.get(SWITCH) == "off":
        return None
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        sys.stderr.write("tests: no C compiler; waiting MPI ranks spin (the suite runs slower)\n")
        return None
    library = folder / "idle_sleep.so"
    built = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(SOURCE), "-ldl"],
                           capture_output=True, text=True)
    if built.returncode != 0:
        sys.stderr.write(f"tests: idle_sleep.c did not build ({built.stderr.strip()[:200]}); waiting MPI ranks "
                         "spin (the suite runs slower)\n")
        return None
    preloads = [entry for entry in os.environ.get("LD_PRELOAD", "").split() if entry]
    os.environ["LD_PRELOAD"] = " ".join([str(library), *preloads])
    return library
