"""Single-process pieces of training: dropout masks, normalisation, datasets, shards, checkpoints."""

import pickle
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from algorithms.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from algorithms.dropout import GlobalRowDropout, KeepRule, keep_mask
from algorithms.normalize import add_remaining_self_loops, mean_normalize
from algorithms.training.graph import row_normalize_features
from runners.data.datasets import DatasetError, planted_classes
from runners.data.planetoid import load_planetoid
from runners.data.shards import ShardError, read_meta, write_shards
from datasets_for_tests import random_directed


def test_dropout_mask_of_a_row_does_not_depend_on_the_split() -> None:
    whole = keep_mask(3, 7, 1, 0, 10, 5, 0.5)
    pieces = torch.cat([keep_mask(3, 7, 1, 0, 3, 5, 0.5), keep_mask(3, 7, 1, 3, 7, 5, 0.5)])
    assert torch.equal(whole, pieces)
    assert not torch.equal(whole, keep_mask(3, 8, 1, 0, 10, 5, 0.5))  # a new mask every epoch
    rate = keep_mask(0, 0, 0, 0, 1000, 100, 0.3).float().mean().item()
    assert abs(rate - 0.7) < 0.01  # 100k draws: std of the mean is 0.0015


@pytest.mark.parametrize("form", ["auto", "torch"])
def test_dropout_mask_pieces_cut_anywhere(form: str) -> None:
    """Cuts that fall inside words and on word edges (width 37: rows never align with words), both forms."""
    whole = keep_mask(5, 2, 3, 0, 100, 37, 0.4, form=form)
    cuts = [0, 1, 7, 8, 20, 21, 63, 99, 100]
    pieces = torch.cat([keep_mask(5, 2, 3, a, b - a, 37, 0.4, form=form) for a, b in zip(cuts[:-1], cuts[1:])])
    assert torch.equal(whole, pieces)
    empty = keep_mask(5, 2, 3, 40, 0, 37, 0.4, form=form)
    assert empty.shape == (0, 37)


def test_dropout_forms_agree_and_each_lane_is_fair() -> None:
    host = keep_mask(1, 0, 0, 0, 2000, 64, 0.5)
    assert torch.equal(host, keep_mask(1, 0, 0, 0, 2000, 64, 0.5, form="torch"))  # CUDA's fallback: the same bits
    lanes = host.reshape(-1, 4).float().mean(dim=0)  # each of a word's four 16-bit lanes is fair
    assert torch.all((lanes - 0.5).abs() < 0.01), lanes  # 32k draws per lane: std 0.0028
    neighbours = (host[:, :-1] == host[:, 1:]).float().mean().item()  # adjacent lanes independent
    assert abs(neighbours - 0.5) < 0.01, neighbours
    with pytest.raises(ValueError, match="form must be"):
        keep_mask(1, 0, 0, 0, 2, 2, 0.5, form="device")


def test_dropout_scale_makes_the_expectation_exact() -> None:
    for p in (0.5, 0.6, 0.1):
        rule = KeepRule.of(p)
        assert abs(rule.threshold / 65536 - (1 - p)) <= 0.5 / 65536
        assert rule.scale * rule.threshold == 65536.0
    dropout = GlobalRowDropout(0.6, 9, 1, 123)
    h = torch.ones(4000, 50, dtype=torch.float64, requires_grad=True)
    out = dropout.drop(h, 0)
    mask = keep_mask(9, 1, 0, 123, 4000, 50, 0.6)
    assert torch.equal(out, mask.double())
    assert abs(out.mean().item() * dropout.scale - 1.0) < 0.02  # 200k entries, std of the mean about 0.0027
    out.backward(torch.full_like(out, 2.0))
    assert torch.equal(h.grad, 2.0 * mask.double())


def test_fused_relu_dropout_has_the_gradient_of_relu_then_mask() -> None:
    dropout = GlobalRowDropout(0.5, 4, 2, 10)
    z = torch.randn(300, 20, dtype=torch.float64)
    z[0, :5] = 0.0  # ReLU's kink: both sides must use the same (zero) derivative there
    fused_in = z.clone().requires_grad_(True)
    plain_in = z.clone().requires_grad_(True)
    grad = torch.randn(300, 20, dtype=torch.float64)
    fused = dropout.relu_drop(fused_in, 1)
    plain = torch.relu(plain_in) * keep_mask(4, 2, 1, 10, 300, 20, 0.5).double()
    assert torch.equal(fused, plain)
    fused.backward(grad)
    plain.backward(grad)
    assert torch.equal(fused_in.grad, plain_in.grad)
    with pytest.raises(ValueError, match="dropout probability"):
        KeepRule.of(1.0)


