"""The R-MAT generator of ``prepare rmat`` (runners.data.rmat): Graph500's graph, and labels that need it.

Expectations the degree tests use, and why they are fair: R-MAT with quadrant probabilities A, B, C, D draws
each edge independently with ``P(u, v) = prod over levels`` of the quadrant probabilities of ``u``'s and
``v``'s bits, so the expected number of isolated vertices and the expected degree of (pre-permutation)
vertex 0 are exact sums over vertices (``expected_isolated``, ``expected_top_degree``; checked here against
an independent computation from the whole 2^10 x 2^10 probability matrix). The tolerance is 5 standard
deviations of the count as if its indicators were independent: over 10 seeds at SCALE 10, 11 and 12 the
observed counts lay within 2.9 of them (z-scores printed by the study in the report of issue 39), so 5 fails
only a generator that is wrong, not an unlucky seed; and the seeds here are fixed, so the test is stable.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from runners.data.rmat import (CHUNK_EDGES, GRAPH500, check_abcd, edge_chunk, expected_isolated,
                               expected_top_degree, gcn_operator, node_data, rmat_dataset, rmat_graph,
                               vertex_permutation)


def _probability_matrix(scale: int, abcd: tuple[float, ...] = GRAPH500) -> np.ndarray:
    """R-MAT's ``P(u, v)`` for every pair: the Kronecker power of ``[[A, B], [C, D]]``."""
    a, b, c, d = abcd
    matrix = np.ones((1, 1))
    for _ in range(scale):
        matrix = np.kron(matrix, [[a, b], [c, d]])
    return matrix


@pytest.mark.parametrize("scale", [10, 11, 12])
def test_isolated_vertices_and_top_degree_are_what_rmat_expects(scale: int) -> None:
    graph = rmat_graph(scale, seed=scale)
    degree = np.diff(graph.adjacency.indptr)
    isolated, spread = expected_isolated(scale)
    top, top_spread = expected_top_degree(scale)
    assert abs(graph.isolated - isolated) < 5 * spread
    assert int((degree == 0).sum()) == graph.isolated
    assert abs(degree.max() - top) < 5 * top_spread
    assert degree.argmax() == graph.new_id[0]  # the hub is vertex 0 of the recursion, moved by the permutation
    # Graph500's figures at these scales: 13-19% isolated, a hub of a few hundred to a thousand neighbours
    assert 0.10 < graph.isolated / 2**scale < 0.22 and 300 < degree.max() < 1500


