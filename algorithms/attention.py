"""The local attention kernel of a GAT layer: logits, weighted softmax and aggregation, per head, on one rank.

For ``n`` destination rows over ``S`` sources (:class:`~algorithms.attention_structure.AttentionEdges`),
``K`` heads of width ``F'``, with ``Z`` the sources' projected rows, ``s`` their source terms and ``d`` the
destinations' terms (:mod:`algorithms.gat`)::

    e_ij = LeakyReLU(s_j + d_i)                       per stored entry and head (an SDDMM on the rows)
    N_i  = sum_j drop(w_ij exp(e_ij - m_i)) Z_j       D_i = sum_j w_ij exp(e_ij - m_i)

``m`` the row maxima (agreed over the replicas of the row group where a caller passes ``agree_max``),
``w`` the entries' weights. ``N / D`` is the layer's output before the bias. Purely local: the one
collective a caller may hand in is ``agree_max``.

Attention dropout (:func:`attention_keep`): the kept entries of ``alpha`` are decided per (seed, epoch,
layer, global row, global column, head) with the counter-based hash of :mod:`algorithms.hashing`
(splitmix64, on the tensors' device: two 64-bit words per entry for 8 heads), so they do not depend on
``P``, and are scaled like input dropout (``2^16 / T``; :class:`algorithms.dropout.KeepRule`).

Memory (float32, ``K`` heads): the forward keeps nothing per entry and head for the backward but the
1-byte mask of attention dropout (``K`` bytes, only with attention dropout); the backward recomputes the
logits and softmax weights. Inside one call a forward holds about 2 floats per entry and head in
temporaries, a backward about 4.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from algorithms.attention_structure import AttentionEdges
from algorithms.dropout import KeepRule
from algorithms.dropout_device import keep_signed_lanes
from algorithms.hashing import as_int64, chained_key, splitmix64_torch_
from sparse_dist.accounting import ComputeTimer
from sparse_dist.csr import csr_tensor

__all__ = ["Attend", "attend", "attention_keep", "dropped_entries"]

ATTENTION_DOMAIN = 0x6741_5441  # "gATA": keeps attention streams apart from the other hashed samples


def attention_keep(seed: int, epoch: int, layer: int, rows: torch.Tensor, entry_rows: torch.Tensor,
                   columns: torch.Tensor, heads: int, drop: float) -> torch.Tensor:
    """Keep mask (``heads x E`` bool, on the ids' device) of attention entries ``(rows[entry_rows[e]], columns[e])``.

    ``rows``: global ids of the destination rows (int64, each hashed once); ``entry_rows``: each entry's
    index into ``rows``; ``columns``: each entry's source global id; ``drop``: the drop probability. The
    rule, with ``sm`` = splitmix64 and ``k`` the stream key of (seed, domain, epoch, layer)
    (:func:`~algorithms.hashing.chained_key`): head ``h`` of entry (row, column) reads the 16-bit lane
    ``h % 4`` (bits ``16 (h % 4)`` up; little-endian memory order) of
    ``sm(sm(row ^ k) ^ column ^ (h // 4) * 0x9E3779B97F4A7C15)`` as a signed ``int16`` ``s`` and is kept
    when ``s + 32768 < T = round((1 - drop) 2^16)``, as :mod:`algorithms.dropout` reads its lanes. A pure
    function of (seed, epoch, layer, row, column, head): independent of ``P`` and of who computes it.
    """
    rule = KeepRule.of(drop)
    key = chained_key(seed, ATTENTION_DOMAIN, epoch, layer)
    keys = splitmix64_torch_(rows ^ key).index_select(0, entry_rows).bitwise_xor_(columns)
    keep = torch.empty(heads, columns.numel(), dtype=torch.bool, device=columns.device)
    for group in range(-(-heads // 4)):
        lanes = splitmix64_torch_(keys ^ as_int64(group * 0x9E3779B97F4A7C15)).view(torch.int16).view(-1, 4)
        for lane in range(min(4, heads - 4 * group)):
            keep_signed_lanes(lanes[:, lane], rule.threshold, keep[4 * group + lane])
    return keep


def dropped_entries(edges: AttentionEdges, first_row: int, seed: int, epoch: int, layer: int, heads: int,
                    drop: float, timer: ComputeTimer | None) -> tuple[torch.Tensor | None, float]:
    """The ``heads x E`` mask of the entries attention dropout drops (None where none) and the kept ones' scale.

    ``first_row``: the global id of the first destination row; ``drop``: the drop probability.
    """
    if drop <= 0 or not edges.count:
        return None, 1.0
    if edges.sources is None:
        raise RuntimeError("attention dropout needs the global ids of the received rows: build the "
                           "exchange plan with row_masks=True (the trainer does for GAT)")
    with _measure(timer, edges.row.device, "masks"):
        rows = torch.arange(first_row, first_row + edges.n, device=edges.row.device)
        dropped = attention_keep(seed, epoch, layer, rows, edges.row, edges.sources.index_select(0, edges.col),
                                 heads, drop).logical_not_()
    return dropped, KeepRule.of(drop).scale


def attend(z: torch.Tensor, s: torch.Tensor, d: torch.Tensor, edges: AttentionEdges, slope: float,
           dropped: torch.Tensor | None = None, scale: float = 1.0,
           agree_max: Callable[[torch.Tensor], Any] | None = None,
           timer: ComputeTimer | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``N`` (``n x K x F'``) and ``D`` (``n x K``) over ``edges`` (:class:`Attend`), autograd-aware.

    ``z``: ``S x K F'``; ``s``: ``S x K``; ``d``: ``n x K``; ``dropped``: entries attention dropout drops,
    the kept ones scaled by ``scale``; ``agree_max(m)``: makes the row maxima agree in place (collective
    where given); ``timer`` books the per-head SpMMs as local SpMM."""
    return Attend.apply(z, s, d, edges, slope, dropped, scale, agree_max, timer)


def _per_head_spmm(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, dense: torch.Tensor,
                   rows: int, alpha: float = 1.0) -> torch.Tensor:
    """``out[k] = alpha CSR(crow, col, values[k]) @ dense[k]`` for every head: ``K x rows x F'``.

    ``values``: ``K x E``; ``dense``: ``K x S x F'`` (head-major, contiguous).
    """
    heads, s, width = dense.shape
    out = torch.zeros(heads, rows, width, dtype=dense.dtype, device=dense.device)
    if values.shape[1] == 0 or rows == 0:
        return out
    for k in range(heads):
        out[k].addmm_(csr_tensor(crow, col, values[k], (rows, s)), dense[k], beta=0.0, alpha=alpha)
    return out


class Attend(torch.autograd.Function):
    """Per head: logits of every stored entry, softmax weights (shifted by the agreed row maxima),
    and the aggregation. Returns the numerators ``N`` (``n x K x F'``) and denominators ``D``
    (``n x K``) over this call's entries; ``N / D`` is the layer's (pre-bias) output. Both carry the
    factor ``exp(-m)`` of the row maxima ``m``, which the backward holds constant: exact for ``N / D``
    (independent of ``m``), the only use.

    Saved for the backward: the node-level inputs and, with attention dropout, the ``K x E`` mask of
    dropped entries (``dropped``; the kept ones are scaled by ``scale``); logits and weights are
    recomputed there. ``agree_max(m)`` makes the row maxima (``K x n``,
    in place) the same on every replica of the row group (collective there; a no-op in 1D).
    Entry tensors are head-major (``K x E``) so that each head's weights are one contiguous row.
    """

    @staticmethod
    def _logits(edges: AttentionEdges, s_t: torch.Tensor, d_t: torch.Tensor) -> torch.Tensor:
        """``s_j + d_i`` of every entry (``K x E``), before the LeakyReLU."""
        return s_t.index_select(1, edges.col).add_(d_t.index_select(1, edges.row))

    @staticmethod
    def _softmax_weights(edges: AttentionEdges, e: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """``w exp(e - m[row])`` in place of the activated logits ``e``."""
        p = e.sub_(m.index_select(1, edges.row)).exp_()
        return p.mul_(edges.weight) if edges.weight is not None else p

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, s: torch.Tensor, d: torch.Tensor,  # type: ignore[override]
                edges: AttentionEdges, slope: float, dropped: torch.Tensor | None, scale: float, agree_max: Any,
                timer: ComputeTimer | None) -> tuple[torch.Tensor, torch.Tensor]:
        heads = d.shape[1]
        ctx.edges, ctx.slope, ctx.scale, ctx.timer = edges, slope, scale, timer
        s_t, d_t = s.t().contiguous(), d.t().contiguous()
        e = F.leaky_relu_(Attend._logits(edges, s_t, d_t), slope)
        m = torch.full_like(d_t, -math.inf).scatter_reduce_(1, edges.row.expand_as(e), e, "amax")
        if agree_max is not None:
            agree_max(m)
        p = Attend._softmax_weights(edges, e, m)
        denominator = torch.zeros_like(d_t).index_add_(1, edges.row, p)
        weights = p.masked_fill_(dropped, 0.0) if dropped is not None else p
        z_heads = z.reshape(edges.s, heads, z.shape[1] // heads).transpose(0, 1).contiguous()
        with _measure(timer, z.device):
            numerator = _per_head_spmm(edges.crow, edges.col, weights, z_heads, edges.n, scale)
        ctx.save_for_backward(z, s_t, d_t, m, dropped)
        return numerator.transpose(0, 1).contiguous(), denominator.t().contiguous()

    @staticmethod
    def backward(ctx: Any, grad_numerator: torch.Tensor,  # type: ignore[override]
                 grad_denominator: torch.Tensor) -> tuple[Any, ...]:
        z, s_t, d_t, m, dropped = ctx.saved_tensors
        edges: AttentionEdges = ctx.edges
        heads, width = s_t.shape[0], z.shape[1] // s_t.shape[0]
        logits = Attend._logits(edges, s_t, d_t)
        p = Attend._softmax_weights(edges, F.leaky_relu(logits, ctx.slope), m)
        grad_heads = grad_numerator.transpose(0, 1).contiguous()   # K x n x F'
        z_heads = z.reshape(edges.s, heads, width).transpose(0, 1).contiguous()
        grad_z = None
        if ctx.needs_input_grad[0]:
            weights = p.masked_fill(dropped, 0.0) if dropped is not None else p
            with _measure(ctx.timer, z.device):
                grad_z = _per_head_spmm(edges.crow_t, edges.row_t, weights.index_select(1, edges.order_t),
                                        grad_heads, edges.s, ctx.scale)
            grad_z = grad_z.transpose(0, 1).reshape(edges.s, z.shape[1])
            del weights
        # d loss / d weight of entry (i, j), head k: <dN_i^k, Z_j^k>, an SDDMM on the entries' pattern.
        grad_p = torch.empty_like(p)
        if edges.count and edges.n:
            pattern = csr_tensor(edges.crow, edges.col, p[0], (edges.n, edges.s))  # finite values: beta 0 times them
            with _measure(ctx.timer, z.device):
                for k in range(heads):
                    grad_p[k] = torch.sparse.sampled_addmm(pattern, grad_heads[k], z_heads[k].t(), beta=0.0,
                                                           alpha=ctx.scale).values()
        if dropped is not None:
            grad_p.masked_fill_(dropped, 0.0)
        grad_e = grad_p.add_(grad_denominator.t().contiguous().index_select(1, edges.row)).mul_(p)
        del p
        grad_e = torch.ops.aten.leaky_relu_backward(grad_e, logits, ctx.slope, False)
        grad_s = torch.zeros_like(s_t).index_add_(1, edges.col, grad_e).t() if ctx.needs_input_grad[1] else None
        grad_d = torch.zeros_like(d_t).index_add_(1, edges.row, grad_e).t() if ctx.needs_input_grad[2] else None
        return grad_z, grad_s, grad_d, None, None, None, None, None, None


def _measure(timer: ComputeTimer | None, device: torch.device, name: str = "local_spmm") -> Any:
    """``timer.measure(name)`` (the trainer's breakdown books the per-head SpMMs as local SpMM)."""
    return timer.measure(name, device) if timer is not None else contextlib.nullcontext()
