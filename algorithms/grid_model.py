"""How a layer kind runs on the process grid: which of its parameters the grid's layer takes, in which order, how
the grid reader normalises ``A`` for it, and its grid layer and layer-0 aggregation.

A 1D layer (:mod:`algorithms.layers`) answers ``grid_form``: this module's :class:`GridForm`, or None where the
grid does not run it (GAT: its attention needs every neighbour's whole row, which the grid splits over columns).
The grid trainer (:mod:`algorithms.training.grid_trainer`) keeps the 1D model's whole weights, replicated, and cuts
from them the blocks each rank multiplies (:func:`sparse_dist.grid_gcn.weight_block`), so a grid run and a 1D run
of one seed start from the same weights and a checkpoint of either resumes in the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from sparse_dist.grid import ProcessGrid
from sparse_dist.grid_gcn import AdjacencyBlock, aggregate_input, gcn_layer
from sparse_dist.grid_sage import TERMS as SAGE_TERMS, aggregate_sage_input, sage_layers


def _gcn_layers(grid: ProcessGrid, nodes: int) -> Callable[..., torch.Tensor]:
    return gcn_layer


def _gcn_input(x: torch.Tensor, block: AdjacencyBlock, grid: ProcessGrid, nodes: int) -> torch.Tensor:
    return aggregate_input(x, block, grid)


@dataclass(frozen=True)
class GridForm:
    """A layer kind on the grid.

    ``parameters``: the 1D layer's parameter attributes in the order the grid's layer takes their blocks (weights
    as ``W[i, o]``, the bias as ``b[o]``, the bias last); ``normalization``: the grid reader's
    (:data:`runners.data.grid_reader.NORMALIZATIONS`); ``terms``: the aggregated terms the layer multiplies
    (:func:`sparse_dist.grid_gcn.layer_collectives`); ``layers(grid, nodes)``: the ``layer_fn`` of
    :func:`sparse_dist.grid_gcn.grid_logits`; ``first_aggregation(x, block, grid, nodes)``: layer 0's ``T[d, i]``
    from ``X[o, i]`` (collective over ``o``, phase ``halo``)."""

    parameters: tuple[str, ...]
    normalization: str
    terms: int
    layers: Callable[[ProcessGrid, int], Callable[..., torch.Tensor]]
    first_aggregation: Callable[[torch.Tensor, AdjacencyBlock, ProcessGrid, int], torch.Tensor]


GCN_GRID = GridForm(("weight", "bias"), "symmetric", 1, _gcn_layers, _gcn_input)
"""GCN: ``(W[i, o], b[o])`` over ``D^-1/2 (A + I) D^-1/2`` (:mod:`sparse_dist.grid_gcn`)."""

SAGE_GRID = GridForm(("neighbour_weight", "weight", "bias"), "mean", SAGE_TERMS, sage_layers, aggregate_sage_input)
"""GraphSAGE-mean: ``(W_neigh[i, o], W_self[i, o], b[o])`` over ``D^-1 A`` (:mod:`sparse_dist.grid_sage`)."""

__all__ = ["GCN_GRID", "GridForm", "SAGE_GRID"]
