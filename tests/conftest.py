import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

_SEGMENTS_BEFORE: set[Path] = set()
_ZYGOTES: list = []
_IDLE_SLEEP_FOLDER: list[Path] = []


def _is_controller(config: pytest.Config) -> bool:
    """The process that runs the session (not a pytest-xdist worker)."""
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    """The controller preloads the idle-sleep ``sched_yield`` (tests/support/idle_sleep.py) and then starts the
    zygotes every launched Python process is forked from (tests/support/preload), which inherit it."""
    if _is_controller(config):
        import tempfile

        import idle_sleep
        from preload import start

        _IDLE_SLEEP_FOLDER.append(Path(tempfile.mkdtemp(prefix="sparse-dist-idle-sleep-")))
        idle_sleep.install(_IDLE_SLEEP_FOLDER[0])
        _ZYGOTES.append(start.start())


def pytest_unconfigure(config: pytest.Config) -> None:
    if _is_controller(config) and _ZYGOTES:
        from preload import start

        start.stop(_ZYGOTES.pop())
    if _is_controller(config) and _IDLE_SLEEP_FOLDER:
        import shutil

        shutil.rmtree(_IDLE_SLEEP_FOLDER.pop(), ignore_errors=True)


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
    if _is_controller(session.config):
        _remove_segments_the_session_left()
