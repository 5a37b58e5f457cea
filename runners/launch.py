"""When this process was launched: the zero of every ``wall`` figure (time-to-accuracy).

:func:`launch_time` is the process's own start as the kernel recorded it (``/proc/self/stat`` field 22,
clock ticks since boot, turned into Unix seconds with ``CLOCK_BOOTTIME``), so the Python interpreter's start-up
and every import are counted. What it leaves out: the launcher's own start-up before it forks this rank
(``mpiexec``/hydra or ``srun`` starting, and under ``sparse-dist emulate`` the set-up of the network
namespaces), which no rank can see. Where ``/proc`` is missing (not Linux), it falls back to the moment this
module was first imported, which ``runners.cli`` does before any heavy import (torch, MPI, the data); the
interpreter's own start-up is then left out too. :data:`LAUNCH_SOURCE` says which one was used.
"""

from __future__ import annotations

import os
import time

_IMPORTED_AT = time.time()


def _process_start() -> float | None:
    """This process's start in Unix seconds from ``/proc`` (10 ms resolution), or None where it cannot be read."""
    try:
        with open("/proc/self/stat") as handle:
            text = handle.read()
        # field 2 (comm) may hold spaces and parentheses: the fields after it start behind the last ')'
        after_name = text[text.rindex(")") + 2:].split()
        ticks = int(after_name[19])  # field 22 overall: starttime, in clock ticks since boot
        since_boot = ticks / os.sysconf("SC_CLK_TCK")
        boot = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
        start = boot + since_boot
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return start if start <= _IMPORTED_AT + 1.0 else None  # a clock that disagrees: not trusted


_PROCESS_START = _process_start()

LAUNCH_TIME: float = _PROCESS_START if _PROCESS_START is not None else _IMPORTED_AT
"""Unix seconds at which this process started (see the module docstring)."""

LAUNCH_SOURCE: str = "process start (/proc/self/stat)" if _PROCESS_START is not None else "first import of runners"
"""What :data:`LAUNCH_TIME` measures."""


def since_launch() -> float:
    """Seconds since :data:`LAUNCH_TIME` (wall clock)."""
    return time.time() - LAUNCH_TIME
