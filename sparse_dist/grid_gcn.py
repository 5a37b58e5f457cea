"""GCN over a process grid (:mod:`sparse_dist.grid`): every matrix of a layer in blocks, collectives along axes.

One layer ``H' = A H W + b`` with roles ``(o, i, d)`` (outer, inner, depth; :func:`sparse_dist.grid.roles`)
on the rank at ``(o, i, d)`` of those axes, ``H`` held as the block ``H[o, i]`` (rows over ``o``, columns over
``i``), ``A[d, o]``, ``W[i, o]`` and ``b[o]``:

forward
    ``T = A[d, o] H[o, i]``, allreduced over ``o``: ``T[d, i] = sum_o A[d, o] H[o, i]``, the aggregation's
    rows of ``d`` and columns of ``i``; ``S = T[d, i] W[i, o]``, allreduced over ``i``: ``H'[d, o] - b[o]``;
    then ``+ b[o]``. The output is split over ``(d, o)`` and replicated over ``i``: the next layer's
    ``H[o', i']`` with ``o' = d``, ``i' = o``.
backward, from ``G = dL/dH'[d, o]`` (the same on every replica over ``i``)
    ``dW[i, o] = T[d, i]^T G`` and ``db[o] = sum_rows G``, allreduced over ``d`` (phase ``grad_allreduce``,
    one buffer); ``dT[d, i] = G W[i, o]^T`` allreduced over ``o``; ``dH[o, i] = A[d, o]^T dT[d, i]``
    allreduced over ``d`` (phase ``backward``; not for layer 0, whose input needs no gradient).

Per rank and layer, with ``n_a`` the length of this rank's block of the ``N`` rows over axis ``a``, ``f_a`` of
a width over ``a`` and ``ring(m, s)`` a ring allreduce's bytes of ``m`` elements over ``s`` ranks
(:func:`sparse_dist.accounting.ring_allreduce_bytes`: ``2 (m - m/s)`` elements): forward
``ring(n_d f_i, |o|) + ring(n_d f'_o, |i|)``; backward ``ring(n_d f_i, |o|) + ring(n_o f_i, |d|)``;
gradients ``ring(f_i f'_o + f'_o, |d|)``. Summed over the ``P`` ranks the forward sends
``2 N (F (|o| - 1) + F' (|i| - 1))`` elements, whatever the partition: the grid trades 1D's halo (which
approaches ``N F`` per rank on a random partition) for allreduces whose share per rank shrinks with ``P``.

The loss (:class:`GridCrossEntropy`) is the mean cross-entropy over the training rows of logits split over
``(d, o)``: a row's log-sum-exp needs its classes from every ``o`` (three allreduces of ``n_d`` values over
``o``: max, sum of exponentials, the label's logit), the sum over rows one scalar over ``d``. Every rank ends
with the global loss; the replicas over ``i`` compute the same values.

Not yet here (the process-grid issue's later parts): reading the blocks from shards (:func:`adjacency_blocks`
takes the whole matrix, as the tests do), dropout, SAGE and GAT, the training command's ``--grid``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.accounting import ring_allreduce_bytes
from sparse_dist.csr import torch_csr
from sparse_dist.grid import GridShape, ProcessGrid, block_range, roles


@dataclass(frozen=True)
class AdjacencyBlock:
    """``A[d, o]`` of one rotation (``n_d x n_o``, torch CSR) and its transpose, on this rank."""

    roles: tuple[str, str, str]
    forward: torch.Tensor
    transpose: torch.Tensor


def adjacency_blocks(grid: ProcessGrid, matrix: sp.csr_matrix, layers: int, dtype: torch.dtype) -> list[AdjacencyBlock]:
    """This rank's block of ``matrix`` (``N x N``, global ids) for each rotation the ``layers`` use (at most 3)."""
    n = matrix.shape[0]
    local = []
    for layer in range(min(layers, 3)):
        outer, _, depth = roles(layer)
        (r0, r1), (c0, c1) = grid.block(n, depth), grid.block(n, outer)
        local.append(sp.csr_matrix(matrix[r0:r1, c0:c1], dtype=np.float64))
    return as_blocks(local, dtype, torch.device("cpu"))


def as_blocks(local: list[sp.csr_matrix], dtype: torch.dtype, device: torch.device) -> list[AdjacencyBlock]:
    """Rotation ``r``'s block ``local[r]`` (``A[d, o]``, local ids) with its transpose, as torch CSR."""
    return [AdjacencyBlock(roles(layer), torch_csr(block, dtype, device), torch_csr(block.T.tocsr(), dtype, device))
            for layer, block in enumerate(local)]


