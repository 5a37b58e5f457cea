"""Layers as modules (algorithms/layers.py) and the model that stacks them, in one process.

The SpMM is a dense stand-in (``A @ h``); expected values are written out by
hand from DESIGN section 5, with Glorot weights drawn here from the documented
rule (one generator, layer by layer; SAGE draws W_self then W_neigh).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from algorithms.layers import LAYER_TYPES, GCNLayer, GraphLayer, SAGELayer, layer_type, register_layer
from algorithms.model import MODEL_KINDS, GraphModel

# 5 nodes, undirected, node 4 isolated; node 0 has a self-loop of weight 2.
EDGES = np.array([[2, 1, 1, 0, 0],
                  [1, 0, 1, 0, 0],
                  [1, 1, 0, 1, 0],
                  [0, 0, 1, 0, 0],
                  [0, 0, 0, 0, 0]], dtype=np.float64)
DIMS = [3, 5, 2]  # the first layer widens ((A H) W), the second shrinks (A (H W))


def expected_adjacency(kind: str) -> torch.Tensor:
    a = EDGES.copy()
    if kind == "gcn":
        np.fill_diagonal(a, np.where(np.diag(a) == 0, 1.0, np.diag(a)))  # remaining self-loops
        d = a.sum(axis=1) ** -0.5
        return torch.from_numpy(d[:, None] * a * d[None, :])
    degree = a.sum(axis=1, keepdims=True)
    return torch.from_numpy(np.divide(a, degree, out=np.zeros_like(a), where=degree > 0))


def seeded_weights(kind: str, seed: int) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    per_layer = []
    for fan_in, fan_out in zip(DIMS[:-1], DIMS[1:]):
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        count = 2 if kind == "sage" else 1
        per_layer.append([(torch.rand(fan_in, fan_out, generator=generator, dtype=torch.float64) * 2 - 1) * bound
                          for _ in range(count)])
    return per_layer


@pytest.fixture
def comm():
    from sparse_dist.comm import world

    communicator = world(gpu_aware="off")
    yield communicator
    communicator.free()


@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_model_equals_dense_hand_computation(kind: str, comm) -> None:
    layer_class = layer_type(kind)
    raw = sp.csr_matrix(EDGES)
    from sparse_dist.layout import RowLayout

    normalized = layer_class.normalize_adjacency(comm, RowLayout((0, raw.shape[0])), raw, 0)
    a = expected_adjacency(kind)
    np.testing.assert_allclose(normalized.toarray(), a.numpy(), rtol=1e-14, atol=0)

    model = GraphModel(kind, DIMS, dropout=0.5, seed=7, dtype=torch.float64)
    x = torch.linspace(-1.0, 1.0, 5 * DIMS[0], dtype=torch.float64).reshape(5, DIMS[0])
    got = model(x, lambda h, context: a @ h, first_row=0, epoch=0, training=False)

    weights = seeded_weights(kind, seed=7)
    h = x
    for layer, w in enumerate(weights):
        h = a @ h @ w[0] if kind == "gcn" else h @ w[0] + a @ h @ w[1]  # biases start at zero
        if layer < len(weights) - 1:
            h = torch.relu(h)
    torch.testing.assert_close(got, h, rtol=1e-12, atol=1e-14)

    shapes = [[tuple(p.shape) for p in model.layer_parameters(layer)] for layer in range(model.num_layers)]
    if kind == "gcn":
        assert shapes == [[(3, 5), (5,)], [(5, 2), (2,)]]
    else:
        assert shapes == [[(3, 5), (3, 5), (5,)], [(5, 2), (5, 2), (2,)]]
    for layer, w in enumerate(weights):
        for param, want in zip(model.layer_parameters(layer), w):
            assert torch.equal(param.detach(), want)


def test_forward_calls_the_spmm_once_per_layer_with_its_context() -> None:
    """One SpMM call per layer (GCN and SAGE), with the layer index in the context."""
    for kind in ("gcn", "sage"):
        calls = []

        def spmm(h: torch.Tensor, context) -> torch.Tensor:
            calls.append((context.epoch, context.layer, context.training))
            return h.clone()

        model = GraphModel(kind, [4, 6, 6, 3], dropout=0.5, seed=0)
        out = model(torch.ones(8, 4), spmm, first_row=3, epoch=2, training=True)
        assert out.shape == (8, 3)
        assert calls == [(2, 0, True), (2, 1, True), (2, 2, True)]


class _Linear(GraphLayer):
    """A toy layer that ignores the graph: ``H' = H W``."""

    kind = "toy-linear"

    def __init__(self, fan_in: int, fan_out: int, *, generator: torch.Generator,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__(fan_in, fan_out)
        self.weight = torch.nn.Parameter(torch.rand(fan_in, fan_out, generator=generator, dtype=dtype))

    @classmethod
    def normalize_adjacency(cls, comm, layout, rows, group):
        return sp.csr_matrix(rows, dtype=np.float64)

    def forward(self, h, spmm, context, weight_scale=1.0):
        return h @ (self.weight * weight_scale)


@pytest.fixture
def toy_registered():
    before = dict(LAYER_TYPES)
    register_layer(_Linear)
    yield _Linear
    LAYER_TYPES.clear()
    LAYER_TYPES.update(before)


def test_registering_a_new_layer_builds_a_model(toy_registered) -> None:
    assert LAYER_TYPES["gcn"] is GCNLayer and LAYER_TYPES["sage"] is SAGELayer
    model = GraphModel("toy-linear", [3, 4, 2], dropout=0.0, seed=1)
    assert all(isinstance(layer, _Linear) for layer in model.layers)
    x = torch.rand(6, 3)

    def no_spmm(h, context):
        raise AssertionError("the toy layer does not propagate")

    got = model(x, no_spmm, first_row=0, epoch=0, training=True)
    torch.testing.assert_close(got, torch.relu(x @ model.layers[0].weight) @ model.layers[1].weight)
    assert [len(model.layer_parameters(layer)) for layer in range(2)] == [1, 1]
    assert MODEL_KINDS == ("gcn", "sage", "gat")  # the built-in choices are untouched


def test_a_kind_cannot_be_registered_twice() -> None:
    class Impostor(_Linear):
        kind = "gcn"

    with pytest.raises(ValueError, match="'gcn' is already registered to GCNLayer"):
        register_layer(Impostor)
    assert LAYER_TYPES["gcn"] is GCNLayer


def test_unknown_kind_names_the_known_kinds() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'gin'; expected one of \('gcn', 'sage', 'gat'\)"):
        GraphModel("gin", [3, 2])
    with pytest.raises(ValueError, match="unknown model 'GCN'"):
        layer_type("GCN")
