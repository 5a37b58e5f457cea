import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

_EXIT_STATUS: list[int] = []
_SEGMENTS_BEFORE: set[Path] = set()


def _is_controller(config: pytest.Config) -> bool:
    """The process that runs the session (not a pytest-xdist worker)."""
    return not hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if _is_controller(session.config):
        from runners.shm_leftovers import unmapped_segments

        _SEGMENTS_BEFORE.update(unmapped_segments())


def _remove_segments_the_session_left() -> None:
    """Remove the MPICH segments in /dev/shm that appeared during this session and that no process maps: the
    suite kills MPI jobs on purpose (SIGKILL tests), and a killed rank leaves its segment behind. Segments
    that were there before the session are left alone, as are those a running job maps."""
    from runners.shm_leftovers import unmapped_segments

    for path in unmapped_segments():
        if path not in _SEGMENTS_BEFORE:
            path.unlink(missing_ok=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))
    if _is_controller(session.config):
        _remove_segments_the_session_left()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the test process with pytest's own status once everything is reported, skipping the interpreter's
    teardown: after the compiled sampler's numba kernels have run beside an initialised MPI in one process,
    that teardown segfaults inside native libraries' exit handlers in most runs (no Python frame; a 10-line
    script of a single-rank ``DistributedSampler`` reproduces it), which would turn a passing suite into exit
    status 139. ``sparse-dist`` itself is not affected (its runs, tested through their exit status in
    subprocesses, end normally). Not in a pytest-xdist worker: its results reach the controller over a channel
    that an early ``os._exit`` can cut before the last message is out, which the controller reports as a crash;
    a worker's own exit status is not the session's."""
    if _EXIT_STATUS and _is_controller(config):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
