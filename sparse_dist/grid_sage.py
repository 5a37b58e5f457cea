"""GraphSAGE-mean over the process grid: ``H' = H W_self + (Ā H) W_neigh + b`` with GCN's collectives.

The self term is an aggregation too: ``H[d, i] = sum_o I[d, o] H[o, i]``, with ``I[d, o]`` the identity's block
(ones where a row of ``d`` is the same node as a row of ``o``; :class:`SelfRows`). So the rank at ``(o, i, d)``
puts its product ``Ā[d, o] H[o, i]`` and its rows of ``H[o, i]`` that are also rows of ``d`` side by side,
``T[d, i] = [Ā H | I H]`` (``n_d x 2 f_i``), and GCN's one allreduce over ``o`` (:mod:`sparse_dist.grid_gcn`)
sums both halves; ``S = T [W_neigh; W_self]`` (the two blocks ``W[i, o]`` stacked, ``2 f_i x f'_o``),
allreduced over ``i``, plus ``b[o]``. The output is split over ``(d, o)`` like GCN's, so layers chain alike.

Backward, from ``G``: ``[dW_neigh; dW_self] = T^T G`` and ``db``, allreduced over ``d`` (one buffer);
``dT = G [W_neigh; W_self]^T`` over ``o``; ``dH[o, i] = Ā[d, o]^T dT_neigh + I[d, o]^T dT_self`` over ``d``.

Per rank and layer the aggregation, its gradient and the weights' gradient carry twice GCN's columns
(``terms = 2`` in :func:`sparse_dist.grid_gcn.layer_collectives`); the output's and the input gradient's
allreduces are GCN's. Layer 0's ``T`` is computed once a run (:func:`aggregate_sage_input`, phase ``halo``), as
GCN's. ``Ā = D^-1 A`` without self-loops (a node without neighbours aggregates 0), the 1D layer's
(:class:`algorithms.layers.SAGELayer`); the grid reader builds it with ``normalization="mean"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sparse_dist.bit_mask import fresh_gradient
from sparse_dist.grid import ProcessGrid, roles
from sparse_dist.grid_gcn import (AdjacencyBlock, aggregation_gradient, combine, kept_aggregation,
                                   parameter_gradients, sparse_product)
from sparse_dist.grid_links import GridLinks

TERMS = 2
"""Aggregated terms a SAGE layer multiplies (its neighbours' mean and its own rows): the byte functions'
``terms``."""


@dataclass(frozen=True)
class SelfRows:
    """``I[d, o]`` of one rotation on one rank: ``count`` nodes that are rows of both blocks, from row
    ``d_start`` of ``d``'s block and row ``o_start`` of ``o``'s (``count`` 0: the blocks share no node)."""

    d_start: int
    o_start: int
    count: int

    @classmethod
    def of(cls, grid: ProcessGrid, nodes: int, layer: int) -> "SelfRows":
        outer, _, depth = roles(layer)
        (d0, d1), (o0, o1) = grid.block(nodes, depth), grid.block(nodes, outer)
        lo, hi = max(d0, o0), min(d1, o1)
        return cls(lo - d0, lo - o0, max(hi - lo, 0))


def _aggregate(h: torch.Tensor, block: AdjacencyBlock, own: SelfRows, links: GridLinks,
               phase: str) -> torch.Tensor:
    """``T[d, i] = sum_o [Ā[d, o] H[o, i] | I[d, o] H[o, i]]``: this rank's two products side by side,
    allreduced over ``o`` (collective)."""
    width = h.shape[1]
    aggregated = h.new_zeros(block.forward.shape[0], TERMS * width)
    if h.shape[0]:
        aggregated[:, :width] = sparse_product(block.forward, h)
    if own.count:
        aggregated[own.d_start:own.d_start + own.count, width:] = h[own.o_start:own.o_start + own.count]
    links.allreduce(aggregated, block.roles[0], phase, "aggregation")
    return aggregated


def aggregate_sage_input(x: torch.Tensor, block: AdjacencyBlock, grid: ProcessGrid, nodes: int) -> torch.Tensor:
    """Layer 0's ``T[d, i]`` from this rank's ``X[o, i]``, once a run (phase ``halo``; collective)."""
    return _aggregate(x, block, SelfRows.of(grid, nodes, 0), GridLinks(grid, 0), "halo")


class GridSAGEFunction(torch.autograd.Function):
    """One SAGE layer over the grid (module docstring); collective over the grid's axis communicators.

    ``aggregated``: layer 0's ``T[d, i]`` computed once (:func:`aggregate_sage_input`), in which case ``h`` is
    not read and no input gradient is asked for."""

    @staticmethod
    def forward(ctx, h: torch.Tensor | None, neighbour_weight: torch.Tensor,  # type: ignore[override]
                self_weight: torch.Tensor, bias: torch.Tensor, block: AdjacencyBlock, own: SelfRows,
                links: GridLinks, input_grad: bool, aggregated: torch.Tensor | None = None) -> torch.Tensor:
        if aggregated is None:
            assert h is not None
            aggregated = _aggregate(h, block, own, links, "forward")
        weight = torch.cat([neighbour_weight, self_weight])
        out = combine(aggregated, weight, bias, links, block.roles[1])
        ctx.save_for_backward(weight)
        ctx.aggregated = aggregated  # let go once the weights' gradient is made (kept_aggregation)
        ctx.block, ctx.own, ctx.links, ctx.input_grad = block, own, links, input_grad
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        (weight,) = ctx.saved_tensors
        block, own, links = ctx.block, ctx.own, ctx.links
        outer, _, depth = block.roles
        width = weight.shape[0] // TERMS
        grad_out = grad_out.contiguous()
        grad_weight, grad_bias = parameter_gradients(kept_aggregation(ctx), grad_out, weight, links, depth)
        grad_h = None
        if ctx.input_grad:
            grad_aggregated = aggregation_gradient(grad_out, weight, links, outer)
            grad_h = block.transposed_product(grad_aggregated[:, :width].contiguous()).contiguous()
            if own.count:
                grad_h[own.o_start:own.o_start + own.count] += grad_aggregated[own.d_start:own.d_start + own.count,
                                                                               width:]
            links.allreduce(grad_h, depth, "backward", "input_gradient")
            fresh_gradient(grad_h)  # the ReLU (or dropout) behind it masks it in place
        return (grad_h, grad_weight[:width], grad_weight[width:], grad_bias, None, None, None, None, None)


def sage_layers(grid: ProcessGrid, nodes: int) -> Callable[..., torch.Tensor]:
    """The ``layer_fn`` of :func:`sparse_dist.grid_gcn.grid_logits` for SAGE on ``grid`` over ``nodes`` rows:
    ``params = (W_neigh[i, o], W_self[i, o], b[o])``."""
    own = {roles(layer): SelfRows.of(grid, nodes, layer) for layer in range(3)}

    def layer(h: torch.Tensor | None, params: tuple[torch.Tensor, ...], block: AdjacencyBlock, on: GridLinks,
              input_grad: bool, aggregated: torch.Tensor | None) -> torch.Tensor:
        neighbour_weight, self_weight, bias = params
        return GridSAGEFunction.apply(h, neighbour_weight, self_weight, bias, block, own[block.roles], on,
                                      input_grad, aggregated)

    return layer


__all__ = ["GridSAGEFunction", "SelfRows", "TERMS", "aggregate_sage_input", "sage_layers"]
