"""Mini-batch training under real mpiexec: the ``train --mode minibatch`` command's results file, checkpoints
and resume (the collective cases, tests/mpi/cases/minibatch_cases.py, ride in test_training_cases.py's launches)."""

import pytest
import json
import shutil
from pathlib import Path

import torch
from datasets_for_tests import cora, write
from mpirun import BIN, run_mpi

from algorithms.checkpoint import MAIN_FILE, read_pointer

SPARSE_DIST = str(BIN / "sparse-dist")


# minibatch_cases.py (exactness, bytes, P-invariance, bulk sampling, prefetch) runs at P = 2, 3 and 4 inside
# tests/mpi/test_training_cases.py's launches.


def test_train_command_writes_minibatch_records(tmp_path: Path) -> None:
    data = write(cora(), tmp_path / "cora", parts=2)
    out = tmp_path / "run.jsonl"
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(data), "--mode", "minibatch", "--fanouts", "5,all",
                         "--batch-size", "32", "--feature-cache", "50", "--sample-batches", "2", "--epochs", "2",
                         "--out", str(out)],
                     timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    config = records[0]
    assert (config["mode"], config["fanouts"], config["batch_size"], config["feature_cache"],
            config["sample_batches"]) == ("minibatch", [5, "all"], 32, 50, 2)
    epochs = [r for r in records if r["type"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2]
    for record in epochs:
        assert set(record["time"]) == {"total", "sample", "fetch", "compute", "allreduce", "allreduce_wait", "wait"}
        assert record["bytes"]["sample"]["sent"]["max"] > 0 and record["bytes"]["fetch"]["recv"]["max"] > 0
        assert record["bytes"]["forward"]["sent"]["max"] == 0  # training moves no full-graph exchange
        cache = record["feature_cache"]
        assert 0 < cache["needed"] and 0 <= cache["hits"] <= cache["needed"]
        assert cache["hit_rate"] == cache["hits"] / cache["needed"]
        assert 0.0 <= record["val_acc"] <= 1.0 and "wall" in record
    assert records[-1]["type"] == "final" and "test_acc" in records[-1]


def _epoch_losses(out: Path) -> dict[int, float]:
    return {r["epoch"]: r["loss"] for r in map(json.loads, out.read_text().splitlines()) if r["type"] == "epoch"}


@pytest.mark.slow
def test_a_minibatch_checkpoint_resumes_bitwise_and_at_another_p_with_the_same_global_batch(tmp_path: Path) -> None:
    """Stopped after epoch 2 of 4 (P = 2, B = 32) and resumed (with prefetch and bulk sampling): bitwise the
    uninterrupted run's losses and final weights. Resumed at P = 4 with B = 16 (the same global batch of 64): the same losses to float rounding."""
    data = write(cora(), tmp_path / "cora", parts=4)  # one numbering for P = 2 and 4
    flags = ["--mode", "minibatch", "--fanouts", "5,5", "--dropout", "0.5", "--print-every", "1000"]

    def train(ranks: int, batch: int, epochs: int, checkpoint: Path, *extra: str) -> None:
        result = run_mpi(ranks, [SPARSE_DIST, "train", "--data", str(data), *flags, "--batch-size", str(batch),
                                 "--epochs", str(epochs), "--checkpoint", str(checkpoint), *extra], timeout=240)
        assert result.returncode == 0, result.stdout + result.stderr

    whole, split, other_p = tmp_path / "whole", tmp_path / "split", tmp_path / "other_p"
    train(2, 32, 4, whole / "run.ckpt", "--out", str(tmp_path / "whole.jsonl"))
    train(2, 32, 2, split / "run.ckpt", "--feature-cache", "30")  # the cache changes no result
    shutil.copytree(split, other_p)
    train(2, 32, 4, split / "run.ckpt", "--resume", "--prefetch", "1", "--sample-batches", "3",
          "--out", str(tmp_path / "split.jsonl"))  # neither changes a result
    train(4, 16, 4, other_p / "run.ckpt", "--resume", "--out", str(tmp_path / "other_p.jsonl"))
    expected, resumed, elsewhere = (_epoch_losses(tmp_path / f"{name}.jsonl")
                                    for name in ("whole", "split", "other_p"))
    assert sorted(expected) == [1, 2, 3, 4] and sorted(resumed) == sorted(elsewhere) == [3, 4]
    assert all(resumed[epoch] == expected[epoch] for epoch in resumed), (resumed, expected)
    weights = [read_pointer(directory / "run.ckpt").load(MAIN_FILE) for directory in (whole, split, other_p)]
    assert all(state["epoch"] == 4 for state in weights)
    assert weights[0]["config"]["global_batch_size"] == weights[2]["config"]["global_batch_size"] == 64
    assert all(torch.equal(weights[1]["model"][name], value) for name, value in weights[0]["model"].items())
    assert max(abs(elsewhere[epoch] - expected[epoch]) for epoch in elsewhere) < 1e-5, (elsewhere, expected)
    assert all(torch.allclose(weights[2]["model"][name], value, atol=1e-5) for name, value in weights[0]["model"].items())
