"""``sparse-dist bench minibatch`` end to end under real mpiexec: both systems train, the ratio is theirs; the
PyG peer (numpy sampling kernel here) and the DGL peer (where dgl is installed; refused in one sentence where
it is not)."""

import json
import sys
from pathlib import Path

import pytest
from datasets_for_tests import random_directed, write
from mpirun import BIN, run_mpi

from runners import cli
from runners.bench.minibatch_dgl import dgl_problem

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
    assert set(ours["breakdown"]) == {"sample", "fetch", "compute", "allreduce", "allreduce_wait", "wait"}
    assert 0.0 <= ours["cache_hit_rate"] <= 1.0
    assert report["peer"] == "pyg" and 0.0 < peer["sample_s"] < peer["epoch_s"]
    assert "throughput ratio sparse-dist / pyg" in result.stdout and "PyG (" in result.stdout


def test_bench_minibatch_refuses_fanouts_that_do_not_fit_the_layers_before_mpi(tmp_path: Path) -> None:
    result = run_mpi(2, [SPARSE_DIST, "bench", "minibatch", "--data", str(tmp_path), "--layers", "3",
                         "--fanouts", "10,10"], timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("--fanouts has 2 entries for --layers 3: give one per layer") == 1, result.stderr


def test_bench_minibatch_peer_dgl_without_dgl_is_refused_in_one_sentence(monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``--peer dgl`` where dgl is not installed (hidden here): one sentence, exit 2, before MPI starts."""
    monkeypatch.setitem(sys.modules, "dgl", None)  # importlib.util.find_spec("dgl") is None, as when absent
    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "minibatch", "--data", "/no/such/dataset", "--peer", "dgl"])
    assert exit_info.value.code == 2
    said = capsys.readouterr().err
    assert said.count("error:") == 1 and "--peer dgl: dgl is not installed; install the optional extra" in said, said
    assert said.count(".") <= 4 and said.strip().count("\n") == 1, said  # the sentence and the --help pointer


@pytest.mark.slow
def test_bench_minibatch_dgl_peer_reports_sampling_and_epoch_times(tmp_path: Path) -> None:
    if dgl_problem() is not None:
        pytest.skip("dgl is not installed (the optional extra dgl)")
    data = write(random_directed(n=300, seed=5), tmp_path / "g", parts=2)
    result = run_mpi(2, [SPARSE_DIST, "bench", "minibatch", "--data", str(data), "--layers", "2", "--hidden", "8",
                         "--fanouts", "4,all", "--batch-size", "16", "--epochs", "2", "--warmup", "1", "--peer", "dgl",
                         "--sampler", "numba", "--json"], timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    ours, peer = report["sparse_dist"], report["dgl"]
    assert report["peer"] == "dgl" and ours["sampler"] == "numba"
    assert ours["steps"] == peer["steps"] == -(-ours["seeds"] // 32)
    assert 0.0 < peer["sample_s"] < peer["epoch_s"] and peer["sample_only_s"] > 0.0
    assert report["ratio"]["sample"] == pytest.approx(ours["breakdown"]["sample"] / peer["sample_s"])
    assert 0.0 <= peer["test_acc"] <= 1.0 and peer["sampler"].startswith("DGL 2.1.0 NeighborSampler")
    assert "throughput ratio sparse-dist / dgl" in result.stdout and "dgl sampler alone" in result.stdout
