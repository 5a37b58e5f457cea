"""Start and stop the suite's zygotes (:mod:`zygote`), from the session's controlling process.

``SPARSE_DIST_TEST_PRELOAD=off`` runs the suite without them (every launch a fresh interpreter). Two families
of :data:`COUNT` zygotes each: ``one`` with one OpenMP thread (what :func:`mpirun.run_with_timeout` gives its
launches) and ``inherit`` with the session's environment as it is (the tests that start processes
themselves); a launch whose import-time environment matches neither starts as usual.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITE = HERE / "site"
COUNT = 4
"""Zygotes a family: rank ``r`` of a launch goes to zygote ``r mod COUNT`` (distinct hash seeds for the ranks of
a job up to this size)."""
SWITCH = "SPARSE_DIST_TEST_PRELOAD"


def start() -> tuple[Path, list[subprocess.Popen[bytes]]] | None:
    """Start the zygotes in a new folder and point this process's environment (and so every later launch's) at
    them; None where ``SPARSE_DIST_TEST_PRELOAD=off``."""
    if os.environ.get(SWITCH) == "off":
        return None
    folder = Path(tempfile.mkdtemp(prefix="sparse-dist-zygotes-"))
    python_path = os.pathsep.join([str(SITE)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    os.environ["PYTHONPATH"] = python_path
    families = {"one": {"OMP_NUM_THREADS": "1"}, "inherit": {}}
    processes = []
    for family, extra in families.items():
        env = {key: value for key, value in os.environ.items() if key != SWITCH}
        env.update(extra)
        for index in range(COUNT):
            processes.append(subprocess.Popen([sys.executable, str(HERE / "zygote.py"), str(folder),
                                               f"{family}-{index}"], env=env, stdin=subprocess.DEVNULL))
            # a launch waits for this zygote's key while this pid lives (it writes the key once it has imported)
            (folder / f"{family}-{index}.pid").write_text(str(processes[-1].pid))
    (folder / "families.json").write_text(json.dumps({"zygotes": COUNT, "families": list(families)}))
    os.environ[SWITCH] = str(folder)
    return folder, processes


def stop(started: tuple[Path, list[subprocess.Popen[bytes]]] | None) -> None:
    """End the zygotes and remove the folder this module made."""
    if started is None:
        return
    folder, processes = started
    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
    for entry in folder.iterdir():
        entry.unlink()
    folder.rmdir()
