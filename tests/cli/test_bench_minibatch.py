"""``sparse-dist bench minibatch`` end to end under real mpiexec: both systems train, the ratio is theirs."""

import json
from pathlib import Path

import pytest
from datasets_for_tests import random_directed, write
from mpirun import BIN, run_mpi

SPARSE_DIST = str(BIN / "sparse-dist")


@pytest.mark.slow
def test_bench_minibatch_reports_both_systems_and_their_ratio(tmp_path: Path) -> None:
    pytest.importorskip("torch_geometric")
    data = write(random_directed(n=300, seed=5), tmp_path / "g", parts=2)
    result = run_mpi(2, [SPARSE_DIST, "bench", "minibatch", "--data", str(data), "--layers", "2", "--hidden", "8",
                         "--fanouts", "4,all", "--batch-size", "16", "--epochs", "2", "--warmup", "1",
                         "--feature-cache", "20", "--json"], timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    ours, peer = report["sparse_dist"], report["pyg"]
    train = report["sparse_dist"]["seeds"]
    assert ours["steps"] == peer["steps"] == -(-train // 32)  # a global batch of P * B = 32 seeds, both systems
    assert report["ratio"]["throughput"] == pytest.approx(ours["seeds_per_s"] / peer["seeds_per_s"])
    assert ours["seeds_per_s"] == pytest.approx(train / ours["epoch_s"])
    assert 0.0 <= ours["test_acc"] <= 1.0 and 0.0 <= peer["test_acc"] <= 1.0
    assert set(ours["breakdown"]) == {"sample", "fetch", "compute", "allreduce", "wait"}
    assert 0.0 <= ours["cache_hit_rate"] <= 1.0
    assert "throughput ratio sparse-dist / PyG" in result.stdout and "PyG sampler:" in result.stdout


def test_bench_minibatch_refuses_fanouts_that_do_not_fit_the_layers_before_mpi(tmp_path: Path) -> None:
    result = run_mpi(2, [SPARSE_DIST, "bench", "minibatch", "--data", str(tmp_path), "--layers", "3",
                         "--fanouts", "10,10"], timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("--fanouts has 2 entries for --layers 3: give one per layer") == 1, result.stderr
