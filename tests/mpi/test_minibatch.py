"""Mini-batch training under real mpiexec (tests/mpi/cases/minibatch_cases.py, one launch per rank count):
exactness against the independent reference with every fanout "all" and one batch, counted == predicted
sample and fetch bytes per batch, P-invariance of sampled steps; and the ``train --mode minibatch`` command's
results file."""

import json
from pathlib import Path

import pytest
from datasets_for_tests import cora, write
from mpirun import BIN, run_case, run_mpi

SPARSE_DIST = str(BIN / "sparse-dist")


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_minibatch_cases(ranks: int) -> None:
    """Exactness at P = ranks (and P = 1 inside the P = 2 launch), bytes, P-invariance."""
    result = run_case(ranks, "minibatch_cases.py", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks pass" in result.stdout, result.stdout + result.stderr
    assert f"BYTES P={ranks}" in result.stdout and "mismatches=0" in result.stdout, result.stdout
    assert f"EXACT P={ranks}" in result.stdout and (ranks != 2 or "EXACT P=1" in result.stdout), result.stdout


def test_train_command_writes_minibatch_records(tmp_path: Path) -> None:
    data = write(cora(), tmp_path / "cora", parts=2)
    out = tmp_path / "run.jsonl"
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(data), "--mode", "minibatch", "--fanouts", "5,all",
                         "--batch-size", "32", "--feature-cache", "50", "--epochs", "2", "--out", str(out)],
                     timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    config = records[0]
    assert (config["mode"], config["fanouts"], config["batch_size"], config["feature_cache"]) == \
        ("minibatch", [5, "all"], 32, 50)
    epochs = [r for r in records if r["type"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2]
    for record in epochs:
        assert set(record["time"]) == {"total", "sample", "fetch", "compute", "allreduce", "wait"}
        assert record["bytes"]["sample"]["sent"]["max"] > 0 and record["bytes"]["fetch"]["recv"]["max"] > 0
        assert record["bytes"]["forward"]["sent"]["max"] == 0  # training moves no full-graph exchange
        cache = record["feature_cache"]
        assert 0 < cache["needed"] and 0 <= cache["hits"] <= cache["needed"]
        assert cache["hit_rate"] == cache["hits"] / cache["needed"]
        assert 0.0 <= record["val_acc"] <= 1.0 and "wall" in record
    assert records[-1]["type"] == "final" and "test_acc" in records[-1]
