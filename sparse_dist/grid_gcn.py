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

Layer 0's aggregation ``A X`` does not change during training: a run computes it once
(:func:`aggregate_input`, phase ``halo``) and each step starts from it, so a step's layer 0 sends only its
``ring(n_d f'_o, |i|)`` forward and its gradients (``aggregated_once`` in the byte functions).

Memory: a rank holds each rotation's block once (its transpose is stored on CUDA only,
:class:`AdjacencyBlock`), and the ReLU between layers keeps its mask at one bit an entry (:class:`GridReLU`), so
a layer keeps its aggregation ``T[d, i]`` and a bit mask of its output for the backward; the backward lets
``T[d, i]`` go once the weights' gradient is made (:func:`kept_aggregation`), before the input gradient's blocks.

GraphSAGE is :mod:`sparse_dist.grid_sage` (the same collectives, twice the aggregated columns); GAT does not run
on the grid. Dropout is :mod:`algorithms.grid_dropout` (``grid_logits(..., dropout=)``). ``train --grid`` trains
over the grid (:mod:`algorithms.training.grid_trainer`), ``sparse-dist bench grid`` times it, both from shards
(:mod:`runners.data.grid_reader`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.bit_mask import PackedMask, fresh_gradient, masked_gradient
from sparse_dist.csr import torch_csr
from sparse_dist.grid import GridShape, ProcessGrid, block_range, roles
from sparse_dist.compress import Codec
from sparse_dist.grid_links import GridLinks, allreduce_message_bytes, allreduce_pieces, pieces_bytes

@dataclass(frozen=True)
class AdjacencyBlock:
    """``A[d, o]`` of one rotation (``n_d x n_o``, torch CSR) on this rank, and how it multiplies by its transpose.

    On CUDA the transpose is stored (``transpose``, cuSPARSE's CSR product). On the CPU it is not: the
    backward's ``A[d, o]^T dT`` runs scipy's CSC kernel on the same three arrays (``scipy_view``, no copy), so
    the rank holds each block once. scipy's kernel is single-threaded; at one thread a rank it was as fast as
    torch's product with a stored transpose on a 200k x 200k block of 3.2M entries at 64 columns (one reading
    each under load, not a speed claim). Torch's own product by ``forward.t()`` converts the block on every
    call."""

    roles: tuple[str, str, str]
    forward: torch.Tensor
    transpose: torch.Tensor | None = None
    scipy_view: sp.csr_matrix | None = field(default=None, repr=False)

    def transposed_product(self, dense: torch.Tensor) -> torch.Tensor:
        """``A[d, o]^T dense`` (``n_o x f``) for ``dense`` of ``n_d`` rows."""
        if self.transpose is not None:
            return torch.sparse.mm(self.transpose, dense)
        assert self.scipy_view is not None
        return torch.from_numpy(np.ascontiguousarray(self.scipy_view.T @ dense.detach().numpy()))


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
    """Rotation ``r``'s block ``local[r]`` (``A[d, o]``, local ids) as torch CSR; its transpose stored on CUDA
    only (:class:`AdjacencyBlock`). On the CPU the tensors share ``local``'s arrays where their types already
    match (int32 indices, ``dtype`` values)."""
    out = []
    for layer, block in enumerate(local):
        forward = torch_csr(block, dtype, device)
        if device.type == "cpu":
            view = sp.csr_matrix((forward.values().numpy(), forward.col_indices().numpy(),
                                  forward.crow_indices().numpy()), shape=tuple(forward.shape), copy=False)
            out.append(AdjacencyBlock(roles(layer), forward, scipy_view=view))
        else:
            out.append(AdjacencyBlock(roles(layer), forward, transpose=torch_csr(block.T.tocsr(), dtype, device)))
    return out


def aggregate_input(x: torch.Tensor, block: AdjacencyBlock, grid: ProcessGrid) -> torch.Tensor:
    """Layer 0's aggregation ``T[d, i] = sum_o A[d, o] X[o, i]`` from this rank's ``X[o, i]``: one SpMM and one
    allreduce over ``o`` (phase ``halo``). ``X`` does not change during training (no input dropout on the grid),
    so a run computes it once, before the first step, and layer 0 multiplies it by its weights every step
    (the 1D plans' ``--input-exchange once`` likewise fetch ``X``'s halo once)."""
    return _aggregate(x, block, GridLinks(grid, 0), "halo")


def sparse_product(matrix: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """``matrix @ dense`` (a CSR ``n x m`` by ``m x f``) as one new ``n x f`` block. On the CPU torch's
    ``sparse.mm`` holds a temporary as large as its result beside it (peak RSS 2x the result for a 1M x 64 float32
    block); ``addmm`` into the fresh result with ``beta = 0`` (which ignores its uninitialised values) does not,
    and gives the same bits. On other devices ``sparse.mm`` (not measured there)."""
    if not dense.shape[0]:
        return dense.new_zeros(matrix.shape[0], dense.shape[1])
    if dense.device.type != "cpu":
        return torch.sparse.mm(matrix, dense).contiguous()
    out = dense.new_empty(matrix.shape[0], dense.shape[1])
    return torch.addmm(out, matrix, dense.contiguous(), beta=0, out=out)


def _aggregate(h: torch.Tensor, block: AdjacencyBlock, links: GridLinks, phase: str) -> torch.Tensor:
    """``T[d, i] = sum_o A[d, o] H[o, i]``: this rank's product, allreduced over ``o`` (collective)."""
    aggregated = sparse_product(block.forward, h)
    links.allreduce(aggregated, block.roles[0], phase, "aggregation")
    return aggregated


def combine(aggregated: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, links: GridLinks,
            inner: str) -> torch.Tensor:
    """``H'[d, o] = sum_i T[d, i] W[i, o] + b[o]``: this rank's product, allreduced over ``inner`` (collective)."""
    out = (aggregated @ weight).contiguous()
    links.allreduce(out, inner, "forward", "combination")
    return out.add_(bias)


def parameter_gradients(aggregated: torch.Tensor, grad_out: torch.Tensor, weight: torch.Tensor, links: GridLinks,
                        depth: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``dW[i, o] = T[d, i]^T G`` and ``db[o]``, allreduced over ``depth`` in one buffer (collective; exact)."""
    packed = torch.cat([(aggregated.T @ grad_out).reshape(-1), grad_out.sum(dim=0)])
    links.allreduce(packed.view(1, -1), depth, "grad_allreduce", "weight_gradient")
    return packed[:weight.numel()].view_as(weight), packed[weight.numel():]


def aggregation_gradient(grad_out: torch.Tensor, weight: torch.Tensor, links: GridLinks, outer: str) -> torch.Tensor:
    """``dT[d, i] = sum_o G W[i, o]^T``: this rank's product, allreduced over ``outer`` (collective)."""
    grad_aggregated = (grad_out @ weight.T).contiguous()
    links.allreduce(grad_aggregated, outer, "backward", "aggregation_gradient")
    return grad_aggregated


class GridGCNFunction(torch.autograd.Function):
    """One GCN layer over the grid (module docstring); collective over the grid's axis communicators.

    ``aggregated``: layer 0's ``T[d, i]`` computed once (:func:`aggregate_input`), in which case ``h`` is not
    read and no input gradient is asked for."""

    @staticmethod
    def forward(ctx, h: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor,  # type: ignore[override]
                block: AdjacencyBlock, links: GridLinks, input_grad: bool,
                aggregated: torch.Tensor | None = None) -> torch.Tensor:
        inner = block.roles[1]
        if aggregated is None:
            assert h is not None
            aggregated = _aggregate(h, block, links, "forward")
        out = combine(aggregated, weight, bias, links, inner)
        ctx.save_for_backward(weight)
        ctx.aggregated = aggregated  # not saved: the backward lets it go early (kept_aggregation)
        ctx.block, ctx.links, ctx.input_grad = block, links, input_grad
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        (weight,) = ctx.saved_tensors
        block, links = ctx.block, ctx.links
        outer, _, depth = block.roles
        grad_out = grad_out.contiguous()
        grad_weight, grad_bias = parameter_gradients(kept_aggregation(ctx), grad_out, weight, links, depth)
        grad_h = None
        if ctx.input_grad:
            grad_aggregated = aggregation_gradient(grad_out, weight, links, outer)
            grad_h = block.transposed_product(grad_aggregated).contiguous()
            links.allreduce(grad_h, depth, "backward", "input_gradient")
            fresh_gradient(grad_h)  # the ReLU (or dropout) behind it masks it in place
        return grad_h, grad_weight, grad_bias, None, None, None, None


def kept_aggregation(ctx: Any) -> torch.Tensor:
    """The layer's ``T[d, i]`` its forward kept on ``ctx``, handed over once: the backward needs it only for the
    weights' gradient, so it is let go before the input gradient's blocks ``dT[d, i]`` and ``dH[o, i]`` are made
    (a saved tensor would live to the end of the backward: one activation block more at the peak). A second
    backward through the same graph is refused."""
    aggregated = ctx.aggregated
    if aggregated is None:
        raise RuntimeError("a grid layer's backward runs once per forward: its aggregation was let go after the "
                           "weights' gradient")
    ctx.aggregated = None
    return aggregated


class GridReLU(torch.autograd.Function):
    """ReLU in place on a layer's output, keeping its mask for the backward at one bit an entry
    (:class:`~sparse_dist.bit_mask.PackedMask`: a 32nd of the float32 output ``torch.relu`` would keep): the next
    layer keeps its own aggregation, not its input. The backward masks the gradient in place: what arrives is the
    next grid layer's (or grid dropout's) fresh input gradient, which nothing else reads, so a second block beside
    it would only raise the backward's peak (R-MAT SCALE 20 at 2x2x2: by one 128 MiB block)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        positive = h > 0
        h.masked_fill_(~positive, 0.0)
        ctx.mark_dirty(h)
        ctx.positive = PackedMask.of(positive)
        return h

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        return masked_gradient(ctx.positive, grad_out)


class GridCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over the training rows of logits split over ``(d, o)`` (module docstring)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, train: torch.Tensor, class_lo: int,  # type: ignore[override]
                train_count: int, grid: ProcessGrid, layer: int) -> torch.Tensor:
        outer, _, depth = roles(layer)
        rows, width = logits.shape
        row_max = (logits.max(dim=1).values if width else logits.new_full((rows,), -math.inf)).contiguous()
        allreduce_pieces(grid.axis_comm[outer], row_max, "forward", op="max")
        shifted = logits - row_max[:, None]
        sums = shifted.exp().sum(dim=1).contiguous()
        allreduce_pieces(grid.axis_comm[outer], sums, "forward")
        log_sum = sums.log()
        here = (labels >= class_lo) & (labels < class_lo + width)
        picked = logits.new_zeros(rows)
        picked[here] = shifted[here, labels[here] - class_lo]
        allreduce_pieces(grid.axis_comm[outer], picked, "forward")
        total = ((log_sum - picked)[train].sum() / train_count).reshape(1).contiguous()
        allreduce_pieces(grid.axis_comm[depth], total, "forward")
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


def gcn_layer(h: torch.Tensor | None, params: tuple[torch.Tensor, ...], block: AdjacencyBlock, links: GridLinks,
              input_grad: bool, aggregated: torch.Tensor | None) -> torch.Tensor:
    """One GCN layer over the grid, ``params = (W[i, o], b[o])`` (:class:`GridGCNFunction`), its allreduces
    through ``links``."""
    weight, bias = params
    return GridGCNFunction.apply(h, weight, bias, block, links, input_grad, aggregated)


def grid_logits(x: torch.Tensor | None, params: list[tuple[torch.Tensor, ...]],
                blocks: list[AdjacencyBlock], grid: ProcessGrid,
                first_aggregation: torch.Tensor | None = None, layer_fn: Callable[..., torch.Tensor] = gcn_layer,
                dropout: Any = None, links: Callable[[int], GridLinks] | None = None) -> torch.Tensor:
    """The model's output block ``[d, o]`` of its last layer from layer 0's ``X[o, i]``, or from its aggregation
    ``first_aggregation`` computed once (:func:`aggregate_input`; ``x`` is then not read): each layer's
    ``layer_fn`` (:func:`gcn_layer`, or :func:`sparse_dist.grid_sage.sage_layers`; ``params[l]`` its weight
    blocks and ``b[o]``, ``blocks[l % 3]`` its rotation), :class:`GridReLU` between layers. ``dropout`` (training
    only, e.g. :class:`algorithms.grid_dropout.GridDropout`): ``drop(layer, h)`` masks each layer's input block and
    ``scale`` multiplies the weight blocks; layer 0's input then changes every step, so it cannot come aggregated
    once. ``links(layer)``: how each layer's allreduces travel (default exact; a training step's may be coded,
    :mod:`sparse_dist.grid_links`). Collective over the grid."""
    if dropout is not None and first_aggregation is not None:
        raise ValueError("layer 0's aggregation cannot be computed once under dropout: its input is masked anew "
                         "every step")
    h = x
    for layer, layer_params in enumerate(params):
        cached = first_aggregation if layer == 0 else None
        if dropout is not None:
            assert h is not None
            h = dropout.drop(layer, h)
            layer_params = tuple(w * dropout.scale for w in layer_params[:-1]) + (layer_params[-1],)
        layer_links = links(layer) if links is not None else GridLinks(grid, layer)
        h = layer_fn(h, layer_params, blocks[layer % 3], layer_links, layer > 0, cached)
        if layer < len(params) - 1:
            h = GridReLU.apply(h)
    return h


def predicted_classes(logits: torch.Tensor, class_lo: int, grid: ProcessGrid, layer: int) -> torch.Tensor:
    """Each output row's argmax over all classes (the lowest class id among ties), from logits split over
    ``(d, o)``: two allreduces of ``n_d`` values over ``o`` (phase ``other``: evaluation)."""
    outer = roles(layer)[0]
    rows, width = logits.shape
    best = (logits.max(dim=1).values if width else logits.new_full((rows,), -math.inf)).contiguous()
    allreduce_pieces(grid.axis_comm[outer], best, "other", op="max")
    if width:
        hits = logits == best[:, None]
        first = torch.where(hits.any(dim=1), hits.int().argmax(dim=1).to(logits.dtype) + class_lo,
                            logits.new_full((rows,), math.inf))
    else:
        first = logits.new_full((rows,), math.inf)
    first = first.contiguous()
    allreduce_pieces(grid.axis_comm[outer], first, "other", op="min")
    return first.long()


def predicted_layer_bytes(grid: ProcessGrid, layer: int, nodes: int, width_in: int, width_out: int,
                          itemsize: int, input_grad: bool, aggregated_once: bool = False,
                          terms: int = 1) -> dict[str, int]:
    """Bytes this rank sends (and receives) in ``layer``'s forward, backward and gradient allreduce (a step's;
    with ``aggregated_once`` the aggregation is :func:`predicted_input_bytes`, once a run; ``terms``: see
    :func:`layer_collectives`)."""
    return layer_bytes(grid.shape, grid.coords, layer, nodes, width_in, width_out, itemsize, input_grad,
                       aggregated_once, terms)


def predicted_input_bytes(grid: ProcessGrid, nodes: int, width_in: int, itemsize: int, terms: int = 1) -> int:
    """Bytes this rank sends in :func:`aggregate_input` (phase ``halo``, once a run)."""
    return input_bytes(grid.shape, grid.coords, nodes, width_in, itemsize, terms)


def input_bytes(shape: GridShape, coords: Mapping[str, int], nodes: int, width_in: int, itemsize: int,
                terms: int = 1) -> int:
    """:func:`predicted_input_bytes` of the rank at ``coords`` of a ``shape`` grid, without a communicator."""
    outer, inner, depth = roles(0)
    n_depth = _length(block_range(nodes, shape.of(depth), coords[depth]))
    f_inner = _length(block_range(width_in, shape.of(inner), coords[inner]))
    return pieces_bytes(n_depth * terms * f_inner, shape.of(outer), coords[outer], itemsize)  # exact, once a run


def predicted_loss_bytes(grid: ProcessGrid, layer: int, nodes: int, itemsize: int) -> int:
    """Bytes this rank sends in :class:`GridCrossEntropy` (phase ``forward``) on the output of ``layer``."""
    return loss_bytes(grid.shape, grid.coords, layer, nodes, itemsize)


def layer_bytes(shape: GridShape, coords: Mapping[str, int], layer: int, nodes: int, width_in: int, width_out: int,
                itemsize: int, input_grad: bool, aggregated_once: bool = False, terms: int = 1,
                codec: Codec | None = None) -> dict[str, int]:
    """:func:`predicted_layer_bytes` of the rank at ``coords`` of a ``shape`` grid, without a communicator
    (the cost model asks it of grids it cannot build); ``codec``: a training step's messages coded
    (:mod:`sparse_dist.grid_links`)."""
    out = {"forward": 0, "backward": 0, "grad_allreduce": 0}
    for sent in layer_collectives(shape, coords, layer, nodes, width_in, width_out, input_grad, aggregated_once,
                                  terms):
        out[sent.phase] += allreduce_message_bytes(codec, sent.message, shape.of(sent.axis), coords[sent.axis],
                                                   sent.rows, sent.width, itemsize)
    return out


def step_bytes(shape: GridShape, coords: Mapping[str, int], nodes: int, dims: tuple[int, ...] | list[int],
               itemsize: int, terms: int = 1, input_once: bool = True, codec: Codec | None = None) -> dict[str, int]:
    """Bytes the rank at ``coords`` sends in one training step of widths ``dims``, by phase: ``forward`` (the
    layers' and the loss's), ``backward`` and ``grad_allreduce``; ``input_once``: layer 0's aggregation computed
    once a run (without dropout), not in the step; ``codec``: the step's messages coded. One sum for the trainer,
    ``bench grid`` and the cost model."""
    out = {"forward": loss_bytes(shape, coords, len(dims) - 2, nodes, itemsize), "backward": 0, "grad_allreduce": 0}
    for layer in range(len(dims) - 1):
        for phase, value in layer_bytes(shape, coords, layer, nodes, dims[layer], dims[layer + 1], itemsize,
                                        layer > 0, aggregated_once=layer == 0 and input_once, terms=terms,
                                        codec=codec).items():
            out[phase] += value
    return out


def loss_bytes(shape: GridShape, coords: Mapping[str, int], layer: int, nodes: int, itemsize: int) -> int:
    """:func:`predicted_loss_bytes` of the rank at ``coords`` of a ``shape`` grid, without a communicator."""
    return sum(pieces_bytes(sent.numel, shape.of(sent.axis), coords[sent.axis], itemsize)
               for sent in loss_collectives(shape, coords, layer, nodes))


class Collective(NamedTuple):
    """One allreduce of a step on one rank: its phase, axis, ``rows x width`` values and its name for
    :class:`~sparse_dist.grid_links.GridLinks` (:data:`~sparse_dist.grid_links.MESSAGES`)."""

    phase: str
    axis: str
    rows: int
    width: int
    message: str

    @property
    def numel(self) -> int:
        return self.rows * self.width


def layer_collectives(shape: GridShape, coords: Mapping[str, int], layer: int, nodes: int, width_in: int,
                      width_out: int, input_grad: bool, aggregated_once: bool = False,
                      terms: int = 1) -> list[Collective]:
    """The allreduces :class:`GridGCNFunction` runs for ``layer`` on the rank at ``coords`` in a step, in order
    (module docstring); ``aggregated_once``: without the aggregation's, computed once
    (:func:`aggregate_input`). ``terms``: the aggregated terms side by side, each ``f_i`` wide, that the layer
    multiplies by its stacked weights (GCN 1; SAGE 2, :mod:`sparse_dist.grid_sage`): the aggregation, its
    gradient and the weights' gradient carry ``terms`` times the columns."""
    if aggregated_once and layer:
        raise ValueError(f"only layer 0's aggregation is computed once (its input does not change), not layer {layer}'s")
    outer, inner, depth = roles(layer)
    n_depth = _length(block_range(nodes, shape.of(depth), coords[depth]))
    n_outer = _length(block_range(nodes, shape.of(outer), coords[outer]))
    f_inner = _length(block_range(width_in, shape.of(inner), coords[inner]))
    f_out = _length(block_range(width_out, shape.of(outer), coords[outer]))
    out = [] if aggregated_once else [Collective("forward", outer, n_depth, terms * f_inner, "aggregation")]
    out += [Collective("forward", inner, n_depth, f_out, "combination"),
            Collective("grad_allreduce", depth, 1, terms * f_inner * f_out + f_out, "weight_gradient")]
    if input_grad:
        out += [Collective("backward", outer, n_depth, terms * f_inner, "aggregation_gradient"),
                Collective("backward", depth, n_outer, f_inner, "input_gradient")]
    return out


def loss_collectives(shape: GridShape, coords: Mapping[str, int], layer: int,
                     nodes: int) -> list[Collective]:
    """The allreduces of :class:`GridCrossEntropy` on the output of ``layer`` (all phase ``forward``): max, sum of
    exponentials and the label's logit of each of the rank's ``n_d`` rows over ``o``, the loss over ``d``."""
    outer, _, depth = roles(layer)
    n_depth = _length(block_range(nodes, shape.of(depth), coords[depth]))
    return [Collective("forward", outer, n_depth, 1, "loss")] * 3 + [Collective("forward", depth, 1, 1, "loss")]


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


__all__ = ["AdjacencyBlock", "Collective", "GridCrossEntropy", "GridGCNFunction", "GridReLU", "adjacency_blocks",
           "aggregate_input", "aggregation_gradient", "as_blocks", "bias_block", "block_range", "combine",
           "gcn_layer", "grid_logits", "input_block", "input_bytes", "kept_aggregation", "layer_bytes", "layer_collectives",
           "loss_bytes", "loss_collectives", "output_classes", "output_rows", "parameter_gradients",
           "predicted_classes", "predicted_input_bytes", "predicted_layer_bytes", "predicted_loss_bytes",
           "sparse_product", "step_bytes", "weight_block"]