class GridGCNFunction(torch.autograd.Function):
    """One GCN layer over the grid (module docstring); collective over the grid's axis communicators."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, block: AdjacencyBlock,  # type: ignore[override]
                grid: ProcessGrid, input_grad: bool) -> torch.Tensor:
        outer, inner, depth = block.roles
        aggregated = torch.sparse.mm(block.forward, h) if h.shape[0] else h.new_zeros(block.forward.shape[0], h.shape[1])
        aggregated = aggregated.contiguous()
        grid.axis_comm[outer].allreduce_(aggregated, "forward")
        out = (aggregated @ weight).contiguous()
        grid.axis_comm[inner].allreduce_(out, "forward")
        out.add_(bias)
        ctx.save_for_backward(aggregated, weight)
        ctx.block, ctx.grid, ctx.input_grad = block, grid, input_grad
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        aggregated, weight = ctx.saved_tensors
        block, grid = ctx.block, ctx.grid
        outer, _, depth = block.roles
        grad_out = grad_out.contiguous()
        packed = torch.cat([(aggregated.T @ grad_out).reshape(-1), grad_out.sum(dim=0)])
        grid.axis_comm[depth].allreduce_(packed, "grad_allreduce")
        grad_weight = packed[:weight.numel()].view_as(weight)
        grad_bias = packed[weight.numel():]
        grad_h = None
        if ctx.input_grad:
            grad_aggregated = (grad_out @ weight.T).contiguous()
            grid.axis_comm[outer].allreduce_(grad_aggregated, "backward")
            grad_h = torch.sparse.mm(block.transpose, grad_aggregated).contiguous()
            grid.axis_comm[depth].allreduce_(grad_h, "backward")
        return grad_h, grad_weight, grad_bias, None, None, None


class GridCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over the training rows of logits split over ``(d, o)`` (module docstring)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, train: torch.Tensor, class_lo: int,  # type: ignore[override]
                train_count: int, grid: ProcessGrid, layer: int) -> torch.Tensor:
        outer, _, depth = roles(layer)
        rows, width = logits.shape
        row_max = (logits.max(dim=1).values if width else logits.new_full((rows,), -math.inf)).contiguous()
        grid.axis_comm[outer].allreduce_(row_max, "forward", op="max")
        shifted = logits - row_max[:, None]
        sums = shifted.exp().sum(dim=1).contiguous()
        grid.axis_comm[outer].allreduce_(sums, "forward")
        log_sum = sums.log()
        here = (labels >= class_lo) & (labels < class_lo + width)
        picked = logits.new_zeros(rows)
        picked[here] = shifted[here, labels[here] - class_lo]
        grid.axis_comm[outer].allreduce_(picked, "forward")
        total = ((log_sum - picked)[train].sum() / train_count).reshape(1).contiguous()
        grid.axis_comm[depth].allreduce_(total, "forward")
        probabilities = (shifted - log_sum[:, None]).exp()
        ctx.save_for_backward(probabilities, labels, train, here)
        ctx.class_lo, ctx.train_count = class_lo, train_count
        return total[0]

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):  # type: ignore[override]
        probabilities, labels, train, here = ctx.saved_tensors
        grad = probabilities.clone()
        rows = torch.nonzero(here).flatten()
        grad[rows, labels[rows] - ctx.class_lo] -= 1.0
        grad[~train] = 0.0
        return grad * (grad_loss / ctx.train_count), None, None, None, None, None, None


def grid_logits(x: torch.Tensor, params: list[tuple[torch.Tensor, torch.Tensor]], blocks: list[AdjacencyBlock],
                grid: ProcessGrid) -> torch.Tensor:
    """The GCN's output block ``[d, o]`` of its last layer from layer 0's ``X[o, i]``: each layer's
    :class:`GridGCNFunction` (``params[l]`` its ``(W[i, o], b[o])``, ``blocks[l % 3]`` its rotation), ReLU between
    layers. Collective over the grid."""
    h = x
    for layer, (weight, bias) in enumerate(params):
        h = GridGCNFunction.apply(h, weight, bias, blocks[layer % 3], grid, layer > 0)
        if layer < len(params) - 1:
            h = torch.relu(h)
    return h


def predicted_classes(logits: torch.Tensor, class_lo: int, grid: ProcessGrid, layer: int) -> torch.Tensor:
    """Each output row's argmax over all classes (the lowest class id among ties), from logits split over
    ``(d, o)``: two allreduces of ``n_d`` values over ``o`` (phase ``other``: evaluation)."""
    outer = roles(layer)[0]
    rows, width = logits.shape
    best = (logits.max(dim=1).values if width else logits.new_full((rows,), -math.inf)).contiguous()
    grid.axis_comm[outer].allreduce_(best, "other", op="max")
    if width:
        hits = logits == best[:, None]
        first = torch.where(hits.any(dim=1), hits.int().argmax(dim=1).to(logits.dtype) + class_lo,
                            logits.new_full((rows,), math.inf))
    else:
        first = logits.new_full((rows,), math.inf)
    first = first.contiguous()
    grid.axis_comm[outer].allreduce_(first, "other", op="min")
    return first.long()


def predicted_layer_bytes(grid: ProcessGrid, layer: int, nodes: int, width_in: int, width_out: int,
                          itemsize: int, input_grad: bool) -> dict[str, int]:
    """Bytes this rank sends (and receives) in ``layer``'s forward, backward and gradient allreduce."""
    return layer_bytes(grid.shape, grid.coords, layer, nodes, width_in, width_out, itemsize, input_grad)


