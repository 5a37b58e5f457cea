"""GAT pieces in one process: the attention-dropout hash, the attention structure, the custom backward,
model widths and refused options. (Distributed exactness: tests/mpi/test_gat.py.)"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from reference_gat import attention_keep as reference_keep

from algorithms.attention import Attend, attention_keep
from algorithms.attention_structure import AttentionEdges
from algorithms.gat import attention_adjacency
from algorithms.layers import LayerOptions
from algorithms.model import GraphModel
from algorithms.hashing import splitmix64, splitmix64_torch
from runners import train_cmd


def test_the_device_hash_equals_numpy_splitmix64_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.integers(0, 2**64 - 1, 5000, dtype=np.uint64, endpoint=True),
                             np.array([0, 1, 2**63 - 1, 2**63, 2**64 - 1], dtype=np.uint64)])
    got = splitmix64_torch(torch.from_numpy(values.view(np.int64))).numpy().view(np.uint64)
    np.testing.assert_array_equal(got, splitmix64(values))


@pytest.mark.parametrize("heads,p", [(6, 0.3), (1, 0.6)])
def test_attention_masks_follow_the_written_rule(heads: int, p: float) -> None:
    rng = np.random.default_rng(1)
    row_ids = torch.from_numpy(rng.integers(0, 10**6, 500))          # destinations, each hashed once
    entry_rows = torch.from_numpy(rng.integers(0, 500, 20000))       # each entry's destination
    cols = rng.integers(0, 10**9, 20000)
    got = attention_keep(3, 7, 1, row_ids, entry_rows, torch.from_numpy(cols), heads, p)
    want, _ = reference_keep(3, 7, 1, row_ids[entry_rows].numpy(), cols, heads, p)
    assert torch.equal(got, torch.from_numpy(want.T.copy()))
    assert abs(float(got.float().mean()) - (1 - p)) < 0.01
    other_epoch = attention_keep(3, 8, 1, row_ids, entry_rows, torch.from_numpy(cols), heads, p)
    assert not torch.equal(got, other_epoch)


def test_attention_dropout_below_two_to_the_minus_sixteen_keeps_every_entry() -> None:
    """T = 2^16 (drop < 7.6e-6) keeps every lane; as an int16 bound it would keep none."""
    rng = np.random.default_rng(2)
    cols = torch.from_numpy(rng.integers(0, 10**9, 3000))
    got = attention_keep(3, 7, 1, torch.arange(100), torch.from_numpy(rng.integers(0, 100, 3000)), cols, 5, 1e-6)
    assert bool(got.all())


def test_attention_adjacency_replaces_loops_and_drops_weights() -> None:
    raw = sp.csr_matrix(np.array([[0, 2.5, 0, 0],    # node 10: an edge of weight 2.5
                                  [0, 0, 0, 0],      # node 11: isolated
                                  [3, 0, 0, 1],      # node 12: an existing loop (column 12 = local 2)
                                  [0, 0, 0, 0]]))
    rows = sp.csr_matrix((raw.data, raw.indices + 10, raw.indptr), shape=(4, 20))
    rows = sp.csr_matrix(rows + sp.csr_matrix(([1.0], ([0], [11])), shape=(4, 20)))  # node 10 -> 11
    got = attention_adjacency(rows, 10).toarray()
    want = np.zeros((4, 20))
    want[0, [10, 11]] = 1
    want[1, 11] = 1
    want[2, [10, 12, 13]] = 1
    want[3, 13] = 1
    np.testing.assert_array_equal(got, want)


def test_the_attention_backward_is_the_derivative_of_its_forward() -> None:
    """gradcheck (float64) of logits, weighted softmax and aggregation, with a keep mask and weights.

    ``N`` and ``D`` are shifted by the row maxima, which the backward holds constant: only ``N / D``
    (what the layer uses) is a function of the inputs alone, so that is what is checked."""
    rng = np.random.default_rng(2)
    n, s, heads, width = 5, 7, 2, 3
    block = sp.random(n, s, density=0.5, format="csr", random_state=rng)
    block.data = np.where(rng.random(block.nnz) < 0.5, 1.0, 2.0)  # sampled columns weigh 1/p
    block = sp.csr_matrix(block + sp.eye(n, s))
    edges = AttentionEdges.build([block], n, [None], torch.float64, torch.device("cpu"), (block,))
    keep = torch.from_numpy(rng.random((heads, edges.count)) < 0.7)
    z = torch.randn(s, heads * width, dtype=torch.float64, requires_grad=True)
    src = torch.randn(s, heads, dtype=torch.float64, requires_grad=True)
    dst = torch.randn(n, heads, dtype=torch.float64, requires_grad=True)

    def attend(z, src, dst):
        numerator, denominator = Attend.apply(z, src, dst, edges, 0.2, ~keep, 1.5, None, None)
        return numerator / denominator.unsqueeze(2)

    assert torch.autograd.gradcheck(attend, (z, src, dst))
    dense = torch.from_numpy(block.toarray())
    logits = torch.nn.functional.leaky_relu(dst[:, None, :] + src[None, :, :], 0.2)  # [i, j, k]
    weights = torch.where(dense[:, :, None] > 0, dense[:, :, None] * logits.exp(), torch.zeros(()))
    mask = torch.zeros(n, s, heads, dtype=torch.float64)
    mask[torch.from_numpy(np.repeat(np.arange(n), np.diff(block.indptr))), torch.from_numpy(block.indices)] = \
        keep.t().double() * 1.5
    want = torch.einsum("ijk,jkf->ikf", weights * mask, z.view(s, heads, width)) / weights.sum(1).unsqueeze(2)
    torch.testing.assert_close(attend(z, src, dst), want)


def test_gat_widths_and_options_refused_elsewhere() -> None:
    model = GraphModel("gat", [5, 4, 4, 3], options=LayerOptions(heads=3, output_heads=2))
    assert model.widths == [5, 12, 12, 3]
    assert [layer.heads for layer in model.layers] == [3, 3, 2]
    assert [p.shape for p in model.layer_parameters(0)] == [(5, 12), (3, 4), (3, 4), (12,)]
    with pytest.raises(ValueError, match="the gcn layer takes no attention options"):
        GraphModel("gcn", [5, 4, 3], options=LayerOptions(heads=2))


def test_attention_flags_without_gat_are_refused_before_mpi() -> None:
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    args = parser.parse_args(["--data", "d", "--heads", "8"])
    assert "--heads, --output-heads and --attention-dropout are for --layer-kind gat" in train_cmd.check_arguments(args)
    assert train_cmd.check_arguments(parser.parse_args(["--data", "d", "--model", "gat", "--heads", "8"])) is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--data", "d", "--model", "gat", "--attention-dropout", "1.0"])
