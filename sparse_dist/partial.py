"""Flight orchestration: this rank's partial ``T = A H`` (and transpose) over its replica column.

:class:`PartialSpMM` drives one plan's exchanges and overlaps them with the block products: it posts
the flight of a call (the plan posts the parts, the strategy says which flight to use: a pipelined one
takes an earlier epoch's), multiplies the local block meanwhile, then multiplies each part as it
arrives (transpose: computes each part's gradient piece, posts the reverse flight, adds what arrives at
the owner). :class:`sparse_dist.spmm.DistSpMM` completes the partial result across the replicas of a
row group on the 1.5D grid.

Overlap: the broadcast plans post the next block's broadcast (reduce) before the current one is
multiplied (prefetch depth 1, the strategy's ``posts_ahead``); ``p2p`` posts its alltoallv and
multiplies the local block meanwhile. How much of a transfer is really hidden depends on the MPI
library's asynchronous progress (e.g. ``MPICH_ASYNC_PROGRESS=1``).

Collective: :meth:`~PartialSpMM.forward`, :meth:`~PartialSpMM.transpose`, :meth:`~PartialSpMM.gather`
and :meth:`~PartialSpMM.scatter` are collective over the plan's replica column; every rank of it calls
them with the same context, in the same order.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from sparse_dist.exchange import ExchangeContext, Flight, Transfer
from sparse_dist.exchange_plan import ExchangePlan, Gathered
from sparse_dist.products import Output
from sparse_dist.receiver_dropout import ReceiverDropout
from sparse_dist.turns import pause_point


class PartialSpMM:
    """This rank's partial ``sum_j A_gj H_j`` over its column share, and its transpose, with one plan."""

    def __init__(self, plan: ExchangePlan) -> None:
        self.plan = plan
        self.products = plan.products
        self.dropout = ReceiverDropout(plan.timer, plan.device, plan.name)

    def _own_block(self, context: ExchangeContext | None, *, transposed: bool) -> torch.Tensor | None:
        """``A_gg`` (or its transpose) as this call multiplies it: the strategy's sampled block of the epoch
        where it samples inner entries too (``psc``), else the plan's own."""
        plan = self.plan
        sampled = plan.strategy_for(context).local_blocks(context) if context is not None else None
        if sampled is not None:
            return sampled[1] if transposed else sampled[0]
        if plan.local_block is None:
            return None
        return plan.local_transpose() if transposed else plan.local_block

    def _arrived_rows(self, h: torch.Tensor, phase: str, context: ExchangeContext | None,
                      meanwhile: Callable[[], None]) -> Iterator[tuple[Transfer, torch.Tensor | None]]:
        """Post the forward exchange of ``h``, run ``meanwhile`` (local work), then yield each part of the flight
        the strategy says to use, with its rows as they arrive (exhaust it: the last step records the flight)."""
        strategy = self.plan.strategy_for(context)
        if context is not None:
            strategy.progress()
            strategy.saw_own_rows(context, h)
        flight = self.plan.post_rows(h, phase, context, strategy)
        used = strategy.rows_to_use(context, flight) if context is not None else flight
        meanwhile()
        pause_point()  # a computation run in turns (an evaluation beside a step) lets the caller work meanwhile
        for part in used.arrivals():
            yield part, strategy.on_rows(context, part) if context is not None else part.rows
        if context is not None:
            strategy.finish_forward(context, used)

    def _arrived_gradients(self, piece_of: Callable[[Transfer], torch.Tensor], width: int, phase: str,
                           context: ExchangeContext | None,
                           meanwhile: Callable[[], None]) -> Iterator[tuple[Transfer, torch.Tensor | None]]:
        """Post the reverse exchange of the forward parts of ``context`` (their pieces from ``piece_of``), run
        ``meanwhile``, then yield each part of the gradient flight to use, with the owner's summed gradient."""
        strategy = self.plan.strategy_for(context)
        if context is not None:
            strategy.progress()
        forward = strategy.used(context) if context is not None else Flight(-1, -1, self.plan.exact_parts(), None)
        back = self.plan.post_gradients(forward, piece_of, width, phase, context, strategy)
        used = strategy.gradients_to_use(context, back) if context is not None else back
        meanwhile()
        for part in used.arrivals():
            yield part, strategy.on_gradients(context, part) if context is not None else part.rows

    def _multiply_part(self, out: Output, part: Transfer, rows: torch.Tensor | None,
                       context: ExchangeContext | None) -> None:
        """``out += A_part rows`` for an arrived forward part (nothing for the owner's own broadcast)."""
        operand = self.plan.part_operand(part)
        if operand is not None and rows is not None:
            received = self.dropout.received_rows(rows, self.plan.part_global_rows(part), context)
            self.products.multiply_into(out, operand, received)

    def _gradient_piece(self, part: Transfer, dt: torch.Tensor) -> torch.Tensor:
        """``A_part^T dT``: this rank's gradient of the rows a forward part brought."""
        transposed = self.plan.part_transposed(part)
        if transposed is None:
            return self.products.zeros(self.plan.part_rows(part), dt.shape[1])
        return self.products.product(transposed, dt)

    def _add_gradient(self, out: Output, part: Transfer, rows: torch.Tensor | None) -> None:
        """Add an arrived backward part's summed gradient into the owner's rows (nothing elsewhere)."""
        if rows is None:
            return
        operand = self.plan.gradient_operand(part)
        if operand is not None:  # rows that stood for several of the owner's rows (a cover's partial sums)
            self.products.multiply_into(out, operand, rows)
            return
        index = self.plan.gradient_rows(part)
        if index is None:
            out.tensor().add_(rows)
        else:
            out.tensor().index_add_(0, index, rows)

    # ------------------------------------------------------------ products
    def forward(self, h: torch.Tensor, phase: str, context: ExchangeContext | None = None) -> torch.Tensor:
        """This rank's partial ``sum_j A_gj H_j`` over its column share (``n_g x F``).

        Posts the exchange, multiplies the local block meanwhile, then each part as it arrives. With a
        pipelined strategy the parts multiplied are those of an earlier epoch's flight.
        """
        out = self.products.output(self.plan.n_rows, h.shape[1])

        def local() -> None:
            block = self._own_block(context, transposed=False)
            if block is not None:
                self.products.multiply_into(out, block, self.dropout.own_rows(h, context))

        for part, rows in self._arrived_rows(h, phase, context, local):
            self._multiply_part(out, part, rows, context)
        return out.tensor()

    def transpose(self, dt: torch.Tensor, phase: str, context: ExchangeContext | None = None) -> torch.Tensor:
        """This rank's ``dH_g`` summed over the row groups of its replica column (``n_g x F``); mirrors the
        forward of the same context (the same parts)."""
        out = self.products.output(self.plan.n_rows, dt.shape[1])

        def local() -> None:
            block = self._own_block(context, transposed=True)
            if block is not None:
                self.products.multiply_into(out, block, dt)

        for part, rows in self._arrived_gradients(lambda part: self._gradient_piece(part, dt), dt.shape[1], phase,
                                                  context, local):
            self._add_gradient(out, part, rows)
        return out.tensor()

    # ------------------------------------------------- rows without a product
    def gather(self, h: torch.Tensor, phase: str, context: ExchangeContext | None = None) -> list[Gathered]:
        """The forward exchange without the product: every part this rank uses, with its rows and block.

        For layers whose aggregation is not a fixed ``A H`` (attention): each :class:`Gathered` holds the
        rows that arrived (``rows x F``; a pipelined strategy's are an earlier epoch's, a cached one's
        may be cached rows; masked by this rank under receiver-side dropout) and ``block``, this rank's
        rows of ``A`` over those rows as columns (sampled and scaled where the strategy samples). The
        owner's own broadcast is left out. The transpose of the same context is :meth:`scatter`.
        """
        out = []
        for part, rows in self._arrived_rows(h, phase, context, lambda: None):
            block = self.plan.part_block(part)
            if rows is not None and block is not None:
                ids = self.plan.part_global_rows(part)
                out.append(Gathered(part, self.dropout.received_rows(rows, ids, context), block, ids))
        return out

    def scatter(self, gathered: list[Gathered], gradients: list[torch.Tensor], width: int, phase: str,
                context: ExchangeContext | None = None) -> torch.Tensor:
        """The reverse of :meth:`gather`: ``gradients[k]`` (the gradient of ``gathered[k].rows``, ``width``
        columns, the same on every rank) goes back to its owner; returns the sum of what every other rank
        sent for this rank's own rows (``n_g x width``). Call it once with the context of the gather.
        """
        by_owner = {item.part.owner: grad for item, grad in zip(gathered, gradients)}  # one part per owner

        def piece_of(part: Transfer) -> torch.Tensor:
            grad = by_owner.get(part.owner)
            count = self.plan.part_rows(part)
            return grad.contiguous() if grad is not None else self.products.zeros(count, width)

        out = self.products.output(self.plan.n_rows, width)
        for part, rows in self._arrived_gradients(piece_of, width, phase, context, lambda: None):
            self._add_gradient(out, part, rows)
        return out.tensor()
