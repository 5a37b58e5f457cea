"""The passes the model saves without dropout: the ReLU written in place, layer 0 from the kept ``Â X``.

Each is checked against an independent dense computation with torch's own (out-of-place) ReLU and autograd.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from algorithms.model import GraphModel, _ReluInPlace
from sparse_dist.halo import StaticHalo

ROWS, DIMS = 9, [4, 6, 5, 3]


def _adjacency(seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    a = (torch.rand(ROWS, ROWS, generator=generator, dtype=torch.float64) < 0.4).double()
    return a * torch.rand(ROWS, ROWS, generator=generator, dtype=torch.float64)  # directed, weighted


def _dense_reference(model: GraphModel, kind: str, a: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, list]:
    """Output and parameter gradients of the same weights, computed densely with ``torch.relu``."""
    params = [[p.detach().clone().requires_grad_() for p in model.layer_parameters(k)]
              for k in range(model.num_layers)]
    h = x
    for k, layer in enumerate(params):
        if kind == "gcn":
            h = a @ h @ layer[0] + layer[1]
        else:
            h = h @ layer[0] + (a @ h) @ layer[1] + layer[2]
        if k < len(params) - 1:
            h = torch.relu(h)
    (h ** 2).sum().backward()
    return h.detach(), [[p.grad for p in layer] for layer in params]


@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_training_without_dropout_equals_the_dense_computation_and_its_gradients(kind: str) -> None:
    a = _adjacency()
    x = torch.randn(ROWS, DIMS[0], generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    model = GraphModel(kind, DIMS, dropout=0.0, seed=3, dtype=torch.float64)
    with torch.no_grad():  # non-zero biases, so that a ReLU cuts somewhere
        for layer in model.layers:
            layer.bias.uniform_(-0.5, 0.5, generator=torch.Generator().manual_seed(2))
    out = model(x, lambda h, context: a @ h, first_row=0, epoch=0, training=True)
    (out ** 2).sum().backward()
    want, grads = _dense_reference(model, kind, a, x)
    torch.testing.assert_close(out.detach(), want, rtol=1e-12, atol=1e-12)
    for k in range(model.num_layers):
        for param, expected in zip(model.layer_parameters(k), grads[k]):
            torch.testing.assert_close(param.grad, expected, rtol=1e-12, atol=1e-12)


def test_relu_in_place_writes_over_its_input_and_the_incoming_gradient() -> None:
    leaf = torch.randn(50, 7, dtype=torch.float64, requires_grad=True)
    z = leaf * 2.0
    out = _ReluInPlace.apply(z)
    assert out.data_ptr() == z.data_ptr() and bool((out >= 0).all())
    upstream = torch.randn(50, 7, dtype=torch.float64)
    out.backward(upstream.clone())
    torch.testing.assert_close(leaf.grad, 2.0 * upstream * (leaf.detach() > 0), rtol=0, atol=0)

    leaf.grad = None  # an expanded gradient (a sum's): a new tensor, the same values
    _ReluInPlace.apply(leaf * 2.0).sum().backward()
    torch.testing.assert_close(leaf.grad, 2.0 * (leaf.detach() > 0).double(), rtol=0, atol=0)


def test_relu_in_place_is_refused_where_a_node_kept_its_input() -> None:
    """Autograd's version counter: a value some node saved cannot be written over silently."""
    leaf = torch.randn(10, 3, requires_grad=True)
    z = leaf * 1.0
    kept = z * z  # saves z for its backward
    _ReluInPlace.apply(z)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        kept.sum().backward()


class _CountingHalo(StaticHalo):
    """A static halo with no remote rows over a dense ``a``, counting how layer 0 reaches it."""

    def __init__(self, a: torch.Tensor, x: torch.Tensor) -> None:  # noqa: D107 - no plan, no exchange
        self.a, self.values, self.count, self.own_count = a, x, 0, x.shape[0]
        self.halo_ids = np.empty(0, dtype=np.int64)
        self.multiplied = self.aggregated = 0

    def multiply(self, h: torch.Tensor, context=None) -> torch.Tensor:  # noqa: ANN001
        self.multiplied += 1
        return self.a @ h

    def aggregate(self) -> torch.Tensor:
        self.aggregated += 1
        return self.a @ self.values


@pytest.mark.parametrize("kind", ["gcn", "sage"])
@pytest.mark.parametrize(("dropout", "multiplied", "aggregated"), [(0.0, 0, 2), (0.5, 2, 0)])
def test_training_without_dropout_multiplies_the_kept_aggregate_of_a_static_input(
        kind: str, dropout: float, multiplied: int, aggregated: int) -> None:
    """Layer 0 over a static halo: ``Â X`` (kept) times ``W`` without dropout (GCN; SAGE's neighbour term beside
    its self term), the halo's SpMM with it (a mask changes ``X`` every epoch); two training steps, and without
    dropout the same values and gradients as the dense model."""
    a = _adjacency(4)
    x = torch.randn(ROWS, DIMS[0], generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    halo = _CountingHalo(a, x)
    model = GraphModel(kind, DIMS, dropout=dropout, seed=6, dtype=torch.float64)
    outs = [model(x, lambda h, context: a @ h, first_row=0, epoch=epoch, training=True, halo=halo)
            for epoch in range(2)]
    assert (halo.multiplied, halo.aggregated) == (multiplied, aggregated)
    if dropout == 0.0:
        (outs[0] ** 2).sum().backward()
        want, grads = _dense_reference(model, kind, a, x)
        torch.testing.assert_close(outs[0].detach(), want, rtol=1e-12, atol=1e-12)
        for k in range(model.num_layers):
            for param, expected in zip(model.layer_parameters(k), grads[k]):
                torch.testing.assert_close(param.grad, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["gcn", "sage"])
def test_a_policys_own_layer0_input_is_multiplied_as_it_is(kind: str) -> None:
    """A policy that hands layer 0 another input over the same static halo (dgs scales X's columns) is not
    replaced by the kept ``Â X``: the halo's SpMM multiplies the input given, as the dense model does."""
    a = _adjacency(10)
    x = torch.randn(ROWS, DIMS[0], generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    halo = _CountingHalo(a, x)
    scaled = x * torch.tensor([2.0, 0.0, 1.0, 0.5], dtype=torch.float64)
    model = GraphModel(kind, DIMS, dropout=0.0, seed=12, dtype=torch.float64)
    out = model(scaled, lambda h, context: a @ h, first_row=0, epoch=0, training=True, halo=halo)
    assert (halo.multiplied, halo.aggregated) == (1, 0)
    want, _ = _dense_reference(model, kind, a, scaled)
    torch.testing.assert_close(out.detach(), want, rtol=1e-12, atol=1e-12)
