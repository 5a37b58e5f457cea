"""OGB node-property input through ogb's own loader, on a tiny dataset in OGB's on-disk layout."""

from pathlib import Path

import numpy as np
import pytest
from mpirun import BIN, run_mpi
from ogb_layout import write_tiny_arxiv

from runners.data.datasets import DatasetError, load_ogb
from runners.data.shards import read_meta, write_shards

SPARSE_DIST = str(BIN / "sparse-dist")


def test_ogb_loader_reads_the_split_and_leaves_the_directory_alone(tmp_path: Path) -> None:
    directory = write_tiny_arxiv(tmp_path, n=40)
    before = sorted(p.name for p in directory.iterdir())
    data = load_ogb("ogbn-arxiv", tmp_path)
    assert data.num_nodes == 40 and data.num_classes == 40 and data.features.shape == (40, 4)
    assert data.masks["train"].sum() == 20 and data.masks["val"].sum() == 10 and data.masks["test"].sum() == 10
    assert not (data.masks["train"] & data.masks["test"]).any()
    assert (data.adjacency != data.adjacency.T).nnz == 0  # symmetrised by default
    directed = load_ogb("ogbn-arxiv", tmp_path, symmetrize=False).adjacency
    edges = np.loadtxt(directory / "raw" / "edge.csv.gz", delimiter=",", dtype=np.int64)
    src, dst = edges[0]
    assert src == dst or directed[dst, src] == 1  # row dst aggregates from src
    assert sorted(p.name for p in directory.iterdir()) == before  # no cache written into the user's copy


def test_absent_ogb_dataset_says_where_to_put_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"no dataset under .*ogbn_products; download it on a machine"):
        load_ogb("ogbn-products", tmp_path)


def test_ogb_training_reports_the_ogb_evaluator(tmp_path: Path) -> None:
    write_tiny_arxiv(tmp_path / "ogb", n=60)
    write_shards(load_ogb("ogbn-arxiv", tmp_path / "ogb"), tmp_path / "shards", 2, "metis")
    meta = read_meta(tmp_path / "shards")
    assert meta["ogb_name"] == "ogbn-arxiv" and meta["eval_metric"] == "acc" and meta["feature_norm"] == "none"
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(tmp_path / "shards"), "--epochs", "3"], timeout=180)
    assert result.returncode == 0, result.stderr
    ours = float(result.stdout.split("final test accuracy: ")[1].split()[0])
    theirs = float(result.stdout.split("OGB Evaluator acc on the test split: ")[1].split()[0])
    assert ours == theirs
