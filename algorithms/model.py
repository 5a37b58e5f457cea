"""GCN and GraphSAGE-mean models over the distributed SpMM.

Layer math (DESIGN section 5), for this rank's rows ``H`` (``n_g x F_in``):

* GCN: ``H' = Â H W + b``; when the layer shrinks the width
  (``F_out < F_in``) it computes ``Â (H W)`` so the exchange carries ``F_out``
  columns, else ``(Â H) W``.
* SAGE-mean: ``H' = H W_self + (Ā H) W_neigh + b``, with the same rule for
  the neighbour term.

ReLU between layers (none after the last), inverted dropout on every layer's
input with masks drawn per global row (:mod:`algorithms.dropout`). Two
fusions keep dropout to about one pass over the activations: the ReLU of
layer ``l`` and the mask of layer ``l + 1``'s input are one autograd node,
and the inverted-dropout scale multiplies the (small) weights instead of
the activations (``dropout(H) W = (H m)(s W)``; both sides are linear in
``H``, so SAGE scales both its weights).

Initial weights: Glorot-uniform from one ``torch.Generator`` seeded with
``seed``, drawn layer by layer (GCN: ``W``; SAGE: ``W_self`` then
``W_neigh``) as ``(U[0,1) * 2 - 1) * sqrt(6 / (F_in + F_out))``; biases zero.
Every rank draws the same weights, so they are replicated without a
broadcast.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from algorithms.dropout import GlobalRowDropout
from sparse_dist.accounting import ComputeTimer
from sparse_dist.policy import ExchangeContext

MODEL_KINDS = ("gcn", "sage")


def glorot(generator: torch.Generator, fan_in: int, fan_out: int) -> torch.Tensor:
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return (torch.rand(fan_in, fan_out, generator=generator, dtype=torch.float64) * 2 - 1) * bound


class GraphModel(nn.Module):
    """An L-layer GCN or GraphSAGE-mean whose propagation is a distributed SpMM.

    ``forward`` is collective: every rank calls it in the same epoch.
    """

    def __init__(self, kind: str, dims: list[int], *, dropout: float = 0.5, seed: int = 0,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if kind not in MODEL_KINDS:
            raise ValueError(f"unknown model {kind!r}; expected one of {MODEL_KINDS}")
        if len(dims) < 2 or min(dims) < 1:
            raise ValueError(f"model dims need at least input and output width >= 1, got {dims}")
        self.kind, self.dims, self.dropout, self.seed = kind, list(dims), dropout, seed
        generator = torch.Generator().manual_seed(seed)
        self.weights = nn.ParameterList()
        self.neighbour_weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(dims[:-1], dims[1:]):
            self.weights.append(nn.Parameter(glorot(generator, fan_in, fan_out).to(dtype)))
            if kind == "sage":
                self.neighbour_weights.append(nn.Parameter(glorot(generator, fan_in, fan_out).to(dtype)))
            self.biases.append(nn.Parameter(torch.zeros(fan_out, dtype=dtype)))

    @property
    def num_layers(self) -> int:
        return len(self.dims) - 1

    def layer_parameters(self, layer: int) -> list[nn.Parameter]:
        params = [self.weights[layer], self.biases[layer]]
        if self.kind == "sage":
            params.insert(1, self.neighbour_weights[layer])
        return params

    @staticmethod
    def _propagate(spmm, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   context: ExchangeContext) -> torch.Tensor:
        """``A h W (+ b)``, exchanging the narrower of ``h`` and ``h W``; the bias rides on an op that
        writes a fresh tensor anyway (``addmm``, or in place on the SpMM's own output)."""
        if weight.shape[1] < weight.shape[0]:
            out = spmm(h @ weight, context)
            return out if bias is None else out.add_(bias)
        aggregated = spmm(h, context)
        return aggregated @ weight if bias is None else torch.addmm(bias, aggregated, weight)

    def forward(self, x: torch.Tensor, spmm, *, first_row: int, epoch: int, training: bool,
                timer: ComputeTimer | None = None) -> torch.Tensor:
        """This rank's output rows; ``timer`` books the dropout work (masks and their passes)."""
        dropout = (GlobalRowDropout(self.dropout, self.seed, epoch, first_row, timer)
                   if training and self.dropout > 0 else None)
        scale = dropout.scale if dropout is not None else 1.0
        h = dropout.drop(x, 0) if dropout is not None else x
        for layer in range(self.num_layers):
            context = ExchangeContext(epoch=epoch, layer=layer, training=training)
            weight = self.weights[layer] * scale if scale != 1.0 else self.weights[layer]
            if self.kind == "gcn":
                h = self._propagate(spmm, h, weight, self.biases[layer], context)
            else:
                neighbour = self.neighbour_weights[layer] * scale if scale != 1.0 else self.neighbour_weights[layer]
                h = torch.addmm(self.biases[layer], h, weight).add_(self._propagate(spmm, h, neighbour, None, context))
            if layer < self.num_layers - 1:
                h = dropout.relu_drop(h, layer + 1) if dropout is not None else torch.relu(h)
        return h