def test_remaining_self_loops_keep_existing_weights() -> None:
    rows = sp.csr_matrix(np.array([[0.0, 2.0, 0.0], [0.0, 5.0, 1.0]]))  # rows of nodes 10, 11 in a 3-col toy
    rows = sp.csr_matrix((rows.data, rows.indices, rows.indptr), shape=(2, 13))
    rows = sp.csr_matrix(sp.hstack([sp.csr_matrix((2, 10)), rows[:, :3]]))  # nodes 10, 11 -> columns 10..12
    result = add_remaining_self_loops(rows, first_row=10).toarray()
    assert result[0, 10] == 1.0 and result[0, 11] == 2.0  # loop added
    assert result[1, 11] == 5.0 and result[1, 12] == 1.0  # existing loop weight kept


def test_mean_normalisation_leaves_isolated_rows_zero() -> None:
    result = mean_normalize(sp.csr_matrix(np.array([[0.0, 1.0, 3.0], [0.0, 0.0, 0.0]]))).toarray()
    assert result.tolist() == [[0.0, 0.25, 0.75], [0.0, 0.0, 0.0]]


def test_planetoid_directory_without_files_is_named(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"missing \['ind.cora.x'"):
        load_planetoid(tmp_path, "cora")


def test_planetoid_pickles_cannot_run_code(tmp_path: Path) -> None:
    for part in ("x", "tx", "allx", "y", "ty", "ally", "graph"):
        (tmp_path / f"ind.evil.{part}").write_bytes(pickle.dumps(np.zeros((1, 1))))
    (tmp_path / "ind.evil.x").write_bytes(pickle.dumps(print))  # a callable the loader must refuse
    (tmp_path / "ind.evil.test.index").write_text("0\n")
    with pytest.raises(DatasetError, match="unexpected object builtins.print"):
        load_planetoid(tmp_path, "evil")


def test_planted_classes_are_learnable_signals() -> None:
    data = planted_classes(nodes=4000, classes=4, features=64, seed=2)
    # features: the class's own word block holds far more than its 1/4 share of the words
    block = 64 // 4
    own = np.array([data.features[i, data.labels[i] * block:(data.labels[i] + 1) * block].sum()
                    for i in range(4000)])
    chance = 1 / 4
    expected_share = 0.15 + 0.85 * chance  # signal words plus uniform words that land in the own block
    assert abs(own.mean() / data.features.sum(axis=1).mean() - expected_share) < 0.01
    coo = sp.triu(data.adjacency).tocoo()
    assert np.mean(data.labels[coo.row] == data.labels[coo.col]) > 2 * chance  # homophilous edges
    assert np.mean(coo.row // 500 == coo.col // 500) > 0.9  # clustered: few edges leave a community
    assert (data.adjacency != data.adjacency.T).nnz == 0


def test_shards_round_trip_and_meta_is_checked(tmp_path: Path) -> None:
    data = random_directed()
    meta = write_shards(data, tmp_path / "d", 3, "random", seed=4)
    assert read_meta(tmp_path / "d") == meta
    order = np.load(tmp_path / "d" / "permutation.npy")
    assert sorted(order.tolist()) == list(range(data.num_nodes))
    part = np.load(tmp_path / "d" / "part-00000.npz")
    assert np.array_equal(part["features"], data.features[order[: meta["row_offsets"][1]]])
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary left behind
    with pytest.raises(ShardError, match="already exists"):
        write_shards(data, tmp_path / "d", 3)


def test_checkpoint_round_trip_and_damage(tmp_path: Path) -> None:
    path = tmp_path / "c.ckpt"
    save_checkpoint(path, {"epoch": 3, "w": torch.arange(4.0)})
    assert load_checkpoint(path)["epoch"] == 3
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        load_checkpoint(path)
    path.write_bytes(b"hello\nworld")
    with pytest.raises(CheckpointError, match="not a sparse_dist checkpoint"):
        load_checkpoint(path)


def test_row_normalisation_copies_and_keeps_zero_sum_rows_zero() -> None:
    rng = np.random.default_rng(3)
    features = rng.random((50, 7))
    features[4] = 0.0
    features[9, :2], features[9, 2:] = (1.0, -1.0), 0.0  # sums to 0 with nonzero entries
    expected = np.zeros_like(features)
    sums = features.sum(axis=1)
    for row in range(features.shape[0]):
        if sums[row] != 0:
            expected[row] = features[row] / sums[row]
    before = features.copy()
    result = row_normalize_features(features.astype(np.float32))
    assert result.dtype == np.float64
    result = row_normalize_features(features)
    assert np.array_equal(result, expected) and np.array_equal(features, before)  # a copy: the input stays
