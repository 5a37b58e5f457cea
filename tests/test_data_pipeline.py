"""Inputs and partitioners of `sparse-dist prepare`: edge lists, METIS, partition statistics."""

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from datasets_for_tests import cora
from mpirun import BIN, run_mpi

from runners.data.datasets import DatasetError, load_edge_list, planted_classes
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


def test_merged_metis_parts_train_like_unmerged(tmp_path: Path) -> None:
    write_shards(cora(), tmp_path / "cora8", 8, "metis", seed=1)
    meta = json.loads((tmp_path / "cora8" / "meta.json").read_text())
    assert meta["partitioner"] == "metis" and len(meta["partition_stats"]["boundary_nodes"]) == 8
    finals = []
    for ranks in (1, 2, 4):
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


def test_streamed_shards_train(tmp_path: Path) -> None:
    from runners.data.stream_synthetic import write_streamed_synthetic

    write_streamed_synthetic(tmp_path / "s", nodes=5000, degree=4, parts=2, features=16, progress=False)
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(tmp_path / "s"), "--epochs", "3"], timeout=180)
    assert result.returncode == 0, result.stderr
    assert "final test accuracy" in result.stdout
