"""Every MPI rank imports numba: two ranks compiling the sampler into one empty numba cache directory at the
same moment, then two ranks loading it (tests/mpi/cases/sampler_cache.py), under ``mpiexec -n 2`` with a
timeout."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from mpirun import CASES, mpiexec_path, run_with_timeout

pytest.importorskip("numba")


@pytest.mark.slow  # two launches compiling numba code: about a minute on a loaded 2-core machine
def test_two_ranks_share_a_fresh_numba_cache_then_load_it(tmp_path: Path) -> None:
    cache = tmp_path / "numba-cache"
    env = dict(os.environ, MPIEXEC_TIMEOUT="180", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
               NUMBA_CACHE_DIR=str(cache))
    said = []
    for launch in ("compile", "load"):
        result = run_with_timeout([mpiexec_path(), "-n", "2", sys.executable, str(CASES / "sampler_cache.py")],
                                  timeout=180, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "sampler cache P=2: all checks pass" in result.stdout, result.stdout
        said.append({int(r): (int(h), int(m)) for r, h, m in
                     re.findall(r"CACHE rank=(\d) hits=(\d+) misses=(\d+)", result.stdout)})
        files = sorted(p.suffix for p in cache.rglob("*sampling_compiled*"))
        assert ".nbi" in files and ".nbc" in files, files  # the index and the compiled code, whole
        assert not list(cache.rglob("*.tmp.*"))  # no temporary file left behind
    assert set(said[1]) == {0, 1} and all(hits >= 1 and misses == 0 for hits, misses in said[1].values()), said
