"""One job of a sweep, run so that it dies with the sweep and is always stopped whole.

``python -m runners.study.supervisor SWEEP_PID GRACE -- COMMAND...`` (started by ``sparse-dist sweep`` in a new
session) asks the kernel for SIGTERM when the sweep dies (``prctl(PR_SET_PDEATHSIG)``, so a ``kill -9`` of
the sweep stops its job too) and becomes a child subreaper (``PR_SET_CHILD_SUBREAPER``: a process of the
job whose parent dies, such as a rank whose launcher was killed, is re-parented here rather than to PID 1,
so it stays findable). It runs COMMAND and exits with its status. On SIGTERM, SIGINT or SIGHUP (the sweep's
time limit, or the sweep's death) it stops the job: SIGTERM to COMMAND (``mpiexec`` passes it on to the
ranks, ``emulate`` tears its network down, ``prepare`` removes its temporary directory), then, after GRACE
seconds, SIGKILL to every process still below it. Whatever the job leaves running after COMMAND exits is
stopped the same way. Processes of the job live in sessions of their own (hydra starts each proxy and rank
in one), which is why a process group alone cannot hold them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _Stop(Exception):
    """Raised by the signal handler: stop the job."""


def descendants(root: int) -> list[int]:
    """Processes below ``root`` (children, their children, ...) that have not exited, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _reap() -> None:
    """Collect exited children (orphans of the job are re-parented here), so that none stays a zombie."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def _wait_gone(seconds: float) -> bool:
    """Wait up to ``seconds`` for every process below this one to exit; whether they all did."""
    deadline = time.monotonic() + seconds
    while True:
        _reap()
        if not descendants(os.getpid()):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_job(child: subprocess.Popen[bytes] | None, grace: float) -> None:
    """SIGTERM to ``child`` (or, without one, to every process below this one), SIGKILL to whatever is still
    below this one after ``grace`` seconds."""
    if child is not None and child.poll() is None:
        child.send_signal(signal.SIGTERM)
    else:
        _signal(descendants(os.getpid()), signal.SIGTERM)
    if not _wait_gone(grace):
        _signal(descendants(os.getpid()), signal.SIGKILL)
        _wait_gone(5.0)


def _raise_stop(signum: int, frame: object) -> None:
    for stop in STOP_SIGNALS:
        signal.signal(stop, signal.SIG_IGN)  # said once: the stop below runs to its end
    raise _Stop


def main(argv: list[str]) -> int:
    sweep, grace, command = int(argv[0]), float(argv[1]), argv[3:]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
    child = None
    try:
        for stop in STOP_SIGNALS:
            signal.signal(stop, _raise_stop)
        if os.getppid() != sweep:  # the sweep died before the kernel was asked to say so
            return 128 + signal.SIGTERM
        child = subprocess.Popen(command)
        status = child.wait()
        if descendants(os.getpid()):  # the job's command ended and left processes behind
            stop_job(None, grace)
        return status if status >= 0 else 128 - status
    except _Stop:
        stop_job(child, grace)
        return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
