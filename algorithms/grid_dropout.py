"""Dropout on the process grid (:mod:`sparse_dist.grid_gcn`): the 1D rule's masks, cut to a rank's block.

A layer's input on the grid is the block ``H[o, i]``: the rows of ``o`` and the columns of ``i`` (replicated over
``d``). Its mask is the 1D rule's (:func:`algorithms.dropout.keep_mask`: per global row, from the seed, the epoch,
the layer and the layer's whole width) for the rows of ``o``, cut to the columns of ``i``. So every replica over
``d`` masks alike, and a grid run draws, entry for entry, the masks one process draws: grids equal one process
with dropout as without. The inverted-dropout scale multiplies the layer's weight blocks (as 1D's
``(H m)(s W)``); the biases are not scaled.

Layer 0's input is masked too, so with dropout its aggregation ``Â (X ∘ M)`` changes every step: a run with
dropout aggregates layer 0 in every step (``aggregated_once`` False in the byte functions). On the CPU a rank makes only
its block's lanes (the rule is counter-based); on a GPU the rows' whole width, then the cut. Pure: no
communication.
"""

from __future__ import annotations

import torch

from algorithms.dropout import KeepRule, keep_mask, load_compiled_passes
from sparse_dist.bit_mask import PackedMask, masked_gradient
from sparse_dist.grid import ProcessGrid, roles


class _Masked(torch.autograd.Function):
    """``h * mask`` (boolean mask, unscaled), its backward ``grad * mask`` (the mask kept at one bit an entry,
    :class:`~sparse_dist.bit_mask.PackedMask`; the grid layer's fresh input gradient masked in place,
    :func:`~sparse_dist.bit_mask.masked_gradient`)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.kept = PackedMask.of(mask)
        return h * mask

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        return masked_gradient(ctx.kept, grad), None


class GridDropout:
    """The dropout of one training forward on the grid: every layer's input masked (module docstring).

    ``dims``: the layers' widths ``F -> hidden ... -> classes`` (a layer's mask is drawn at its input's whole
    width); ``nodes``: the graph's rows."""

    def __init__(self, p: float, seed: int, epoch: int, grid: ProcessGrid, nodes: int, dims: list[int]) -> None:
        self.rule = KeepRule.of(p)
        self.seed, self.epoch, self.grid, self.nodes, self.dims = seed, epoch, grid, nodes, list(dims)

    @property
    def scale(self) -> float:
        """What a kept entry is multiplied by (folded into the layer's weights)."""
        return self.rule.scale

    def mask(self, layer: int, device: torch.device) -> torch.Tensor:
        """This rank's block of ``layer``'s input mask (``n_o x f_i``, boolean)."""
        (r0, r1), (c0, c1) = input_block(self.grid, self.nodes, self.dims, layer)
        return keep_mask(self.seed, self.epoch, layer, r0, r1 - r0, self.dims[layer], self.rule.p, device,
                         columns=(c0, c1))

    def drop(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """``h * mask`` of ``layer``'s input block (unscaled: :attr:`scale` goes to the weights)."""
        return _Masked.apply(h, self.mask(layer, h.device))


def load_grid_passes(grid: ProcessGrid, nodes: int, dims: list[int], device: torch.device,
                     dtype: torch.dtype, epochs: int = 1) -> float | None:
    """Load the compiled mask passes at set-up where this rank's largest mask (a layer's ``n_o x f_i`` block), or
    ``epochs`` of them, would use them (the 1D trainer's rule); the seconds it took, or None
    (:func:`algorithms.dropout.load_compiled_passes`; not collective).
    Left to the first step, the load runs in the background beside it and the first masks come from NumPy's
    slower pass (R-MAT SCALE 20 at 2x2x2: 1.0 s a mask against well under 0.1 s compiled)."""
    largest = 0
    for layer in range(len(dims) - 1):
        (r0, r1), (c0, c1) = input_block(grid, nodes, dims, layer)
        largest = max(largest, (r1 - r0) * (c1 - c0))
    return load_compiled_passes(largest, device, dtype, epochs)


def input_block(grid: ProcessGrid, nodes: int, dims: list[int], layer: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The rows (of ``o``) and columns (of ``i``) of ``layer``'s input block ``H[o, i]`` on this rank."""
    outer, inner, _ = roles(layer)
    return grid.block(nodes, outer), grid.block(dims[layer], inner)


__all__ = ["GridDropout", "load_grid_passes"]
