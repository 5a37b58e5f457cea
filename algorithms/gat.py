"""Graph attention (GAT, Velickovic et al. 2018) over the distributed exchange (DESIGN section 5, issue 16).

One layer, ``K`` heads of width ``F'``; rows ``i`` are this rank's (destinations), ``j`` their
sources, i.e. the stored entries ``(i, j)`` of row ``i`` (its in-edges, as in ``T = A H``)::

    Z   = H W                                        n x K F'      (W: F_in x K F')
    s_j = <Z_j^k, a_src^k>,  d_i = <Z_i^k, a_dst^k>   per head: source and destination terms
    e_ij = LeakyReLU(s_j + d_i, 0.2)                 per stored entry and head (an SDDMM on the rows)
    alpha_ij = w_ij exp(e_ij) / sum_l w_il exp(e_il)  softmax over the row's entries (w: see below)
    H'_i = concat_k (hidden layers) or mean_k (output layer) of sum_j drop(alpha_ij) Z_j, plus b

Adjacency (:func:`attention_adjacency`): the structure of the raw rows with self-loops as PyG's
``GATConv`` makes them (every existing loop removed, one added per node), all weights 1; so every
row has at least its loop and isolated nodes attend to themselves. Directed graphs are exact: a row
attends over its stored entries, nothing is symmetrised.

Exchange (one per layer, :func:`~sparse_dist.autograd_comm.exchange_rows`): the owner computes
``Z`` and ``s`` of its rows and the plan moves ``[Z | s]`` (``K F' + K`` columns) exactly as an SpMM
moves ``H`` (every plan, every policy); ``d`` stays home. The softmax of a row needs only the row's
own entries, all on its owner, so it costs no communication in 1D. The backward sends the
gradients of ``[Z | s]`` of the boundary rows back to their owners
(:meth:`~sparse_dist.plans.ExchangePlan.scatter`), the same bytes as the forward. Under
receiver-side dropout (``ExchangeContext.dropout``) the exchange must carry the layer input ``H``
itself (``F_in`` columns, pre-dropout; the receivers mask it and compute ``Z`` and ``s`` of the
rows they received), as :func:`algorithms.layers.propagate` does for the SpMM layers.

1.5D (``--replication c``): replica ``r`` of a row group attends over its column share of the
sources only. The softmax is combined exactly: the row maxima are agreed first (allreduce ``max``
over the ``c`` replicas, ``n x K``), every replica shifts by the agreed maximum, and the partial
numerators and denominators ``[N | D]`` (``n x (K F' + K)``) are summed (allreduce), so
``N / D`` is the softmax over all of the row's entries. In the backward every input of the
replica-partial part (the layer input ``H`` where it needs a gradient, ``W``, ``a_src``,
``a_dst``) has its gradient summed over the replicas in one allreduce, so every replica holds
the whole gradient, as the trainer's allreduce over one replica column expects.

Boundary sampling (``bns``): a sampled block's kept columns carry ``w = 1/p`` (inner entries,
the loop among them, are never sampled, ``w = 1``), and the softmax is weighted by ``w``.
The numerator ``sum_j w_ij exp(e_ij) Z_j`` and the denominator ``sum_j w_ij exp(e_ij)`` are then
each unbiased for their exact values; their ratio, the layer output, is a ratio estimator:
consistent, biased at finite degree (the bias shrinks as ``1/degree``), exact at ``p = 1``.
Simply renormalising over the kept entries (``w = 1``) would be biased even in expectation of
each sum: it shrinks the boundary's share of every softmax by ``p``.

Staleness (SANCUS, pipelined): stale or cached ``[Z | s]`` rows of an owner stand in for fresh
ones, exactly as stale ``H`` rows do in an SpMM; the gradients of stale rows go back to their
owner unless the rule skips them (``skip_backward``).

Layer 0 from a static halo (``--input-exchange once``): the rank holds its own rows of ``X``
followed by the halo rows it referenced, masks them itself, computes ``Z`` and ``s`` of all of
them and attends over its own and halo entries locally: no exchange, forward or backward.

Where the parts live: the local kernel (logits, weighted softmax, aggregation, attention dropout)
in :mod:`algorithms.attention`; the entries it works on, cached with the operator, in
:mod:`algorithms.attention_structure`; the exchange and the replica sums inside autograd in
:mod:`sparse_dist.autograd_comm`. This module is the layer: parameters, projections, and the order of
those calls.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import nn

from algorithms.attention import attend, dropped_entries
from algorithms.attention_structure import AttentionEdges, cached_edges
from algorithms.dropout import KeepRule
from algorithms.layers import GraphLayer, LayerOptions, glorot, register_layer
from sparse_dist.accounting import ComputeTimer
from sparse_dist.autograd_comm import (exchange_rows, replica_max_agreement, sum_gradients_over_replicas,
                                       sum_over_replicas)
from sparse_dist.comm import Communicator
from sparse_dist.csr import entry_rows
from sparse_dist.exchange import ExchangeContext
from sparse_dist.halo import StaticHalo
from sparse_dist.layout import RowLayout
from sparse_dist.spmm import DistSpMM

__all__ = ["GATLayer", "attention_adjacency"]

NEGATIVE_SLOPE = 0.2


def attention_adjacency(rows: sp.csr_matrix, first_row: int) -> sp.csr_matrix:
    """The attention structure of raw rows (global column ids; row ``k`` is node ``first_row + k``).

    Every existing self-loop removed, duplicates merged, every weight set to 1, then one loop per
    row (PyG ``GATConv``'s ``remove_self_loops`` + ``add_self_loops``). Purely local. float64 CSR.
    """
    rows = sp.csr_matrix(rows, dtype=np.float64, copy=True)
    rows.sum_duplicates()
    n = rows.shape[0]
    row_of_entry = entry_rows(rows.indptr)
    rows.data = np.where(rows.indices == row_of_entry + first_row, 0.0, 1.0)
    rows.eliminate_zeros()
    loops = sp.csr_matrix((np.ones(n), (np.arange(n), np.arange(n) + first_row)), shape=rows.shape)
    result = sp.csr_matrix(rows + loops)
    result.sort_indices()
    return result


@register_layer
class GATLayer(GraphLayer):
    """Multi-head graph attention; parameters ``[weight, att_src, att_dst, bias]``.

    ``fan_out`` (the output width) is ``heads * head_width`` when ``concat`` (hidden layers),
    ``head_width`` when the heads are averaged (the output layer). Weights: ``W`` (``fan_in x K F'``),
    ``a_src`` and ``a_dst`` (``K x F'``), Glorot-uniform in that order (``a``: fans ``K`` and ``F'``,
    as PyG's ``glorot`` of its ``1 x K x F'`` parameters); bias zero.
    """

    kind = "gat"
    activation = "elu"
    takes_operator = True
    takes_options = True

    def __init__(self, fan_in: int, head_width: int, *, generator: torch.Generator,
                 dtype: torch.dtype = torch.float32, heads: int = 1, concat: bool = True,
                 attention_dropout: float = 0.0, seed: int = 0, negative_slope: float = NEGATIVE_SLOPE) -> None:
        if heads < 1 or head_width < 1:
            raise ValueError(f"a GAT layer needs heads >= 1 and head width >= 1, got {heads} and {head_width}")
        KeepRule.of(attention_dropout)  # refuses a probability outside [0, 1)
        super().__init__(fan_in, heads * head_width if concat else head_width)
        self.heads, self.head_width, self.concat = heads, head_width, concat
        self.attention_dropout, self.seed, self.negative_slope = attention_dropout, seed, negative_slope
        self.weight = nn.Parameter(glorot(generator, fan_in, heads * head_width).to(dtype))
        self.att_src = nn.Parameter(glorot(generator, heads, head_width).to(dtype))
        self.att_dst = nn.Parameter(glorot(generator, heads, head_width).to(dtype))
        self.bias = nn.Parameter(torch.zeros(self.fan_out, dtype=dtype))

    @classmethod
    def build(cls, fan_in: int, fan_out: int, *, generator: torch.Generator, dtype: torch.dtype, last: bool,
              seed: int, options: LayerOptions) -> "GATLayer":
        """Hidden layers concatenate ``options.heads`` heads of width ``fan_out``; the last layer averages
        ``options.output_heads`` heads of width ``fan_out``."""
        return cls(fan_in, fan_out, generator=generator, dtype=dtype,
                   heads=options.output_heads if last else options.heads, concat=not last,
                   attention_dropout=options.attention_dropout, seed=seed)

    @classmethod
    def normalize_adjacency(cls, comm: Communicator, layout: RowLayout, rows: sp.csr_matrix,
                            group: int) -> sp.csr_matrix:
        """:func:`attention_adjacency` of the rows. Purely local (not collective)."""
        return attention_adjacency(rows, layout.offsets[group])

    @staticmethod
    def _heads(last: bool, options: LayerOptions) -> int:
        return options.output_heads if last else options.heads

    @classmethod
    def output_width(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions) -> int:
        """Hidden layers concatenate their heads (``heads x fan_out``); the last averages them (``fan_out``)."""
        return fan_out if last else options.heads * fan_out

    @classmethod
    def parameter_count(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions) -> int:
        """``W`` (``fan_in x K F'``), ``a_src`` and ``a_dst`` (``K x F'`` each) and a bias of the output width."""
        heads = cls._heads(last, options)
        return fan_in * heads * fan_out + 2 * heads * fan_out + cls.output_width(fan_in, fan_out, last=last,
                                                                                  options=options)

    @classmethod
    def dense_work(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions) -> int:
        """``H W`` over all heads, then the source and destination terms."""
        heads = cls._heads(last, options)
        return fan_in * heads * fan_out + 2 * heads * fan_out

    @classmethod
    def edge_values(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions) -> int:
        """Per head: the logits, their exponentials, the weights, the dropout mask and the gradients' terms (6)."""
        return 6 * cls._heads(last, options)

    @classmethod
    def exchange_columns(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions,
                         receiver: bool) -> tuple[int, bool]:
        """``[Z | s]`` (``K F' + K`` columns) travels and its gradient returns; under receiver-side dropout the
        input (which needs no gradient in layer 0)."""
        heads = cls._heads(last, options)
        return (fan_in, False) if receiver else (heads * fan_out + heads, True)

    def exchange_shape(self, receiver: bool) -> tuple[int, bool]:
        """:meth:`exchange_columns` of this layer's own heads (hidden or output, the same formula)."""
        return type(self).exchange_columns(self.fan_in, self.head_width, last=False,
                                           options=LayerOptions(heads=self.heads), receiver=receiver)

    @property
    def needs_source_ids(self) -> bool:
        return self.attention_dropout > 0

    def forward(self, h: torch.Tensor, spmm: Any, context: ExchangeContext,
                weight_scale: float = 1.0) -> torch.Tensor:
        """This rank's rows of ``H'`` from its rows ``h`` (followed by its halo rows in halo mode).

        ``spmm``: the operator itself (``takes_operator``): a :class:`~sparse_dist.spmm.DistSpMM`, or
        for layer 0 read from a static halo the :class:`~sparse_dist.halo.StaticHalo`.
        Collective over the plan's replica column (one gather, its scatter in the backward) and, on the
        1.5D grid, over the row group's replicas; nothing in halo mode.
        """
        weight = self.weight * weight_scale if weight_scale != 1.0 else self.weight
        if isinstance(spmm, StaticHalo):  # (a halo may hold no rows: context.halo_rows can be 0)
            return self._from_halo(h, spmm, context, weight)
        return self._exchanged(h, spmm, context, weight)

    def _from_halo(self, h: torch.Tensor, halo: StaticHalo, context: ExchangeContext,
                   weight: torch.Tensor) -> torch.Tensor:
        """Layer 0 over own and halo rows (``h``: ``(n + count) x F_in``, masked by the model); local."""
        plan, n = halo.plan, halo.own_count
        first = int(plan.matrix.layout.offsets[plan.group])
        z = h @ weight
        s = self._terms(z, self.att_src)
        d = self._terms(z[:n], self.att_dst)
        edges = cached_edges(halo, [halo.own_block, halo.halo_block], n, [range(first, first + n), halo.halo_ids],
                             z.dtype, z.device)
        return self._attend(z, s, d, edges, first, context, plan.timer, None)

    def _exchanged(self, h: torch.Tensor, op: DistSpMM, context: ExchangeContext,
                   weight: torch.Tensor) -> torch.Tensor:
        """One gather of ``[Z | s]`` (or of ``h`` under receiver-side dropout), then attention over the own
        block and the gathered parts (``h``: this rank's ``n_g x F_in`` rows). Collective (see :meth:`forward`)."""
        plan, matrix = op.plan, op.matrix
        replicas = matrix.row_comm if matrix.grid.replication > 1 else None
        att_src, att_dst = self.att_src, self.att_dst
        if replicas is not None:  # every input of the replica-partial part: gradients summed over replicas
            h, weight, att_src, att_dst = sum_gradients_over_replicas(replicas, h, weight, att_src, att_dst)
        n = h.shape[0]
        first = int(matrix.layout.offsets[matrix.group])
        own_block = matrix.blocks[plan.group] if plan.local_block is not None else None
        if context.dropout is not None:  # receiver-side dropout: H travels, every rank masks and projects
            own = context.self_rows(h)
            received, parts = exchange_rows(h.contiguous(), op.partial, context)
            sources = torch.cat([own, received]) if own_block is not None else received
            z = sources @ weight
            s = self._terms(z, att_src)
            d = self._terms(z[:n] if own_block is not None else own @ weight, att_dst)
        else:
            z_own = h @ weight
            send = torch.cat([z_own, self._terms(z_own, att_src)], 1)
            d = self._terms(z_own, att_dst)
            received, parts = exchange_rows(send, op.partial, context)
            both = torch.cat([send, received]) if own_block is not None else received
            z, s = both[:, :-self.heads], both[:, -self.heads:]
        blocks = ([own_block] if own_block is not None else []) + [item.block for item in parts]
        ids = ([range(first, first + n)] if own_block is not None else []) + [item.global_rows for item in parts]
        edges = cached_edges(op, blocks, n, ids, z.dtype, z.device)
        return self._attend(z, s, d, edges, first, context, op.timer, replicas)

    def _terms(self, z: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """Per-head ``<Z^k, a^k>`` of ``z`` (``rows x K F'``): ``rows x K``."""
        return (z.view(z.shape[0], self.heads, self.head_width) * att).sum(2)

    def _attend(self, z: torch.Tensor, s: torch.Tensor, d: torch.Tensor, edges: AttentionEdges, first_row: int,
                context: ExchangeContext, timer: ComputeTimer | None,
                replicas: Communicator | None) -> torch.Tensor:
        """``N`` and ``D`` over ``edges`` (summed over replicas where given), then the heads' output + bias."""
        dropped, scale = (dropped_entries(edges, first_row, self.seed, context.epoch, context.layer, self.heads,
                                          self.attention_dropout, timer) if context.training else (None, 1.0))
        numerator, denominator = attend(z, s, d, edges, self.negative_slope, dropped, scale,
                                        replica_max_agreement(replicas), timer)
        if replicas is not None:
            width = self.heads * self.head_width
            both = sum_over_replicas(torch.cat([numerator.reshape(edges.n, width), denominator], 1), replicas)
            numerator, denominator = both.split([width, self.heads], 1)
            numerator = numerator.reshape(edges.n, self.heads, self.head_width)
        out = numerator / denominator.clamp_min(torch.finfo(denominator.dtype).tiny).unsqueeze(2)
        out = out.reshape(edges.n, self.heads * self.head_width) if self.concat else out.mean(1)
        return out + self.bias

    def extra_repr(self) -> str:
        return (f"{self.fan_in}, {self.head_width}, heads={self.heads}, "
                f"{'concat' if self.concat else 'mean'}, attention_dropout={self.attention_dropout}")