def predicted_loss_bytes(grid: ProcessGrid, layer: int, nodes: int, itemsize: int) -> int:
    """Bytes this rank sends in :class:`GridCrossEntropy` (phase ``forward``) on the output of ``layer``."""
    return loss_bytes(grid.shape, grid.coords, layer, nodes, itemsize)


def layer_bytes(shape: GridShape, coords: Mapping[str, int], layer: int, nodes: int, width_in: int, width_out: int,
                itemsize: int, input_grad: bool) -> dict[str, int]:
    """:func:`predicted_layer_bytes` of the rank at ``coords`` of a ``shape`` grid, without a communicator
    (the cost model asks it of grids it cannot build)."""
    out = {"forward": 0, "backward": 0, "grad_allreduce": 0}
    for phase, axis, numel in layer_collectives(shape, coords, layer, nodes, width_in, width_out, input_grad):
        out[phase] += ring_allreduce_bytes(numel, shape.of(axis), coords[axis], itemsize)
    return out


def loss_bytes(shape: GridShape, coords: Mapping[str, int], layer: int, nodes: int, itemsize: int) -> int:
    """:func:`predicted_loss_bytes` of the rank at ``coords`` of a ``shape`` grid, without a communicator."""
    return sum(ring_allreduce_bytes(numel, shape.of(axis), coords[axis], itemsize)
               for _, axis, numel in loss_collectives(shape, coords, layer, nodes))


def layer_collectives(shape: GridShape, coords: Mapping[str, int], layer: int, nodes: int, width_in: int,
                      width_out: int, input_grad: bool) -> list[tuple[str, str, int]]:
    """The allreduces :class:`GridGCNFunction` runs for ``layer`` on the rank at ``coords``, in order: (phase,
    axis, elements) (module docstring)."""
    outer, inner, depth = roles(layer)
    n_depth = _length(block_range(nodes, shape.of(depth), coords[depth]))
    n_outer = _length(block_range(nodes, shape.of(outer), coords[outer]))
    f_inner = _length(block_range(width_in, shape.of(inner), coords[inner]))
    f_out = _length(block_range(width_out, shape.of(outer), coords[outer]))
    out = [("forward", outer, n_depth * f_inner), ("forward", inner, n_depth * f_out),
           ("grad_allreduce", depth, f_inner * f_out + f_out)]
    if input_grad:
        out += [("backward", outer, n_depth * f_inner), ("backward", depth, n_outer * f_inner)]
    return out


def loss_collectives(shape: GridShape, coords: Mapping[str, int], layer: int,
                     nodes: int) -> list[tuple[str, str, int]]:
    """The allreduces of :class:`GridCrossEntropy` on the output of ``layer`` (all phase ``forward``): max, sum of
    exponentials and the label's logit of each of the rank's ``n_d`` rows over ``o``, the loss over ``d``."""
    outer, _, depth = roles(layer)
    n_depth = _length(block_range(nodes, shape.of(depth), coords[depth]))
    return [("forward", outer, n_depth)] * 3 + [("forward", depth, 1)]


def _length(span: tuple[int, int]) -> int:
    return span[1] - span[0]


def weight_block(grid: ProcessGrid, layer: int, full: torch.Tensor) -> torch.Tensor:
    """``W[i, o]`` of ``layer`` from the whole ``F x F'`` matrix (every rank generates it from the seed)."""
    outer, inner, _ = roles(layer)
    (r0, r1), (c0, c1) = grid.block(full.shape[0], inner), grid.block(full.shape[1], outer)
    return full[r0:r1, c0:c1].clone()


def bias_block(grid: ProcessGrid, layer: int, full: torch.Tensor) -> torch.Tensor:
    """``b[o]`` of ``layer``."""
    lo, hi = grid.block(full.shape[0], roles(layer)[0])
    return full[lo:hi].clone()


def input_block(grid: ProcessGrid, features: np.ndarray) -> np.ndarray:
    """Layer 0's ``X[o, i]`` (rows over ``x``, columns over ``y``) from the whole ``N x F`` features."""
    outer, inner, _ = roles(0)
    (r0, r1), (c0, c1) = grid.block(features.shape[0], outer), grid.block(features.shape[1], inner)
    return features[r0:r1, c0:c1]


def output_rows(grid: ProcessGrid, layers: int, nodes: int) -> tuple[int, int]:
    """The global rows of the last layer's output on this rank (its ``d`` block)."""
    return grid.block(nodes, roles(layers - 1)[2])


def output_classes(grid: ProcessGrid, layers: int, classes: int) -> tuple[int, int]:
    """The classes (columns) of the last layer's output on this rank (its ``o`` block)."""
    return grid.block(classes, roles(layers - 1)[0])


__all__ = ["AdjacencyBlock", "GridCrossEntropy", "GridGCNFunction", "adjacency_blocks", "as_blocks", "bias_block",
           "block_range", "grid_logits", "input_block", "layer_bytes", "layer_collectives", "loss_bytes", "loss_collectives",
           "output_classes", "output_rows", "predicted_classes", "predicted_layer_bytes", "predicted_loss_bytes",
           "weight_block"]
