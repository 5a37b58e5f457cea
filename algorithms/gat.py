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

Exchange (one per layer, :meth:`~sparse_dist.partial.PartialSpMM.gather`): the owner computes
``Z`` and ``s`` of its rows and the plan moves ``[Z | s]`` (``K F' + K`` columns) exactly as an SpMM
moves ``H`` (every plan, every policy); ``d`` stays home. The softmax of a row needs only the row's
own entries, all on its owner, so it costs no communication in 1D. The backward sends the
gradients of ``[Z | s]`` of the boundary rows back to their owners
(:meth:`~sparse_dist.partial.PartialSpMM.scatter`), the same bytes as the forward. Under
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

Attention dropout (:func:`attention_keep`): the kept entries of ``alpha`` are decided per
(seed, epoch, layer, global row, global column, head) with a counter-based hash (splitmix64, on
the tensors' device: two 64-bit words per entry for 8 heads), so they do not depend on ``P``, and
are scaled like input dropout (``2^16 / T``; :class:`algorithms.dropout.KeepRule`).

Memory (attention state per stored entry, float32, ``K`` heads): the forward keeps nothing per
entry and head for the backward but the 1-byte mask of attention dropout (``K`` bytes, only with
attention dropout); the backward recomputes the logits and softmax weights. Per entry the layer
caches its structure with the operator (shared by the layers that use it) while the blocks are the
same objects (across epochs when exact): destination,
source, and the order by source with its destinations (four int64, 32 bytes; plus a float weight
where a sample scales entries), and 8 bytes per row and per source. Inside one call a forward
holds about 2 floats per entry and head in temporaries, a backward about 4.
"""

from __future__ import annotations

import contextlib
import math
import warnings
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import nn

from algorithms.dropout import KeepRule
from algorithms.layers import GraphLayer, LayerOptions, glorot, register_layer
from algorithms.hashing import splitmix64
from sparse_dist.accounting import ComputeTimer
from sparse_dist.comm import Communicator
from sparse_dist.csr import entry_rows
from sparse_dist.exchange import ExchangeContext
from sparse_dist.halo import StaticHalo
from sparse_dist.layout import RowLayout
from sparse_dist.partial import PartialSpMM
from sparse_dist.plans import Gathered
from sparse_dist.spmm import DistSpMM

__all__ = ["GATLayer", "attention_adjacency", "attention_keep", "cached_structure_bytes", "splitmix64_torch"]

NEGATIVE_SLOPE = 0.2
_ATTENTION_DOMAIN = 0x6741_5441  # "gATA": keeps attention streams apart from the other hashed samples


# --------------------------------------------------------------------------- adjacency
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


# --------------------------------------------------------------------------- attention dropout
def _signed(value: int) -> int:
    """A uint64 value as the int64 with the same bits."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)


def _splitmix64_(z: torch.Tensor) -> torch.Tensor:
    """splitmix64 of int64 ``z`` in place (wrapping arithmetic; logical shifts made from torch's arithmetic ones)."""
    z.add_(_GOLDEN)
    shifted = torch.empty_like(z)
    for bits, factor in ((30, _MIX1), (27, _MIX2), (31, None)):
        torch.bitwise_right_shift(z, bits, out=shifted)
        z.bitwise_xor_(shifted.bitwise_and_((1 << (64 - bits)) - 1))
        if factor is not None:
            z.mul_(factor)
    return z


def splitmix64_torch(z: torch.Tensor) -> torch.Tensor:
    """:func:`algorithms.policies.splitmix64` on an int64 tensor (wrapping arithmetic), on its device."""
    return _splitmix64_(z.clone())


def _stream_key(seed: int, epoch: int, layer: int) -> int:
    """``splitmix64`` chained over (seed, domain, epoch, layer), as int64."""
    key = np.array([seed], dtype=np.uint64)
    for word in (_ATTENTION_DOMAIN, epoch, layer):
        key = splitmix64(splitmix64(key) ^ np.array([word], dtype=np.uint64))
    return _signed(int(key[0]))


def attention_keep(seed: int, epoch: int, layer: int, rows: torch.Tensor, entry_rows: torch.Tensor,
                   columns: torch.Tensor, heads: int, p: float) -> torch.Tensor:
    """Keep mask (``heads x E`` bool, on the ids' device) of attention entries ``(rows[entry_rows[e]], columns[e])``.

    ``rows``: global ids of the destination rows (int64, each hashed once); ``entry_rows``: each entry's
    index into ``rows``; ``columns``: each entry's source global id. The rule, with ``sm`` =
    splitmix64 and ``k`` the stream key of (seed, epoch, layer): head ``h`` of entry (row, column)
    reads the 16-bit lane ``h % 4`` (bits ``16 (h % 4)`` up; little-endian memory order) of
    ``sm(sm(row ^ k) ^ column ^ (h // 4) * 0x9E3779B97F4A7C15)`` as a signed ``int16`` ``s`` and is
    kept when ``s + 32768 < T = round((1 - p) 2^16)``, as :mod:`algorithms.dropout` reads its lanes. A pure
    function of
    (seed, epoch, layer, row, column, head): independent of ``P`` and of who computes it.
    """
    rule = KeepRule.of(p)
    keys = _splitmix64_(rows ^ _stream_key(seed, epoch, layer)).index_select(0, entry_rows).bitwise_xor_(columns)
    keep = torch.empty(heads, columns.numel(), dtype=torch.bool, device=columns.device)
    for group in range(-(-heads // 4)):
        lanes = _splitmix64_(keys ^ _signed(group * 0x9E3779B97F4A7C15)).view(torch.int16).view(-1, 4)
        for lane in range(min(4, heads - 4 * group)):
            torch.lt(lanes[:, lane], rule.signed_bound, out=keep[4 * group + lane])
    return keep


# --------------------------------------------------------------------------- edge structure
@dataclass
class _Edges:
    """The stored entries of one attention call: ``n`` destination rows over ``S`` sources, CSR order.

    ``row``/``col``: each entry's destination row and source position (``E`` int64, sorted by row);
    ``crow``: row pointers; ``weight``: the entries' ``w`` (None: all 1); ``order_t``, ``crow_t``,
    ``row_t``: the same entries sorted by source (the transpose's CSR). ``sources``: global id of
    each source (None where unknown). ``pinned``: the blocks it was built from (keeps their ids valid
    as cache keys).
    """

    n: int
    s: int
    crow: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    weight: torch.Tensor | None
    crow_t: torch.Tensor
    row_t: torch.Tensor
    order_t: torch.Tensor
    sources: torch.Tensor | None
    pinned: tuple[Any, ...]

    @property
    def count(self) -> int:
        return int(self.col.numel())

    def nbytes(self) -> int:
        tensors = [self.crow, self.row, self.col, self.weight, self.crow_t, self.row_t, self.order_t, self.sources]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    @staticmethod
    def build(blocks: list[sp.csr_matrix], n: int, source_ids: list[np.ndarray | range | None],
              dtype: torch.dtype, device: torch.device, pinned: tuple[Any, ...]) -> "_Edges":
        """From column blocks (each ``n x S_b``, columns in source order) laid side by side."""
        matrix = sp.hstack(blocks, format="csr") if len(blocks) > 1 else sp.csr_matrix(blocks[0]) if blocks \
            else sp.csr_matrix((n, 0))
        matrix.sort_indices()
        s = matrix.shape[1]
        col = matrix.indices.astype(np.int64)
        row = entry_rows(matrix.indptr)
        order_t = np.argsort(col, kind="stable")
        crow_t = np.concatenate(([0], np.cumsum(np.bincount(col, minlength=s)))).astype(np.int64)
        ones = matrix.nnz == 0 or bool(np.all(matrix.data == 1.0))
        known = all(ids is not None for ids in source_ids)
        sources = (np.concatenate([np.asarray(ids, dtype=np.int64) for ids in source_ids] + [np.empty(0, np.int64)])
                   if known else None)

        def tensor(array: np.ndarray, kind: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=kind)

        return _Edges(n, s, tensor(matrix.indptr), tensor(row), tensor(col),
                      None if ones else tensor(matrix.data, dtype), tensor(crow_t), tensor(row[order_t]),
                      tensor(order_t), None if sources is None else tensor(sources), pinned)


_STRUCTURES: "weakref.WeakKeyDictionary[object, OrderedDict[tuple[Any, ...], _Edges]]" = weakref.WeakKeyDictionary()
"""Attention structures per operator (a ``DistSpMM`` or ``StaticHalo``), shared by the layers that use it
and gone with it: at most :data:`_KEPT` per operator (evaluation's, and this epoch's where a policy
changes the blocks)."""
_KEPT = 4


def _edges_of(operator: object, blocks: list[Any], n: int, source_ids: list[np.ndarray | range | None],
              dtype: torch.dtype, device: torch.device) -> _Edges:
    """The structure of ``blocks`` (scipy or torch CSR) laid side by side, cached with ``operator``.

    Keyed by the blocks' identities (the entry pins them, so an id cannot be reused while cached): the
    exact blocks are the same objects every epoch, a sample's are new ones.
    """
    cache = _STRUCTURES.setdefault(operator, OrderedDict())
    key = (n, device, *(id(block) for block in blocks))
    edges = cache.get(key)
    if edges is None or (edges.sources is None and all(ids is not None for ids in source_ids)):
        scipy_blocks = [b if sp.issparse(b) else _scipy_of(b) for b in blocks]
        edges = cache[key] = _Edges.build(scipy_blocks, n, source_ids, dtype, device, tuple(blocks))
        while len(cache) > _KEPT:
            cache.popitem(last=False)
    cache.move_to_end(key)
    return edges


def cached_structure_bytes(*operators: object) -> int:
    """Bytes of the attention structures cached with ``operators`` on this rank (0 where none)."""
    return sum(edges.nbytes() for op in operators if op is not None for edges in _STRUCTURES.get(op, {}).values())


def _scipy_of(csr: torch.Tensor) -> sp.csr_matrix:
    """A torch sparse CSR tensor as scipy CSR (host copy)."""
    return sp.csr_matrix((csr.values().detach().cpu().numpy(), csr.col_indices().cpu().numpy(),
                          csr.crow_indices().cpu().numpy()), shape=tuple(csr.shape))


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        return torch.sparse_csr_tensor(crow, col, values, size=shape, check_invariants=False)


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
        out[k].addmm_(_csr(crow, col, values[k], (rows, s)), dense[k], beta=0.0, alpha=alpha)
    return out


# --------------------------------------------------------------------------- the local attention
class _Attend(torch.autograd.Function):
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
    def _logits(edges: _Edges, s_t: torch.Tensor, d_t: torch.Tensor) -> torch.Tensor:
        """``s_j + d_i`` of every entry (``K x E``), before the LeakyReLU."""
        return s_t.index_select(1, edges.col).add_(d_t.index_select(1, edges.row))

    @staticmethod
    def _softmax_weights(edges: _Edges, e: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        """``w exp(e - m[row])`` in place of the activated logits ``e``."""
        p = e.sub_(m.index_select(1, edges.row)).exp_()
        return p.mul_(edges.weight) if edges.weight is not None else p

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, s: torch.Tensor, d: torch.Tensor,  # type: ignore[override]
                edges: _Edges, slope: float, dropped: torch.Tensor | None, scale: float, agree_max: Any,
                timer: ComputeTimer | None) -> tuple[torch.Tensor, torch.Tensor]:
        heads = d.shape[1]
        ctx.edges, ctx.slope, ctx.scale, ctx.timer = edges, slope, scale, timer
        s_t, d_t = s.t().contiguous(), d.t().contiguous()
        e = F.leaky_relu_(_Attend._logits(edges, s_t, d_t), slope)
        m = torch.full_like(d_t, -math.inf).scatter_reduce_(1, edges.row.expand_as(e), e, "amax")
        if agree_max is not None:
            agree_max(m)
        p = _Attend._softmax_weights(edges, e, m)
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
        edges: _Edges = ctx.edges
        heads, width = s_t.shape[0], z.shape[1] // s_t.shape[0]
        logits = _Attend._logits(edges, s_t, d_t)
        p = _Attend._softmax_weights(edges, F.leaky_relu(logits, ctx.slope), m)
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
            pattern = _csr(edges.crow, edges.col, p[0], (edges.n, edges.s))  # finite values: beta 0 times them
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


# --------------------------------------------------------------------------- collectives in autograd
class _Exchange(torch.autograd.Function):
    """``received = gather(send)``: the rows this rank receives, parts concatenated (``R x W``).

    The backward scatters each part's row gradients back to their owners and returns, for this
    rank's own rows, the sum that arrived (masked by this rank's own dropout masks under
    receiver-side dropout: the receivers differentiated the masked rows). Collective over the
    plan's replica column, forward and backward. ``parts`` receives the :class:`Gathered` list.
    """

    @staticmethod
    def forward(ctx: Any, send: torch.Tensor, plan: PartialSpMM,  # type: ignore[override]
                context: ExchangeContext, parts: list[Gathered]) -> torch.Tensor:
        parts.extend(plan.gather(send, "forward", context))
        ctx.plan, ctx.context, ctx.parts, ctx.width = plan, context, parts, send.shape[1]
        if not parts:
            return send.new_empty(0, send.shape[1])
        return torch.cat([item.rows for item in parts])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        pieces = list(grad.split([item.rows.shape[0] for item in ctx.parts])) if ctx.parts else []
        own = ctx.plan.scatter(ctx.parts, pieces, ctx.width, "backward", ctx.context)
        if ctx.context.dropout is not None:
            own = own * ctx.context.dropout.own(own)
        return own, None, None, None


class _SumOverReplicas(torch.autograd.Function):
    """Forward: the sum of ``x`` over the replicas of the row group (allreduce). Backward: identity
    (every replica holds the same gradient of the sum)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, replicas: Communicator) -> torch.Tensor:  # type: ignore[override]
        out = x.contiguous().clone()
        replicas.allreduce_(out, "forward")
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return grad, None


class _ReplicaGradients(torch.autograd.Function):
    """Forward: the inputs unchanged. Backward: each input's gradient summed over the replicas of
    the row group (one allreduce of all of them), so every replica holds the whole gradient of
    inputs that each replica used for its share of the sources only."""

    @staticmethod
    def forward(ctx: Any, replicas: Communicator,  # type: ignore[override]
                *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.replicas = replicas
        ctx.shapes = [x.shape for x in inputs]
        ctx.dtype, ctx.device = inputs[0].dtype, inputs[0].device
        return tuple(x.view_as(x) for x in inputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        flat = torch.cat([(g if g is not None else torch.zeros(shape, dtype=ctx.dtype, device=ctx.device)).reshape(-1)
                          for g, shape in zip(grads, ctx.shapes)])
        ctx.replicas.allreduce_(flat, "backward")
        out, offset = [], 0
        for shape in ctx.shapes:
            size = math.prod(shape)
            out.append(flat[offset:offset + size].view(shape))
            offset += size
        return (None, *out)


def _summing_gradients(replicas: Communicator, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` unchanged, those that need a gradient routed through :class:`_ReplicaGradients` (one
    allreduce over ``replicas`` in the backward; every replica needs the same ones, so it is collective)."""
    needing = [x for x in tensors if x.requires_grad]
    summed = iter(_ReplicaGradients.apply(replicas, *needing) if needing else ())
    return [next(summed) if x.requires_grad else x for x in tensors]


# --------------------------------------------------------------------------- the layer
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

    def exchange_shape(self, receiver: bool) -> tuple[int, bool]:
        """``[Z | s]`` travels and its gradient returns; under receiver-side dropout the input (which needs
        no gradient in layer 0)."""
        return (self.fan_in, False) if receiver else (self.heads * self.head_width + self.heads, True)

    @property
    def needs_source_ids(self) -> bool:
        return self.attention_dropout > 0

    def extra_repr(self) -> str:
        return (f"{self.fan_in}, {self.head_width}, heads={self.heads}, "
                f"{'concat' if self.concat else 'mean'}, attention_dropout={self.attention_dropout}")

    # ------------------------------------------------------------------ helpers
    def _terms(self, z: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """Per-head ``<Z^k, a^k>`` of ``z`` (``rows x K F'``): ``rows x K``."""
        return (z.view(z.shape[0], self.heads, self.head_width) * att).sum(2)

    def _attend(self, z: torch.Tensor, s: torch.Tensor, d: torch.Tensor, edges: _Edges, first_row: int,
                context: ExchangeContext, timer: ComputeTimer | None,
                replicas: Communicator | None) -> torch.Tensor:
        """``N`` and ``D`` over ``edges`` (summed over replicas where given), then the heads' output + bias."""
        dropped, scale = None, 1.0
        if context.training and self.attention_dropout > 0 and edges.count:
            if edges.sources is None:
                raise RuntimeError("attention dropout needs the global ids of the received rows: build the "
                                   "exchange plan with row_masks=True (the trainer does for GAT)")
            with _measure(timer, z.device, "masks"):
                rows = torch.arange(first_row, first_row + edges.n, device=edges.row.device)
                dropped = attention_keep(self.seed, context.epoch, context.layer, rows, edges.row,
                                         edges.sources.index_select(0, edges.col), self.heads,
                                         self.attention_dropout).logical_not_()
            scale = KeepRule.of(self.attention_dropout).scale
        agree = (lambda m: replicas.allreduce_(m, "forward", op="max")) if replicas is not None else None
        numerator, denominator = _Attend.apply(z, s, d, edges, self.negative_slope, dropped, scale, agree, timer)
        if replicas is not None:
            width = self.heads * self.head_width
            both = _SumOverReplicas.apply(torch.cat([numerator.reshape(edges.n, width), denominator], 1), replicas)
            numerator, denominator = both.split([width, self.heads], 1)
            numerator = numerator.reshape(edges.n, self.heads, self.head_width)
        out = numerator / denominator.clamp_min(torch.finfo(denominator.dtype).tiny).unsqueeze(2)
        out = out.reshape(edges.n, self.heads * self.head_width) if self.concat else out.mean(1)
        return out + self.bias

    # ------------------------------------------------------------------ forward
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
        edges = _edges_of(halo, [halo.own_block, halo.halo_block], n, [range(first, first + n), halo.halo_ids],
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
            h, weight, att_src, att_dst = _summing_gradients(replicas, h, weight, att_src, att_dst)
        n = h.shape[0]
        first = int(matrix.layout.offsets[matrix.group])
        own_block = matrix.blocks[plan.group] if plan.local_block is not None else None
        parts: list[Gathered] = []
        if context.dropout is not None:  # receiver-side dropout: H travels, every rank masks and projects
            own = context.self_rows(h)
            received = _Exchange.apply(h.contiguous(), op.partial, context, parts)
            sources = torch.cat([own, received]) if own_block is not None else received
            z = sources @ weight
            s = self._terms(z, att_src)
            d = self._terms(z[:n] if own_block is not None else own @ weight, att_dst)
        else:
            z_own = h @ weight
            send = torch.cat([z_own, self._terms(z_own, att_src)], 1)
            d = self._terms(z_own, att_dst)
            received = _Exchange.apply(send, op.partial, context, parts)
            both = torch.cat([send, received]) if own_block is not None else received
            z, s = both[:, :-self.heads], both[:, -self.heads:]
        blocks = ([own_block] if own_block is not None else []) + [item.block for item in parts]
        ids = ([range(first, first + n)] if own_block is not None else []) + [item.global_rows for item in parts]
        edges = _edges_of(op, blocks, n, ids, z.dtype, z.device)
        return self._attend(z, s, d, edges, first, context, op.timer, replicas)
