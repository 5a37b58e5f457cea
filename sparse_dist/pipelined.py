"""Pipelined stale exchange (PipeGCN, PSC-GCN; DESIGN section 4): ``pipe:tau=T[,gamma=G]``.

:class:`PipelinedStrategy` wraps an exact or sampled strategy: every training call posts its whole
exchange at once and consumes the flight it posted ``tau`` epochs earlier. The staleness is
deterministic, so a P-rank run equals a single-process simulation of it.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist import state_checks as checks
from sparse_dist.exchange import BroadcastView, ExchangeContext, ExchangeStrategy, Flight, Message, Transfer, StalenessRule


class _Average:
    """Exponential moving average of one message's rows (one layer, one owner): ``s <- g s + (1 - g) m``,
    started with the first message."""

    def __init__(self, gamma: float) -> None:
        self.gamma = gamma
        self.values: torch.Tensor | None = None

    def update(self, rows: torch.Tensor) -> torch.Tensor:
        if self.values is None or self.values.shape != rows.shape:
            self.values = rows.detach().clone()
        else:
            self.values.mul_(self.gamma).add_(rows.detach(), alpha=1.0 - self.gamma)
        return self.values


class PipelinedStrategy(ExchangeStrategy):
    """Pipelined stale exchange (PipeGCN, PSC-GCN) around an exact or sampled strategy.

    Every training call posts its whole exchange at once (all parts, ``posts_ahead = None``) as soon as its
    rows exist, and consumes the flight it posted ``tau`` epochs earlier: forward, receivers multiply the
    rows owners sent in epoch ``t - tau`` (their own rows are current); backward, owners add the gradients
    receivers sent in epoch ``t - tau`` (computed against the rows those receivers used then). The first
    ``tau`` epochs are exact: they wait for their own flight, which is kept and used again ``tau`` epochs
    later. ``gamma > 0`` smooths what arrives, per layer and owner (:class:`_Average`), for rows and for
    gradients alike, from the first stale use on.

    Collective discipline: the flights are posted and waited at the same (epoch, layer, direction) on every
    rank, several stay outstanding per communicator, and :meth:`progress` only tests (local, never blocks).
    State across epochs: up to ``tau`` flights per layer and direction; a checkpoint completes them and keeps
    their received rows (:meth:`state_dict`).
    """

    posts_ahead = None

    def __init__(self, rule: StalenessRule, inner: ExchangeStrategy) -> None:
        super().__init__()
        tau, gamma = int(getattr(rule, "tau")), float(getattr(rule, "gamma"))
        if gamma > 0 and inner.samples:
            raise ValueError(f"{rule.name}: gamma smooths each boundary row over consecutive messages; with a "
                             f"sampling policy rows arrive in some epochs only, so combine gamma=0 with sampling")
        self.rule, self.inner, self.tau, self.gamma = rule, inner, tau, gamma
        self.samples = inner.samples  # type: ignore[misc]
        self.per_receiver = inner.per_receiver  # type: ignore[misc]
        self._rows: dict[int, deque[Flight]] = {}
        self._gradients: dict[int, deque[Flight]] = {}
        self._row_average: dict[tuple[int, int], _Average] = {}
        self._gradient_average: dict[tuple[int, int], _Average] = {}

    def bind(self, plan: Any) -> None:
        super().bind(plan)
        self.inner.bind(plan)

    # the inner strategy decides what travels
    def keep(self, epoch: int, stream: int, global_rows: np.ndarray) -> np.ndarray | None:
        return self.inner.keep(epoch, stream, global_rows)

    @property
    def scale(self) -> float:
        return self.inner.scale

    @property
    def side(self) -> str:
        return self.inner.side

    def fresh_message(self, plan: BroadcastView, epoch: int, owner: int) -> Message:
        return self.inner.fresh_message(plan, epoch, owner)

    def prepare(self, epoch: int) -> None:
        self.inner.prepare(epoch)

    def sampled_block(self, epoch: int, block: sp.csr_matrix, kept_columns: np.ndarray) -> sp.csr_matrix:
        return self.inner.sampled_block(epoch, block, kept_columns)

    @property
    def sampling(self) -> ExchangeStrategy:
        return self.inner.sampling

    def local_blocks(self, context: ExchangeContext) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.inner.local_blocks(context)

    def saw_own_rows(self, context: ExchangeContext, h: torch.Tensor) -> None:
        self.inner.saw_own_rows(context, h)

    # the pipeline
    def _swap(self, queues: dict[int, deque[Flight]], context: ExchangeContext, flight: Flight) -> Flight:
        if self.tau == 0:
            return flight
        queue = queues.setdefault(context.layer, deque())
        queue.append(flight)
        if context.epoch < self.tau or queue[0].epoch > context.epoch - self.tau:
            return flight  # warm-up (the first tau epochs, or after a resume that dropped the flights): exact now
        used = queue.popleft()
        if used.epoch != context.epoch - self.tau:
            raise RuntimeError(f"pipe: layer {context.layer} in epoch {context.epoch} found the flight of epoch "
                               f"{used.epoch}, expected {context.epoch - self.tau} (a call was skipped)")
        return used

    def rows_to_use(self, context: ExchangeContext, flight: Flight) -> Flight:
        return self._swap(self._rows, context, flight)

    def gradients_to_use(self, context: ExchangeContext, flight: Flight) -> Flight:
        return self._swap(self._gradients, context, flight)

    def _smoothed(self, averages: dict[tuple[int, int], _Average], context: ExchangeContext,
                  part: Transfer) -> torch.Tensor | None:
        if self.gamma == 0 or context.epoch < self.tau or part.rows is None:
            return part.rows
        return averages.setdefault((context.layer, part.owner), _Average(self.gamma)).update(part.rows)

    def on_rows(self, context: ExchangeContext, part: Transfer) -> torch.Tensor | None:
        self.inner.on_rows(context, part)
        if part.owner == self.plan.group:
            return part.rows  # the owner's own broadcast: nothing arrives
        return self._smoothed(self._row_average, context, part)

    def on_gradients(self, context: ExchangeContext, part: Transfer) -> torch.Tensor | None:
        return self._smoothed(self._gradient_average, context, part)

    def kept_flights(self) -> list[tuple[bool, Flight]]:
        """Every flight kept for a later epoch with its direction (``backward``): rows, then gradients, layers in
        order, oldest first; the same order on every rank (the order of :meth:`state_dict`). Safe to call from a
        progress thread: the tables are copied before they are walked (the main thread adds a layer's queue on
        its first call)."""
        return [(backward, flight) for backward, queues in ((False, self._rows), (True, self._gradients))
                for _, queue in sorted(list(queues.items())) for flight in list(queue)]

    def keeps(self, flight: Flight) -> bool:
        """A forward flight used in a warm-up epoch stays queued for the epoch ``tau`` later: its rows are kept."""
        return any(kept is flight for _, kept in self.kept_flights())

    @property
    def holds_gradients(self) -> bool:  # type: ignore[override]
        """Where the rule overlaps (``tau >= 1``) a gradient flight is used epochs later: it is held through the
        backward pass and posted after the step's gradient allreduce (:meth:`release_held`, told by
        :class:`~sparse_dist.lifecycle.ExchangeLifecycle`). Over TCP a flight posted during the backward is
        still on the wire when the allreduce follows it on the same connection, and the allreduce waits for
        it; posted after, it travels while the next epoch's forward computes."""
        return self.rule.overlaps

    def release_held(self) -> None:
        """Post the kept gradient flights still held, layers in order (collective over the column). A flight
        consumed before it (a warm-up epoch) was posted by its consumption."""
        for backward, flight in self.kept_flights():
            if backward:
                flight.release()

    def progress(self) -> None:
        """Test every kept flight (``tests_progress``; each layer's forward and transpose call it on entry)."""
        if self.tests_progress:
            for _, flight in self.kept_flights():
                flight.progress()

    def outstanding(self) -> int:
        """Flights kept for later epochs (forward and backward, all layers)."""
        return len(self.kept_flights())

    def complete_outstanding(self) -> None:
        """Wait for every kept flight in :meth:`kept_flights`' order. They stay kept, completed, so training may
        go on afterwards unchanged."""
        for _, flight in self.kept_flights():
            flight.complete()

    # state
    @property
    def keeps_state(self) -> bool:
        return self.tau > 0 or self.inner.keeps_state

    def _received(self, flight: Flight, backward: bool) -> list[Transfer]:
        """The parts of a kept flight that hold what arrived (forward: not the owner's own send rows)."""
        return [part for part in flight.parts
                if part.rows is not None and (backward or part.owner != self.plan.group)]

    def cache_bytes(self) -> int:
        """Bytes of the flights kept for later epochs and of the averages (received rows and gradients)."""
        held = [part.rows for backward, flight in self.kept_flights() for part in self._received(flight, backward)]
        held += [a.values for a in (*self._row_average.values(), *self._gradient_average.values())
                 if a.values is not None]
        return int(sum(t.numel() * t.element_size() for t in held))

    def _flight_state(self, flight: Flight, backward: bool) -> dict[str, Any]:
        flight.complete()  # collective: every rank checkpoints the same flights in the same order
        return {"epoch": flight.epoch, "source_epoch": flight.source_epoch,
                "rows": {part.owner: part.rows.cpu() for part in self._received(flight, backward)}}

    def state_dict(self) -> dict[str, Any]:
        """The kept flights (completed first; collective over the plan's column), and the averages."""
        def averages(table: dict[tuple[int, int], _Average]) -> dict[tuple[int, int], torch.Tensor]:
            return {key: a.values.cpu() for key, a in table.items() if a.values is not None}

        return {"tau": self.tau, "gamma": self.gamma, "inner": self.inner.state_dict(),
                "rows": {layer: [self._flight_state(f, False) for f in q] for layer, q in sorted(self._rows.items())},
                "gradients": {layer: [self._flight_state(f, True) for f in q]
                              for layer, q in sorted(self._gradients.items())},
                "row_average": averages(self._row_average), "gradient_average": averages(self._gradient_average)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state.get("tau"), state.get("gamma")) != (self.tau, self.gamma):
            raise ValueError(f"the checkpoint's pipeline has tau={state.get('tau')}, gamma={state.get('gamma')}; "
                             f"this run has tau={self.tau}, gamma={self.gamma}")
        self.inner.load_state_dict(state["inner"])  # first: a sampled flight is rebuilt from its epoch's probabilities
        plan, device = self.plan, self.plan.device

        def restore(saved: dict[str, Any], layer: int, backward: bool) -> Flight:
            source = checks.count(saved["source_epoch"], "a kept flight's source epoch")
            parts = plan.parts_of(self, source, backward=backward)
            for part in parts:
                rows = saved["rows"].get(part.owner)
                what = f"the kept {'gradients' if backward else 'rows'} of layer {layer} from part {part.owner}"
                part.rows = checks.payload(rows, what).to(device) if rows is not None else None
            return Flight(checks.count(saved["epoch"], "a kept flight's epoch"), layer, parts, None, source)

        self._rows = {int(layer): deque(restore(f, int(layer), False) for f in flights)
                      for layer, flights in state["rows"].items()}
        self._gradients = {int(layer): deque(restore(f, int(layer), True) for f in flights)
                           for layer, flights in state["gradients"].items()}
        for table, saved in ((self._row_average, state["row_average"]),
                             (self._gradient_average, state["gradient_average"])):
            table.clear()
            for key, values in saved.items():
                table[tuple(key)] = average = _Average(self.gamma)
                average.values = checks.rows(values, f"the smoothed rows {key}").to(device)
