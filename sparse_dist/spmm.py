"""Distributed SpMM ``T = A H`` and its transpose, with an autograd interface.

:class:`DistSpMM` binds a :class:`~sparse_dist.dcsr.DistCSR` to one exchange
plan (:mod:`sparse_dist.plans`: how bytes move), a dtype and a device. Its
:class:`~sparse_dist.partial.PartialSpMM` (``partial``) posts the plan's flights and
overlaps them with the block products, giving this rank's partial result over
its replica column. On the 1.5D grid DistSpMM completes that partial
result across the ``c`` replicas of the row group: an allreduce of ``T_g``
after the forward, and a broadcast of ``dH_g`` from the replica that owns
block ``g`` after the transpose (only that replica holds a non-zero ``dH_g``,
so a broadcast moves less than an allreduce would). What its training exchanges keep between calls
(a pipelined strategy's flights, gradient flights held until told, the strategy's caches) is its
:class:`~sparse_dist.lifecycle.ExchangeLifecycle` (``lifecycle``), which a trainer drives.

Shapes: ``H`` and ``dT`` are this rank's ``n_g x F`` rows (``n_g`` rows of its
row group, the same on every replica), ``F`` equal on every rank.

Collective: :meth:`DistSpMM.forward`, :meth:`DistSpMM.transpose` and calls of
the module itself must be entered by every rank, in the same order. Argument
checks on this hot path are local; a rank that raises ends the whole job
through :func:`sparse_dist.comm.run_or_abort`.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from sparse_dist.accounting import ComputeTimer
from sparse_dist.compress import Codec
from sparse_dist.dcsr import DistCSR
from sparse_dist.exchange import BoundarySampler, ExchangeContext, ExchangeStrategy, StalenessRule
from sparse_dist.exchange_plan import ExchangePlan
from sparse_dist.factory import make_plan, make_strategy
from sparse_dist.lifecycle import ExchangeLifecycle
from sparse_dist.partial import PartialSpMM


class DistSpMM:
    """``T = A H`` (forward) and ``dH = A^T dT`` (transpose) with one exchange plan."""

    def __init__(self, matrix: DistCSR, plan: str = "p2p", *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", sampler: BoundarySampler | None = None,
                 staleness: StalenessRule | None = None, strategy: ExchangeStrategy | None = None,
                 row_masks: bool = False, codec: Codec | None = None) -> None:
        """``strategy`` decides what training exchanges carry; by default the one ``sampler`` and
        ``staleness`` make (:func:`~sparse_dist.factory.make_strategy`; exact when both are None).
        ``row_masks``: training calls may carry receiver-side dropout (``ExchangeContext.dropout``).
        ``codec``: compress what training exchanges send (None: no compression)."""
        self.matrix = matrix
        self.dtype = dtype
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.timer = ComputeTimer()
        if strategy is None:
            strategy = make_strategy(sampler, staleness)
        self.plan: ExchangePlan = make_plan(plan, matrix, dtype, self.device, self.timer, strategy,
                                            row_masks=row_masks)
        self.plan.codec = codec  # compresses the training exchanges' rows and gradients (sparse_dist.compress)
        self.partial = PartialSpMM(self.plan)  # this rank's part over its replica column: flights and products
        self.lifecycle = ExchangeLifecycle(self.plan)  # what training exchanges keep between calls
        self._replicated = matrix.grid.replication > 1
        self._owner_replica = matrix.grid.replica_for_block(matrix.group)

    def _check(self, x: torch.Tensor, what: str) -> torch.Tensor:
        expected_rows = self.matrix.lshape[0]
        if x.dim() != 2 or x.shape[0] != expected_rows:
            raise ValueError(f"{what} must have shape ({expected_rows}, F) on rank {self.matrix.comm.rank}, "
                             f"got {tuple(x.shape)}")
        if x.dtype != self.dtype or x.device != self.device:
            raise TypeError(f"{what} must be {self.dtype} on {self.device}, got {x.dtype} on {x.device}")
        return x.contiguous()

    def forward(self, h: torch.Tensor, phase: str = "forward", context: ExchangeContext | None = None) -> torch.Tensor:
        """``T_g = sum_j A_gj H_j`` for this rank's rows (collective).

        With a training ``context`` the plan consults its policies (sampling,
        staleness); without one, or when evaluating, the product is exact. A context with
        ``dropout`` makes it ``A (M * H)``: ``H`` travels pre-dropout and every rank masks the rows it
        multiplies (receiver-side dropout).
        """
        out = self.partial.forward(self._check(h, "H"), phase, context)
        if self._replicated:
            self.matrix.row_comm.allreduce_(out, phase)
        return out

    def transpose(self, dt: torch.Tensor, phase: str = "backward",
                  context: ExchangeContext | None = None) -> torch.Tensor:
        """``dH_g = sum_i A_ig^T dT_i`` for this rank's rows (collective); mirrors the forward of ``context``.

        Under receiver-side dropout the owner masks the summed gradient of its rows once
        (``M_g * sum_i A_ig^T dT_i``: every receiver's mask of a row is the same), so the pieces travel
        unmasked.
        """
        out = self.partial.transpose(self._check(dt, "dT"), phase, context)
        if self._replicated:
            self.matrix.row_comm.bcast_(out, root=self._owner_replica, phase=phase)
        self.partial.dropout.own_gradient_(out, context)
        return out

    @property
    def strategy(self) -> ExchangeStrategy:
        """What this operator's training exchanges carry (and the per-rank state that needs); a trainer goes
        through :attr:`lifecycle` instead."""
        return self.plan.strategy

    def compute_seconds(self) -> dict[str, float]:
        """Seconds of local compute booked since the last :meth:`reset_compute` (local SpMM, and what callers book)."""
        return self.timer.seconds

    def reset_compute(self) -> None:
        self.timer.reset()

    def __call__(self, h: torch.Tensor, context: ExchangeContext | None = None) -> torch.Tensor:
        """Autograd-aware ``A @ H``: its backward is :meth:`transpose` with the same context."""
        return _SpMMFunction.apply(h, self, context)


class _SpMMFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: torch.Tensor, op: DistSpMM,  # type: ignore[override]
                context: ExchangeContext | None) -> torch.Tensor:
        # the transpose needs no way to unmask this layer's input: dropping it lets that input (the layer
        # below's output, n_g x F) go when nothing else keeps it, instead of living to the end of the backward
        kept = context if context is None or context.unmasked is None else replace(context, unmasked=None)
        ctx.op, ctx.context = op, kept  # type: ignore[attr-defined]
        return op.forward(h, context=context)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        return ctx.op.transpose(grad_out.contiguous(), context=ctx.context), None, None  # type: ignore[attr-defined]
