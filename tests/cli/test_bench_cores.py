"""``sparse-dist bench cores`` end to end: real mpiexec runs per node split, the table and its JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from datasets_for_tests import random_directed, write
from mpirun import BIN

SPARSE_DIST = str(BIN / "sparse-dist")


@pytest.mark.slow
def test_bench_cores_runs_every_split_and_dropout_and_says_a_failed_run_in_one_sentence(tmp_path: Path) -> None:
    write(random_directed(n=400, seed=3), tmp_path / "data", parts=2)
    out = tmp_path / "cores.json"
    common = [SPARSE_DIST, "bench", "cores", "--data", str(tmp_path / "data"), "--epochs", "3", "--hidden", "8",
              "--layers", "2", "--scratch", str(tmp_path)]
    result = subprocess.run(common + ["--node-splits", "1x1,2x1", "--out", str(out)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    record = json.loads(out.read_text())
    rows = {(row["ranks"], row["threads"], row["dropout"]): row for row in record["rows"]}
    assert set(rows) == {(1, 1, 0.5), (1, 1, 0.0), (2, 1, 0.5), (2, 1, 0.0)}
    assert all(row["step"] > 0 for row in rows.values()) and rows[(1, 1, 0.5)]["speedup"] == 1.0
    assert rows[(2, 1, 0.5)]["dropout_part"] > 0 and rows[(2, 1, 0.0)]["dropout_part"] == 0
    assert all(row["parts"]["local_spmm"] > 0 for row in rows.values())  # each part of the step, on its own
    assert record["code"]["commit"] and record["usable_cores"] >= 1 and "load_at_start" in record
    assert "2 x 1: dropout 0.5 step / dropout 0 step" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cores.json", "data"]  # its scratch is gone
    failed = subprocess.run(common + ["--node-splits", "3x1"], capture_output=True, text=True, timeout=300)
    assert failed.returncode == 1 and failed.stderr.startswith("sparse-dist bench cores: error: 3 x 1 at dropout")
    assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
