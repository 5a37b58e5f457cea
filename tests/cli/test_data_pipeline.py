"""Inputs and partitioners of `sparse-dist prepare`: edge lists, METIS, partition statistics."""

import codecs
import collections
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from datasets_for_tests import cora
from mpirun import BIN, run_mpi

from runners.data.datasets import DatasetError, load_edge_list, planted_classes
from runners.data.planetoid import load_planetoid
from runners.data.partition import partition, partition_statistics, relabel
from runners.data.shards import write_shards

SPARSE_DIST = str(BIN / "sparse-dist")


def _write_inputs(tmp_path: Path, edges_text: str, n: int = 4) -> tuple[Path, Path, Path]:
    (tmp_path / "edges.txt").write_text(edges_text)
    np.save(tmp_path / "x.npy", np.ones((n, 3), dtype=np.float32))
    np.save(tmp_path / "y.npy", np.arange(n) % 2)
    return tmp_path / "edges.txt", tmp_path / "x.npy", tmp_path / "y.npy"


def test_edge_list_collapses_duplicates_and_drops_self_loops(tmp_path: Path) -> None:
    edges, x, y = _write_inputs(tmp_path, "# src dst\n0 1\n0 1\n1 1\n2 3\n")
    data = load_edge_list(edges, x, y)
    assert data.adjacency.toarray().tolist() == [[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]]
    symmetric = load_edge_list(edges, x, y, symmetrize=True).adjacency.toarray()
    assert (symmetric == symmetric.T).all() and symmetric.sum() == 4 and symmetric.max() == 1
    assert data.num_classes == 2 and not data.multilabel


def test_edge_list_from_npy_with_masks_and_multilabel(tmp_path: Path) -> None:
    np.save(tmp_path / "e.npy", np.array([[0, 1], [1, 2]]))
    np.save(tmp_path / "x.npy", np.zeros((3, 2)))
    np.save(tmp_path / "y.npy", np.array([[1, 0], [0, 1], [1, 1]]))
    np.savez(tmp_path / "m.npz", train=np.array([1, 0, 0], bool), val=np.array([0, 1, 0], bool),
             test=np.array([0, 0, 1], bool))
    data = load_edge_list(tmp_path / "e.npy", tmp_path / "x.npy", tmp_path / "y.npy", masks=tmp_path / "m.npz")
    assert data.multilabel and data.num_classes == 2
    assert data.masks["test"].tolist() == [False, False, True]


@pytest.mark.parametrize("edges_text,needle", [
    ("0 9\n", "node ids must lie in [0, 4)"),
    ("0 1 2\n", "edges must be integer pairs"),
])
def test_bad_edge_lists_are_named(tmp_path: Path, edges_text: str, needle: str) -> None:
    edges, x, y = _write_inputs(tmp_path, edges_text)
    with pytest.raises(DatasetError, match=needle.replace("[", r"\[").replace(")", r"\)")) as info:
        load_edge_list(edges, x, y)
    assert "edges.txt" in str(info.value)


def test_labels_that_do_not_match_the_features_are_named(tmp_path: Path) -> None:
    edges, x, _ = _write_inputs(tmp_path, "0 1\n")
    np.save(tmp_path / "short.npy", np.zeros(3, dtype=np.int64))
    with pytest.raises(DatasetError, match="short.npy: expected 4 labels"):
        load_edge_list(edges, x, tmp_path / "short.npy")


def test_partition_statistics_on_a_path() -> None:
    # path 0-1-2-3 (both directions), parts {0,1} and {2,3}: each part needs one row of the other
    path = sp.csr_matrix(np.array([[0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 0]], dtype=float))
    stats = partition_statistics(path, np.array([0, 2, 4]))
    assert stats["boundary_nodes"] == [1, 1] and stats["inner_nodes"] == [2, 2] and stats["edges"] == [3, 3]
    assert stats["predicted_forward_bytes_per_feature"] == {"dense-bcast": 16, "sparse-bcast": 8, "p2p": 8}


def _relabelled_boundary(adjacency: sp.csr_matrix, part_of: np.ndarray, parts: int) -> int:
    order, offsets = relabel(part_of, parts)
    new = np.empty_like(order)
    new[order] = np.arange(order.size)
    a = adjacency.tocsr()[order]
    a = sp.csr_matrix((a.data, new[a.indices], a.indptr), shape=a.shape)
    return partition_statistics(a, offsets)["total_boundary_nodes"]


