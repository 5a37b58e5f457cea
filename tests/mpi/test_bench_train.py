"""``sparse-dist bench train`` (and ``bench spmm --device``) under real mpiexec, plus the PyG peer's math."""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from mpirun import BIN, run_case, run_mpi

SPARSE_DIST = str(BIN / "sparse-dist")
HAVE_PYG = importlib.util.find_spec("torch_geometric") is not None
HAVE_DGL = importlib.util.find_spec("dgl") is not None
SMALL = ["--synthetic", "3000", "--epochs", "3", "--warmup", "1", "--hidden", "16", "--json"]
TOLERANCE_S = 1e-6


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def _check_sparse_dist(summary: dict, ranks: int, epochs: int) -> None:
    assert summary["epoch_s"] > 0
    assert len(summary["per_epoch_slowest"]) == epochs
    for epoch in summary["per_epoch_slowest"]:
        parts = [value for key, value in epoch.items() if key != "total"]
        assert epoch["total"] > 0 and min(parts) >= 0
        assert sum(parts) <= epoch["total"] + TOLERANCE_S, epoch
    assert set(summary["breakdown"]) >= {"total", "local_spmm", "exchange", "allreduce", "dense"}
    memory = summary["memory_per_rank"]
    assert len(memory) == ranks
    for rank_memory in memory:
        assert rank_memory["kind"] == "rss" and rank_memory["peak"] > 0
        if rank_memory["reset"]:  # a reset peak starts at the RSS of that moment
            assert 0 < rank_memory["before"] <= rank_memory["peak"]
    assert math.isfinite(summary["final_loss"]) and summary["final_loss"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_bench_train_reports_times_memory_and_the_pyg_peer(ranks: int) -> None:
    result = run_mpi(ranks, [SPARSE_DIST, "bench", "train", *SMALL], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    report = _last_json(result.stdout)
    assert report["world_size"] == ranks and report["dataset"]["num_nodes"] == 3000
    assert report["dataset"]["num_parts"] == ranks
    _check_sparse_dist(report["sparse_dist"], ranks, epochs=3)
    assert f"sparse-dist P={ranks}" in result.stdout
    if HAVE_PYG:
        peer = report["pyg"]
        assert peer["epoch_s"] > 0 and len(peer["per_epoch_slowest"]) == 3
        assert peer["memory_per_rank"][0]["peak"] > 0 and peer["threads"] == ranks * report["threads_per_rank"]
        assert math.isfinite(peer["final_loss"])
        assert report["ratio"]["epoch_time"] > 0 and report["ratio"]["peak_memory"] > 0
        assert "pyg_skipped" not in report
        assert any(line.startswith("pyg ") and "peer" not in line for line in result.stdout.splitlines())
    else:
        assert "pyg" not in report and "ratio" not in report
        assert "torch_geometric" in report["pyg_skipped"]


def test_bench_train_skips_the_peer_when_torch_geometric_is_missing() -> None:
    result = run_case(2, "bench_train_without_pyg.py", "--synthetic", "2000", "--epochs", "2", "--warmup", "0",
                      "--hidden", "8", "--layers", "2", "--json", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    report = _last_json(result.stdout)
    assert "pyg" not in report and "ratio" not in report
    assert "torch_geometric is not importable" in report["pyg_skipped"]
    assert "pyg peer skipped: torch_geometric is not importable" in result.stdout
    _check_sparse_dist(report["sparse_dist"], 2, epochs=2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
@pytest.mark.parametrize("bench", ["train", "spmm"])
def test_device_cuda_without_cuda_is_a_clear_error(bench: str) -> None:
    extra = ["--synthetic", "500"] if bench == "train" else ["--nodes", "500"]
    result = run_mpi(2, [SPARSE_DIST, "bench", bench, *extra, "--device", "cuda"], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "argument --device: cuda needs a GPU" in result.stderr and "Traceback" not in result.stderr


def test_bench_spmm_on_cpu_names_the_device() -> None:
    result = run_mpi(2, [SPARSE_DIST, "bench", "spmm", "--nodes", "2000", "--degree", "4", "--features", "8",
                         "--repeats", "1", "--plan", "p2p", "--device", "cpu", "--json"], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    report = _last_json(result.stdout)
    assert report["device"] == "cpu" and report["reference"]["device"] == "cpu"
    assert report["plans"]["p2p"]["bytes_match"] is True
    assert "SpMM benchmark on cpu" in result.stdout and "single process (cpu, " in result.stdout


# ------------------------------------------------------------- the peer's math, in this process
@pytest.fixture(scope="module")
def comm():
    from sparse_dist.comm import world

    communicator = world(gpu_aware="off")
    yield communicator
    communicator.free()


def _awkward_graph(n: int = 40, seed: int = 3) -> sp.csr_matrix:
    """Directed, weighted, with duplicates, some self-loops (one of weight 2.5) and an isolated node."""
    rng = np.random.default_rng(seed)
    rows, cols = rng.integers(0, n - 1, 150), rng.integers(0, n - 1, 150)
    values = rng.random(150) + 0.5
    loops = np.array([0, 5, 9])
    matrix = sp.coo_matrix((np.concatenate([values, [2.5, 1.0, 0.7]]),
                            (np.concatenate([rows, loops]), np.concatenate([cols, loops]))), shape=(n, n))
    return sp.csr_matrix(matrix)  # node n - 1 has no edges at all


def test_peer_gcn_adjacency_equals_the_trainers_normalisation(comm) -> None:
    from algorithms.normalize import gcn_normalize
    from runners.bench.pyg_peer import gcn_adjacency
    from sparse_dist.layout import RowLayout

    raw = _awkward_graph()
    n = raw.shape[0]
    ours = gcn_normalize(comm, RowLayout((0, n)), raw, 0)
    peer = gcn_adjacency(raw)
    np.testing.assert_allclose(peer.toarray(), ours.toarray(), rtol=1e-12, atol=0)
    assert peer[0, 0] == pytest.approx(raw[0, 0] / raw[0].sum())  # an existing loop keeps its weight
    assert peer[n - 1, n - 1] == 1.0                            # an isolated node gets a loop of weight 1


@pytest.mark.skipif(not HAVE_PYG, reason="torch_geometric is not installed")
@pytest.mark.parametrize("model", ["gcn", "sage", "gat"])
def test_peer_without_dropout_trains_like_the_trainer(comm, tmp_path, model: str) -> None:
    """Same initial weights, Â, features and optimiser: without dropout the losses agree epoch by epoch
    (for GAT: PyG's GATConv, 3 heads concatenated then 2 averaged, against our attention)."""
    from algorithms.train import TrainConfig, Trainer
    from runners.data.datasets import planted_classes
    from runners.bench.pyg_peer import PygPeer
    from runners.data.shards import load_local_graph, write_shards

    write_shards(planted_classes(nodes=1500, classes=5, degree=4, features=20, seed=1), tmp_path / "d", 1)
    graph = load_local_graph(comm, tmp_path / "d", 1, 1)
    heads = {"heads": 3, "output_heads": 2} if model == "gat" else {}
    config = TrainConfig(model=model, hidden=8, layers=3, dropout=0.0, seed=2, dtype="float64", **heads)
    trainer = Trainer(comm, graph, config)
    peer = PygPeer(graph, config, torch.device("cpu"))
    ours = [trainer.train_epoch()["loss"] for _ in range(4)]
    theirs = [peer.train_epoch() for _ in range(4)]
    np.testing.assert_allclose(theirs, ours, rtol=1e-9)
    assert ours[-1] < ours[0]


@pytest.mark.skipif(not HAVE_DGL, reason="dgl is not installed (the optional extra dgl)")
@pytest.mark.parametrize(("model", "directed", "path"), [("gcn", True, "weighted kernel"), ("gcn", False, "norm='both'"),
                                                         ("sage", True, None)])
def test_dgl_peer_without_dropout_trains_like_the_trainer(comm, tmp_path, model: str, directed: bool,
                                                           path: str | None) -> None:
    """DGL's GraphConv (on Â's edge weights where the graph is directed and weighted, by its own degree scaling
    on A + I where it is symmetric 0/1) or SAGEConv (mean), same initial weights, features and optimiser:
    without dropout the losses agree with the trainer's epoch by epoch. On the directed graph a row aggregates
    its stored columns, so a peer with its edges reversed fails."""
    from algorithms.train import TrainConfig, Trainer
    from runners.data.datasets import planted_classes
    from runners.bench.train_dgl import DglPeer
    from runners.data.shards import load_local_graph, write_shards

    data = planted_classes(nodes=1500, classes=5, degree=4, features=20, seed=1)
    if directed:
        data.adjacency = sp.triu(data.adjacency, k=1, format="csr")
        if model == "gcn":
            data.adjacency.data = np.random.default_rng(3).uniform(0.5, 2.0, data.adjacency.nnz)
    write_shards(data, tmp_path / "d", 1)
    graph = load_local_graph(comm, tmp_path / "d", 1, 1)
    assert ((graph.rows != graph.rows.T).nnz > 0) == directed
    config = TrainConfig(model=model, hidden=8, layers=3, dropout=0.0, seed=2, dtype="float64")
    trainer = Trainer(comm, graph, config)
    peer = DglPeer(graph, config, torch.device("cpu"))
    if path is not None:
        assert any(path in note for note in peer.notes), peer.notes
    ours = [trainer.train_epoch()["loss"] for _ in range(4)]
    theirs = [peer.train_epoch() for _ in range(4)]
    np.testing.assert_allclose(theirs, ours, rtol=1e-9)
    assert ours[-1] < ours[0]


def test_dgl_degree_scaling_is_gcn_normalisation_only_on_symmetric_01_graphs_without_loops() -> None:
    from runners.bench.train_dgl import degrees_give_gcn_normalisation

    symmetric = sp.csr_matrix(np.array([[0, 1, 1], [1, 0, 0], [1, 0, 0]], dtype=np.float64))
    assert degrees_give_gcn_normalisation(symmetric)
    weighted = symmetric.copy()
    weighted.data[:] = 2.0
    looped = symmetric + sp.identity(3, format="csr")
    directed = sp.triu(symmetric, format="csr")
    assert not any(degrees_give_gcn_normalisation(m) for m in (weighted, looped, directed))


def _bench_train_arguments(*argv: str):  # noqa: ANN202
    import argparse

    from runners.bench import train as bench_train

    parser = argparse.ArgumentParser()
    bench_train.add_arguments(parser)
    args = parser.parse_args(["--synthetic", "100", *argv])
    return args, bench_train.check_arguments(args)


def test_dgl_peer_refuses_a_kind_it_cannot_mirror_before_mpi_starts() -> None:
    args, problem = _bench_train_arguments("--peer", "dgl", "--layer-kind", "gat")
    assert problem is not None and "--layer-kind gat" in problem and "--peer pyg" in problem
    for kind in ("gcn", "sage"):
        args, problem = _bench_train_arguments("--peer", "dgl", "--layer-kind", kind)
        assert problem is None if HAVE_DGL else "pip install -c constraints.txt -e '.[dgl]'" in problem
    args, problem = _bench_train_arguments("--no-pyg")
    assert problem is None and args.peer == "none"


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_DGL, reason="dgl is not installed (the optional extra dgl)")
def test_bench_train_runs_the_dgl_peer_under_mpiexec() -> None:
    result = run_mpi(2, [SPARSE_DIST, "bench", "train", *SMALL, "--peer", "dgl"], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    report = _last_json(result.stdout)
    assert report["peer"] == "dgl" and "pyg" not in report and "dgl_skipped" not in report
    peer = report["dgl"]
    assert peer["epoch_s"] > 0 and len(peer["per_epoch_slowest"]) == 3 and math.isfinite(peer["final_loss"])
    assert peer["threads"] == 2 * report["threads_per_rank"]
    assert report["ratio"]["epoch_time"] == pytest.approx(report["sparse_dist"]["epoch_s"] / peer["epoch_s"])
    assert any(line.startswith("dgl ") for line in result.stdout.splitlines())
