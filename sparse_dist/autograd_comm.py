"""Collectives inside autograd: exchanges and replica reductions whose backward is the matching collective.

A layer that cannot be written as ``A @ H`` (attention: :mod:`algorithms.gat`) still stays compute only:
it calls these functions where it needs rows of other ranks or sums over the replicas of its row group,
and the communication (forward and backward) happens here, beside :class:`~sparse_dist.spmm.DistSpMM`'s
own autograd function.

Collective: each function is entered by every rank of the communicator it names (the plan's replica
column, or the row group's replicas on the 1.5D grid), in the same order, and so is its backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from sparse_dist.comm import Communicator
from sparse_dist.exchange import ExchangeContext
from sparse_dist.partial import PartialSpMM
from sparse_dist.plans import Gathered

__all__ = ["exchange_rows", "replica_max_agreement", "sum_gradients_over_replicas", "sum_over_replicas"]


def exchange_rows(send: torch.Tensor, flights: PartialSpMM,
                  context: ExchangeContext) -> tuple[torch.Tensor, list[Gathered]]:
    """The rows of ``send`` this rank receives through ``flights`` (a :class:`DistSpMM`'s ``partial``: its plan's
    exchanges; parts concatenated, ``R x W``), and the parts.

    ``send``: this rank's own rows (``n_g x W``). The backward scatters each part's row gradients back to
    their owners and gives ``send`` the sum that arrived for its rows (masked by this rank's own dropout
    masks under receiver-side dropout: the receivers differentiated the masked rows). Collective over the
    plan's replica column, forward and backward.
    """
    parts: list[Gathered] = []
    received = _Exchange.apply(send, flights, context, parts)
    return received, parts


def sum_over_replicas(x: torch.Tensor, replicas: Communicator) -> torch.Tensor:
    """The sum of ``x`` over the replicas of the row group (allreduce; collective over ``replicas``).

    Backward: identity (every replica holds the same gradient of the sum)."""
    return _SumOverReplicas.apply(x, replicas)


def sum_gradients_over_replicas(replicas: Communicator, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` unchanged; in the backward the gradients of those that need one are summed over
    ``replicas`` (one allreduce of all of them), so every replica holds the whole gradient of inputs it
    used for its share of the sources only. Collective over ``replicas`` (every replica passes the same
    tensors needing gradients)."""
    needing = [x for x in tensors if x.requires_grad]
    summed = iter(_ReplicaGradients.apply(replicas, *needing) if needing else ())
    return [next(summed) if x.requires_grad else x for x in tensors]


def replica_max_agreement(replicas: Communicator | None) -> Callable[[torch.Tensor], None] | None:
    """``agree(m)``: replaces ``m`` in place by its elementwise maximum over ``replicas`` (collective there);
    None where there are no replicas (1D). Not differentiated: callers hold the agreed value constant."""
    if replicas is None:
        return None
    return lambda m: replicas.allreduce_(m, "forward", op="max")


class _Exchange(torch.autograd.Function):
    """``received = gather(send)``; backward: ``scatter`` of the parts' gradients (see :func:`exchange_rows`).
    ``parts`` receives the :class:`Gathered` list."""

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
    """Forward: allreduce (sum) over the replicas. Backward: identity."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, replicas: Communicator) -> torch.Tensor:  # type: ignore[override]
        out = x.contiguous().clone()
        replicas.allreduce_(out, "forward")
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return grad, None


class _ReplicaGradients(torch.autograd.Function):
    """Forward: the inputs unchanged. Backward: the inputs' gradients summed over the replicas, one allreduce."""

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