def test_metis_is_deterministic_balanced_and_cuts_the_boundary() -> None:
    data = planted_classes(nodes=6000, classes=4, mixing=0.2, seed=3)
    train = data.masks["train"]
    first = partition("metis", data.adjacency, 4, seed=7, train_mask=train)
    assert np.array_equal(first, partition("metis", data.adjacency, 4, seed=7, train_mask=train))
    sizes = np.bincount(first, minlength=4)
    assert sizes.max() <= 1.05 * 6000 / 4  # METIS' default imbalance bound is 3%
    train_load = np.bincount(first[train], minlength=4)
    assert train_load.max() <= max(np.floor(1.05 * train.sum() / 4), train_load.min() + 1)  # second constraint
    plain = partition("metis", data.adjacency, 4, seed=7)
    assert np.array_equal(np.bincount(plain, minlength=4), sizes)  # the swaps keep the node counts
    citations = cora().adjacency  # a real graph: METIS must cut its boundary by a large factor
    metis, random = partition("metis", citations, 4, seed=7), partition("random", citations, 4, seed=7)
    assert _relabelled_boundary(citations, metis, 4) * 3 < _relabelled_boundary(citations, random, 4)


@pytest.mark.slow
def test_merged_metis_parts_train_like_unmerged(tmp_path: Path) -> None:
    write_shards(cora(), tmp_path / "cora8", 8, "metis", seed=1)
    meta = json.loads((tmp_path / "cora8" / "meta.json").read_text())
    assert meta["partitioner"] == "metis" and len(meta["partition_stats"]["boundary_nodes"]) == 8
    finals = []
    for ranks in (1, 4):  # 8 parts: 8 row groups at P = 1 merge into one, at P = 4 two by two
        out = tmp_path / f"r{ranks}.jsonl"
        result = run_mpi(ranks, [SPARSE_DIST, "train", "--data", str(tmp_path / "cora8"), "--epochs", "20",
                                 "--eval-every", "20", "--print-every", "1000", "--out", str(out)], timeout=240)
        assert result.returncode == 0, result.stderr
        records = [json.loads(line) for line in out.read_text().splitlines()]
        finals.append(([r["loss"] for r in records if r["type"] == "epoch"], records[-1]["test_acc"]))
    for losses, accuracy in finals[1:]:
        assert np.allclose(losses, finals[0][0], rtol=1e-5, atol=1e-6)
        assert accuracy == finals[0][1]


def test_streamed_synthetic_is_a_valid_undirected_graph_with_exact_statistics(tmp_path: Path) -> None:
    from runners.data.partition import partition_statistics
    from runners.data.shards import read_meta
    from runners.data.stream_synthetic import write_streamed_synthetic

    nodes = 70_000  # crosses a generator chunk border
    for graph in ("clustered", "rmat"):
        out = tmp_path / graph
        meta = write_streamed_synthetic(out, nodes=nodes, degree=3, parts=3, graph=graph, features=16,
                                        progress=False)
        assert read_meta(out)["files"] == meta["files"]
        parts = [np.load(out / f"part-{p:05d}.npz") for p in range(3)]
        indptr = np.concatenate([parts[0]["indptr"]] + [p["indptr"][1:] + sum(q["indptr"][-1] for q in parts[:k + 1])
                                                        for k, p in enumerate(parts[1:])])
        a = sp.csr_matrix((np.concatenate([p["data"] for p in parts]), np.concatenate([p["indices"] for p in parts]),
                           indptr), shape=(nodes, nodes))
        assert (a != a.T).nnz == 0 and a.diagonal().sum() == 0 and a.max() == 1  # undirected, no loops, no dups
        assert a.nnz == meta["num_edges"] and a.nnz > 1.5 * nodes * 3
        expected = partition_statistics(a, np.asarray(meta["row_offsets"]),
                                        np.concatenate([p["train"] for p in parts]))
        assert meta["partition_stats"] == expected
        labels = np.concatenate([p["labels"] for p in parts])
        assert labels.min() >= 0 and labels.max() < meta["num_classes"]
        assert not list(tmp_path.glob(".*tmp*"))