def test_the_expectations_agree_with_the_whole_probability_matrix() -> None:
    scale, draws = 10, 16 * 2**10
    pair = _probability_matrix(scale)
    either = pair + pair.T
    np.fill_diagonal(either, 0)
    isolated = ((1 - either.sum(axis=1)) ** draws).sum()
    top = (1 - (1 - either[0]) ** draws).sum()
    assert expected_isolated(scale)[0] == pytest.approx(isolated, rel=1e-9)
    assert expected_top_degree(scale)[0] == pytest.approx(top, rel=1e-9)
    # and the number of distinct undirected edges
    present = 1 - (1 - either[np.triu_indices(2**scale, 1)]) ** draws
    graph = rmat_graph(scale, seed=1)
    assert abs(graph.adjacency.nnz // 2 - present.sum()) < 5 * np.sqrt((present * (1 - present)).sum())


def test_duplicates_and_self_loops_merge_and_the_graph_is_symmetric() -> None:
    scale = 10
    graph = rmat_graph(scale, seed=3)
    adjacency = graph.adjacency
    assert (adjacency != adjacency.T).nnz == 0
    assert adjacency.diagonal().sum() == 0 and set(np.unique(adjacency.data)) == {1.0}
    assert adjacency.has_canonical_format  # sorted, each column once a row
    # the same edges, drawn and merged the plain way
    src, dst = edge_chunk(scale, 0, 16 * 2**scale, 3)
    assert 16 * 2**scale <= CHUNK_EDGES
    assert (src == dst).sum() > 0 and np.unique(src * 2**scale + dst).size < src.size  # there was something to merge
    new_id = vertex_permutation(scale, 3)
    src, dst = new_id[src], new_id[dst]
    keep = src != dst
    plain = sp.csr_matrix((np.ones(2 * keep.sum()), (np.r_[src[keep], dst[keep]], np.r_[dst[keep], src[keep]])),
                          shape=adjacency.shape)
    plain.data[:] = 1
    assert (plain != adjacency).nnz == 0
    assert sorted(new_id) == list(range(2**scale)) and not np.array_equal(new_id, np.arange(2**scale))


def test_dropping_isolated_vertices_keeps_the_rest_of_the_graph() -> None:
    kept = rmat_graph(10, seed=4)
    dropped = rmat_graph(10, seed=4, drop_isolated=True)
    assert dropped.isolated == kept.isolated and dropped.adjacency.shape[0] == 2**10 - kept.isolated
    assert np.diff(dropped.adjacency.indptr).min() > 0
    survivors = np.flatnonzero(np.diff(kept.adjacency.indptr) > 0)
    assert (kept.adjacency[survivors][:, survivors] != dropped.adjacency).nnz == 0
    assert (dropped.new_id >= 0).sum() == survivors.size


def test_a_seed_gives_the_same_dataset_bit_for_bit_and_another_seed_another() -> None:
    first, _ = rmat_dataset(10, features=8, classes=4, seed=7)
    again, _ = rmat_dataset(10, features=8, classes=4, seed=7)
    other, _ = rmat_dataset(10, features=8, classes=4, seed=8)
    for one, two in ((first, again),):
        assert (one.adjacency != two.adjacency).nnz == 0
        assert np.array_equal(one.features, two.features) and np.array_equal(one.labels, two.labels)
        assert all(np.array_equal(one.masks[k], two.masks[k]) for k in one.masks)
    assert (first.adjacency != other.adjacency).nnz > 0 and not np.array_equal(first.features, other.features)
    # the words behind a seed are fixed (PCG64 + SeedSequence): this graph is the same on any numpy
    digest = hashlib.sha256(first.adjacency.indices.astype(np.int64).tobytes()).hexdigest()[:16]
    assert (first.adjacency.nnz, digest) == (PINNED_NNZ, PINNED_DIGEST)
    assert first.features.dtype == np.float32 and first.features.min() >= -1 and first.features.max() < 1
    assert np.bincount(first.labels, minlength=4).min() > 2**10 / 4 / 3  # no class starves
    assert first.meta_extra["feature_norm"] == "none"


PINNED_NNZ, PINNED_DIGEST = 21034, "9bc5fff902d6a16b"
"""SCALE 10, seed 7: stored entries and the first 16 hex digits of the SHA-256 of the column ids (int64)."""


def test_abcd_must_be_four_probabilities() -> None:
    assert check_abcd(GRAPH500) is None
    assert "summing to 1" in check_abcd((0.5, 0.2, 0.2, 0.2))
    assert "four" in check_abcd((0.5, 0.5))
    assert "above 0" in check_abcd((0.0, 0.0, 0.5, 0.5))
    with pytest.raises(ValueError, match="rmat: expected four"):
        rmat_graph(4, abcd=(0.9, 0.1, 0.1, 0.1))


class _Symmetric(torch.autograd.Function):
    """``Â @ h`` for a symmetric ``Â``: the backward is the same product (torch's sparse backward is slow)."""

    @staticmethod
    def forward(ctx: object, operator: torch.Tensor, h: torch.Tensor) -> torch.Tensor:  # noqa: D102
        ctx.operator = operator
        return operator @ h

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[None, torch.Tensor]:  # noqa: D102
        return None, ctx.operator @ grad


def _test_accuracy(kind: str, adjacency: sp.csr_matrix, x: np.ndarray, y: np.ndarray, masks: dict,
                   classes: int, epochs: int = 200, hidden: int = 64) -> float:
    """Test accuracy at the best validation accuracy of a 2-layer GCN (Kipf & Welling) or the same network
    without the two propagations (an MLP), Adam 0.01, weight decay 5e-4, dropout 0.5, seed 0."""
    torch.manual_seed(0)
    normalised = gcn_operator(adjacency)
    operator = torch.sparse_csr_tensor(torch.from_numpy(normalised.indptr.astype(np.int64)),
                                       torch.from_numpy(normalised.indices.astype(np.int64)),
                                       torch.from_numpy(normalised.data.astype(np.float32)), normalised.shape)
    propagate = (lambda h: _Symmetric.apply(operator, h)) if kind == "gcn" else (lambda h: h)
    features, labels = torch.from_numpy(x), torch.from_numpy(y)
    first, second = torch.nn.Linear(x.shape[1], hidden), torch.nn.Linear(hidden, classes)
    optimiser = torch.optim.Adam([*first.parameters(), *second.parameters()], lr=0.01, weight_decay=5e-4)
    train, val, test = (torch.from_numpy(masks[k]) for k in ("train", "val", "test"))
    best_val, at_best = -1.0, 0.0
    for epoch in range(epochs):
        for training in (True, False):
            with torch.set_grad_enabled(training):
                h = torch.nn.functional.dropout(torch.relu(propagate(first(features))), 0.5, training)
                out = propagate(second(h))
            if training:
                optimiser.zero_grad()
                torch.nn.functional.cross_entropy(out[train], labels[train]).backward()
                optimiser.step()
        predicted = out.argmax(dim=1)
        accuracy = [(predicted[m] == labels[m]).float().mean().item() for m in (val, test)]
        if accuracy[0] > best_val:
            best_val, at_best = accuracy
    return at_best


def test_a_gcn_beats_an_mlp_on_the_same_features_by_ten_points() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        graph = rmat_graph(11, seed=0)
        x, y, masks = node_data(graph.adjacency, 16, 4, seed=0)
        gcn = _test_accuracy("gcn", graph.adjacency, x, y, masks, 4)
        mlp = _test_accuracy("mlp", graph.adjacency, x, y, masks, 4)
    finally:
        torch.set_num_threads(threads)
    assert gcn - mlp >= 0.10, (gcn, mlp)
    assert gcn > 0.7  # and the labels are learnable at all
