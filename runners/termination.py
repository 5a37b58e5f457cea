"""SIGTERM and SIGINT for an MPI command: cleanup where the main thread can run it, an end where it cannot.

Python runs a signal's handler in the main thread, between two bytecodes. A rank blocked inside MPI (a collective
whose peer is gone or stuck, or ``MPI_Init`` waiting for a rank that died before it) never gets there: its
``SystemExit`` (SIGTERM, :func:`install`) or ``KeyboardInterrupt`` (SIGINT) waits forever, so ``timeout``,
``kill`` or a launcher's first signal did not end the job (only a SIGKILL did). :func:`install` keeps the handlers
and adds a watcher thread: Python's C-level handler writes each signal's number to a pipe
(:func:`signal.set_wakeup_fd`, no GIL needed), the watcher reads it (mpi4py's blocking calls release the GIL), and
if the process is still alive :data:`HARD_EXIT_GRACE_SECONDS` later it unlinks the MPICH shared-memory segments
it maps (as an abort does), writes one line (launcher rank 0 only) and ends the process with ``128 + signal``
without further cleanup. Every writer of the project writes under a temporary name
or streams to ``NAME.partial`` (:class:`runners.results.ResultsWriter`), so a hard end leaves no half-written file
under a final name. Local: no communication.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import NoReturn

from runners.argtypes import launcher_rank

HARD_EXIT_GRACE_SECONDS = 10.0
"""How long the main thread has to act on SIGTERM or SIGINT (its cleanup) before the watcher ends the process."""

_WATCHED = (signal.SIGTERM, signal.SIGINT)
_installed = False
_lock = threading.Lock()


def raise_on_sigterm(signum: int, frame: object) -> NoReturn:
    """SIGTERM's handler: ``SystemExit(143)``, so that cleanup (``finally``, context managers) runs as for SIGINT."""
    raise SystemExit(128 + signum)


def install(prog: str, grace: float = HARD_EXIT_GRACE_SECONDS) -> bool:
    """SIGTERM raises ``SystemExit(143)`` (:func:`raise_on_sigterm`), and a watcher ends the process ``grace`` seconds
    after a SIGTERM or SIGINT the main thread could not act on (module docstring). Once a process, from the main
    thread; False where it cannot be installed (not the main thread, or a wakeup fd set by someone else)."""
    global _installed
    with _lock:
        if _installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        if signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False) != -1:  # someone else's: leave it theirs
            signal.set_wakeup_fd(-1)
            os.close(read_fd)
            os.close(write_fd)
            return False
        signal.signal(signal.SIGTERM, raise_on_sigterm)
        threading.Thread(target=_watch, args=(read_fd, prog, grace), name="signal-watch", daemon=True).start()
        _installed = True
        return True


def _watch(read_fd: int, prog: str, grace: float) -> None:
    """Reads signal numbers from the wakeup pipe; after a watched one, waits ``grace`` and ends the process."""
    while True:
        received = os.read(read_fd, 64)
        if not received:
            return
        watched = [number for number in received if number in _WATCHED]
        if watched:
            time.sleep(grace)
            number = watched[0]
            from sparse_dist.comm.abort import unlink_mpich_segments  # here: a command line's import starts no MPI

            unlink_mpich_segments()  # as an abort does: MPICH removes them only in MPI_Finalize
            if launcher_rank() == 0:
                sys.stderr.write(f"{prog}: error: {signal.Signals(number).name} not acted on within {grace:g} s "
                                 "(a rank waiting inside MPI); ending without cleanup\n")
                sys.stderr.flush()
            os._exit(128 + number)