@pytest.mark.slow
def test_streamed_shards_train(tmp_path: Path) -> None:
    from runners.data.stream_synthetic import write_streamed_synthetic

    write_streamed_synthetic(tmp_path / "s", nodes=5000, degree=4, parts=2, features=16, progress=False)
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(tmp_path / "s"), "--epochs", "3"], timeout=180)
    assert result.returncode == 0, result.stderr
    assert "final test accuracy" in result.stdout


# ---------------------------------------------------------------- the default partitioner (issue 24, item 8)
def _prepare(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``sparse-dist prepare ARGV`` as one process (prepare is single-process), with a timeout."""
    return subprocess.run([SPARSE_DIST, "prepare", *argv], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.slow
def test_prepare_partitions_with_metis_by_default_and_block_on_request(tmp_path: Path) -> None:
    default = _prepare("planetoid", "--out", str(tmp_path / "auto"), "--parts", "4")
    assert default.returncode == 0, default.stderr
    block = _prepare("planetoid", "--out", str(tmp_path / "block"), "--parts", "4", "--partitioner", "block")
    assert block.returncode == 0, block.stderr
    metis_meta = json.loads((tmp_path / "auto" / "meta.json").read_text())
    block_meta = json.loads((tmp_path / "block" / "meta.json").read_text())
    assert metis_meta["partitioner"] == "metis" and "(metis)" in default.stdout
    assert block_meta["partitioner"] == "block" and block_meta["row_offsets"] == [0, 677, 1354, 2031, 2708]
    metis_stats, block_stats = metis_meta["partition_stats"], block_meta["partition_stats"]
    assert metis_stats["total_cut_edges"] * 3 < block_stats["total_cut_edges"]  # Cora: 962 vs 7364
    assert metis_stats["total_boundary_nodes"] * 3 < block_stats["total_boundary_nodes"]
    assert f"edge cut: {metis_stats['total_cut_edges']} of 10556" in default.stdout
    assert sum(metis_stats["cut_edges"]) == metis_stats["total_cut_edges"]


def test_the_default_partitioner_is_stated_in_help_and_falls_back_to_block(monkeypatch: pytest.MonkeyPatch) -> None:
    from runners.data.partition import resolve_partitioner

    result = subprocess.run([SPARSE_DIST, "prepare", "--help"], capture_output=True, text=True, timeout=120)
    assert ("default: auto = metis when pymetis imports, metis-train for rmat's power-law graphs, else block"
            in " ".join(result.stdout.split()))
    assert resolve_partitioner("auto") == ("metis", None)  # pymetis is installed here
    assert resolve_partitioner("auto", contiguous_only=True) == ("block", None)
    assert resolve_partitioner("random") == ("random", None)
    monkeypatch.setitem(sys.modules, "pymetis", None)  # `import pymetis` now raises ImportError
    kind, note = resolve_partitioner("auto")
    assert kind == "block" and "pymetis does not import" in note


@pytest.mark.slow
def test_streamed_prepare_chooses_blocks_by_itself_and_refuses_metis(tmp_path: Path) -> None:
    result = _prepare("synthetic", "--stream", "--nodes", "2000", "--degree", "3", "--features", "8",
                      "--parts", "2", "--out", str(tmp_path / "s"))
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "s" / "meta.json").read_text())["partitioner"] == "block"
    refused = _prepare("synthetic", "--stream", "--nodes", "2000", "--parts", "2", "--partitioner", "metis",
                       "--out", str(tmp_path / "m"))
    assert refused.returncode == 2 and "--stream writes contiguous blocks" in refused.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
# ---------------------------------------------------------------- small truths (issue 24, item 9)
def test_float64_features_survive_prepare_bitwise_and_train(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    n = 60
    x = rng.standard_normal((n, 4)) / 3.0  # float64 values that float32 would round
    assert not np.array_equal(x.astype(np.float32).astype(np.float64), x)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.arange(n) % 3)
    np.save(tmp_path / "e.npy", np.stack([np.arange(n), (np.arange(n) + 1) % n], axis=1))
    result = _prepare("edgelist", "--edges", str(tmp_path / "e.npy"), "--node-features", str(tmp_path / "x.npy"),
                      "--labels", str(tmp_path / "y.npy"), "--symmetrize", "--parts", "2", "--split", "0.5,0.2,0.3",
                      "--out", str(tmp_path / "d"))
    assert result.returncode == 0, result.stderr
    assert "features kept as float64" in result.stdout
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert meta["feature_dtype"] == "float64"
    order = np.load(tmp_path / "d" / "permutation.npy")
    stored = np.concatenate([np.load(tmp_path / "d" / f"part-{p:05d}.npz")["features"] for p in range(2)])
    assert stored.dtype == np.float64 and np.array_equal(stored, x[order])  # bitwise, not rounded
    for dtype in ("float64", "float32"):
        run = run_mpi(2, [SPARSE_DIST, "train", "--data", str(tmp_path / "d"), "--epochs", "2", "--dtype", dtype],
                      timeout=180)
        assert run.returncode == 0, run.stderr
        assert "final test accuracy" in run.stdout


def test_float32_features_stay_float32(tmp_path: Path) -> None:
    edges, x, y = _write_inputs(tmp_path, "0 1\n1 2\n2 3\n")
    meta = write_shards(load_edge_list(edges, x, y, split=(0.5, 0.25, 0.25)), tmp_path / "d", 2, "block")
    assert meta["feature_dtype"] == "float32"
    assert np.load(tmp_path / "d" / "part-00000.npz")["features"].dtype == np.float32


def _planetoid_objects() -> dict[str, object]:
    """A 10-node Planetoid-style dataset: 8 nodes in allx (the first 3 are training nodes), 2 test nodes
    listed in reverse order in test.index, a ring graph as a defaultdict of adjacency lists."""
    features = sp.csr_matrix(np.arange(50, dtype=np.float32).reshape(10, 5) % 3)
    onehot = np.eye(3, dtype=np.int64)[np.arange(10) % 3]
    graph = collections.defaultdict(list, {i: [(i + 1) % 10] for i in range(10)})
    return {"x": features[:3], "y": onehot[:3], "allx": features[:8], "ally": onehot[:8],
            "tx": features[[9, 8]], "ty": onehot[[9, 8]], "graph": graph}


def _write_planetoid(directory: Path, objects: dict[str, object], protocol: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for part, value in objects.items():
        with open(directory / f"ind.tiny.{part}", "wb") as handle:
            pickle.dump(value, handle, protocol=protocol)
    (directory / "ind.tiny.test.index").write_text("9\n8\n")
    return directory


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_planetoid_files_written_by_python3_are_read(tmp_path: Path, protocol: int) -> None:
    objects = _planetoid_objects()
    data = load_planetoid(_write_planetoid(tmp_path, objects, protocol), "tiny")
    expected = np.arange(50, dtype=np.float32).reshape(10, 5) % 3  # test rows put back in node order
    assert np.array_equal(data.features, expected)
    assert data.labels.tolist() == [i % 3 for i in range(10)]
    ring = sp.csr_matrix((np.ones(10), (np.arange(10), (np.arange(10) + 1) % 10)), shape=(10, 10))
    assert (data.adjacency != ((ring + ring.T) > 0)).nnz == 0
    assert data.masks["train"].sum() == 3 and data.masks["test"].tolist() == [False] * 8 + [True] * 2


def test_prepare_reads_a_protocol_2_planetoid_written_by_python3(tmp_path: Path) -> None:
    root = _write_planetoid(tmp_path / "raw", _planetoid_objects(), 2)
    assert b"_codecs" in (root / "ind.tiny.x").read_bytes()  # what Python 3 writes for bytes in protocol 2
    result = _prepare("planetoid", "--root", str(root), "--name", "tiny", "--parts", "2", "--out",
                      str(tmp_path / "d"))
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "d" / "meta.json").read_text())["num_nodes"] == 10


class _Call:
    """Pickles as a call of ``function(*arguments)``: what a malicious file would hold."""

    def __init__(self, function: object, *arguments: object) -> None:
        self.function, self.arguments = function, arguments

    def __reduce__(self) -> tuple:
        return self.function, self.arguments


@pytest.mark.parametrize("payload,needle", [
    (_Call(os.system, "touch pwned"), "unexpected object posix.system"),
    (_Call(codecs.encode, "touch pwned", "rot13"), "only latin-1 text"),
    (_Call(eval, "1 + 1"), "unexpected object builtins.eval"),
])
def test_planetoid_pickles_that_call_anything_else_are_refused(tmp_path: Path, payload: object, needle: str) -> None:
    root = _write_planetoid(tmp_path, _planetoid_objects(), 2)
    (root / "ind.tiny.graph").write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(DatasetError, match=needle) as info:
        load_planetoid(root, "tiny")
    assert "ind.tiny.graph" in str(info.value)
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()
