"""Distributed training under real mpiexec: exactness at P = 1 (the other P in test_training_cases.py), the results
file, refusals of bad input (checkpoint/resume: tests/mpi/test_checkpoint.py)."""

import subprocess
from pathlib import Path

import numpy as np
import pytest
from datasets_for_tests import cora, random_directed, write
from mpirun import BIN, run_case, run_mpi

SPARSE_DIST = str(BIN / "sparse-dist")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shards")
    return {"random": write(random_directed(), root / "random"), "cora": write(cora(), root / "cora")}


# P = 2, 3 and 4 (c = 1 and 2) run the same checks inside tests/mpi/test_training_cases.py's launches
@pytest.mark.parametrize("ranks,replication", [(1, 1)])
def test_training_equals_single_process_reference(shards, ranks: int, replication: int) -> None:
    result = run_case(ranks, "train_parity.py", str(shards["random"]), str(shards["cora"]),
                      "--replication", str(replication), timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "12 runs, all equal the reference" in result.stdout, result.stdout + result.stderr


def _train(data: Path, *extra: str, ranks: int = 2) -> subprocess.CompletedProcess[str]:
    return run_mpi(ranks, [SPARSE_DIST, "train", "--data", str(data), "--print-every", "1000", *extra],
                   timeout=240)


def test_the_cover_plan_reports_its_set_up_time_beside_the_epochs(shards, tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    result = _train(shards["random"], "--plan", "cover", "--epochs", "1", "--out", str(out), ranks=2)
    assert result.returncode == 0, result.stderr
    import json

    setup = next(json.loads(line) for line in out.read_text().splitlines() if '"setup"' in line)
    seconds = setup["plan_setup_seconds"]  # each rank's matchings, set-up exchanges and matrices
    assert 0 < seconds["min"] <= seconds["mean"] <= seconds["max"]


def test_results_file_has_breakdown_bytes_and_memory(shards, tmp_path: Path) -> None:
    out = tmp_path / "results.jsonl"
    result = _train(shards["random"], "--epochs", "3", "--out", str(out), ranks=3)
    assert result.returncode == 0, result.stderr
    import json

    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["type"] for r in records] == ["config", "environment", "setup", "epoch", "epoch", "epoch", "final"]
    assert "MPICH" in records[1]["mpi_library"]
    setup, epoch, final = records[2], records[3], records[-1]
    # 12 features -> 16 hidden: layer 0 would exchange X's 12 columns in 3 training and 3 evaluation forwards,
    # six times what fetching the halo once costs, so auto fetches it once.
    assert setup["input_exchange"]["mode"] == "once" and setup["input_exchange"]["requested"] == "auto"
    assert setup["input_exchange"]["per_epoch_run_bytes"] == 6 * setup["input_exchange"]["once_bytes"] > 0
    assert setup["bytes"]["halo"]["recv"]["min"] > 0 and setup["bytes"]["other"]["sent"]["min"] > 0
    assert setup["halo"]["halo_bytes"]["max"] == max(setup["halo_bytes_per_rank"]) > 0
    assert "plan_setup_seconds" not in setup  # p2p builds nothing beyond the matrix
    assert all("eval_bytes" in r for r in records[3:6])  # --eval-every 1
    evaluated = sum(r["eval_bytes"]["forward"]["sent"]["mean"] for r in records[3:6])
    trained = sum(r["bytes"][phase]["sent"]["mean"] for r in records[3:6] for phase in ("forward", "backward"))
    assert evaluated > 0
    assert final["bytes_total"]["forward"]["sent"]["mean"] + final["bytes_total"]["backward"]["sent"]["mean"] == \
        pytest.approx(trained + evaluated)  # the run's total holds training and evaluation exchanges
    assert set(epoch["time"]) == {"total", "local_spmm", "exchange", "exchange_wait", "allreduce", "allreduce_wait",
                                  "masks", "dropout", "optimizer", "dense"}
    assert min(epoch["time"][key]["max"] for key in ("masks", "dropout", "optimizer")) > 0  # dropout 0.5 by default
    parts = sum(epoch["time"][key]["mean"] for key in epoch["time"] if key != "total")
    assert abs(parts - epoch["time"]["total"]["mean"]) < 1e-6  # per rank, the parts add up to its epoch
    assert epoch["bytes"]["forward"]["recv"]["max"] > 0
    assert epoch["bytes"]["grad_allreduce"]["sent"]["min"] > 0
    assert len(records[-1]["peak_memory_per_rank"]) == 3
    assert "final test accuracy" in result.stdout


# ---------------------------------------------------------------- bad input
def _expect_refusal(data: Path, needle: str, ranks: int = 2) -> None:
    result = _train(data, "--epochs", "1", ranks=ranks)
    assert result.returncode != 0
    assert needle in result.stderr, result.stderr


def test_missing_shard_is_refused(tmp_path: Path) -> None:
    data = write(random_directed(), tmp_path / "d", parts=2)
    (data / "part-00001.npz").unlink()
    _expect_refusal(data, "part-00001.npz: shard file missing")


def test_damaged_shard_is_refused(tmp_path: Path) -> None:
    data = write(random_directed(), tmp_path / "d", parts=2)
    blob = bytearray((data / "part-00000.npz").read_bytes())
    blob[200] ^= 0xFF
    (data / "part-00000.npz").write_bytes(bytes(blob))
    _expect_refusal(data, "checksum does not match meta.json")


def test_rank_count_that_does_not_fit_the_parts_is_refused(tmp_path: Path) -> None:
    data = write(random_directed(), tmp_path / "d", parts=4)
    _expect_refusal(data, "4 parts cannot be split over 3 row groups", ranks=3)


def test_labels_out_of_range_are_refused(tmp_path: Path) -> None:
    graph = random_directed()
    graph.labels[150] = 9
    _expect_refusal(write(graph, tmp_path / "d", parts=2, partitioner="block"),
                    "part-00001.npz: array 'labels' at 50 is 9, expected a class in [0, 3] (num_classes=4)")


def test_non_finite_features_are_refused(tmp_path: Path) -> None:
    graph = random_directed()
    graph.features[3, 1] = np.nan
    _expect_refusal(write(graph, tmp_path / "d", parts=2, partitioner="block"),
                    "part-00000.npz: array 'features' at (3, 1) is nan, expected a finite value")


def test_directory_in_the_wrong_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    _expect_refusal(tmp_path / "empty", "not a prepared dataset (no meta.json)")
    bad = write(random_directed(), tmp_path / "d", parts=2)
    (bad / "meta.json").write_text('{"format_version": 1}')
    _expect_refusal(bad, "missing fields")
