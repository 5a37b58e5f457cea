import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))

_EXIT_STATUS: list[int] = []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """End the test process with pytest's own status once everything is reported, skipping the interpreter's
    teardown: after the compiled sampler's numba kernels have run beside an initialised MPI in one process,
    that teardown segfaults inside native libraries' exit handlers in most runs (no Python frame; a 10-line
    script of a single-rank ``DistributedSampler`` reproduces it), which would turn a passing suite into exit
    status 139. ``sparse-dist`` itself is not affected (its runs, tested through their exit status in
    subprocesses, end normally)."""
    if _EXIT_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
