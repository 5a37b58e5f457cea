"""What a run's training exchanges keep between SpMM calls, and when it moves: :class:`ExchangeLifecycle`.

Each SpMM call posts and consumes its own flights (:mod:`sparse_dist.partial`). Some flights outlive their
call: a pipelined strategy (:mod:`sparse_dist.pipelined`) keeps ``tau`` flights per layer and direction, and
holds a step's gradient flights until it is told to post them. :class:`ExchangeLifecycle` is the one object a
trainer talks to about them: when held flights are posted, how kept flights progress, the step's decisions and
cache size, the swap to a tighter strategy, what a checkpoint keeps, and the end of the run. A trainer never
reaches the strategy or a flight itself.

Held until told. A strategy that holds gradient flights (``holds_gradients``: a pipelined rule with
``tau >= 1``) builds them in the backward pass and posts none. :meth:`ExchangeLifecycle.after_step` posts them
right after the gradient allreduce, or, where an evaluation follows the step, leaves them held;
:meth:`ExchangeLifecycle.after_evaluation` posts them once that evaluation has run (its forward and its
counts). Over TCP an evaluation posted behind the gradient flights waits for them on the same connections
(measured at 1 Gbit/s: 0.85 s against 0.47 s); posted after it, they travel during the next step's forward.
Their bytes belong to the step that held them: the trainer runs that evaluation before the step's record
leaves it, so the record is built after the held flights are posted and its bytes are final when it is
returned (:meth:`algorithms.training.trainer.Trainer.train_epoch`). "Deferred" names something else: the
communicator's MPI start that waits for the next MPI call (:mod:`sparse_dist.comm`).

Collective: :meth:`~ExchangeLifecycle.after_step`, :meth:`~ExchangeLifecycle.after_evaluation`,
:meth:`~ExchangeLifecycle.swap`, :meth:`~ExchangeLifecycle.state_dict` and :meth:`~ExchangeLifecycle.close`
over the plan's replica column, every rank at the same point of the same step.
"""

from __future__ import annotations

from typing import Any

from sparse_dist.compress import Codec
from sparse_dist.exchange import BoundarySampler, ExchangeStrategy, StalenessRule
from sparse_dist.exchange_plan import ExchangePlan
from sparse_dist.factory import make_strategy


class ExchangeLifecycle:
    """The training strategy of one plan and the flights it keeps across calls (see the module docstring)."""

    def __init__(self, plan: ExchangePlan) -> None:
        self.plan = plan
        self._tests_progress = True
        self._held = False  # this step's gradient flights wait for after_evaluation

    @property
    def _strategy(self) -> ExchangeStrategy:
        return self.plan.strategy

    # -------------------------------------------------------------- progress
    @property
    def posts_all_at_once(self) -> bool:
        """Whether the strategy posts a flight's parts at once and keeps flights for later calls (pipelined):
        those travel while layers compute, so the run needs a progress mode for them."""
        return self._strategy.posts_ahead is None

    def test_progress(self, tests: bool) -> None:
        """``tests``: each layer's exchange tests the kept flights (local, never blocks); False leaves their
        progress to the MPI library or a progress thread. Kept for every strategy swapped in later."""
        self._tests_progress = tests
        self._strategy.tests_progress = tests

    def in_flight(self) -> bool:
        """Whether a flight is kept for a later call (what a progress thread drives; safe from that thread)."""
        return self._strategy.outstanding() > 0

    # ------------------------------------------------------------- the step
    def after_step(self, evaluation_follows: bool) -> None:
        """The step's held gradient flights are posted now, behind its gradient allreduce, unless an evaluation
        follows: then they stay held until :meth:`after_evaluation`. Collective over the plan's column; every
        rank passes the same value."""
        self._held = evaluation_follows and self._strategy.holds_gradients
        if not self._held:
            self._strategy.release_held()

    def after_evaluation(self) -> None:
        """Post the gradient flights a step held for its evaluation (nothing where none are held). Collective
        over the plan's column."""
        if self._held:
            self._held = False
            self._strategy.release_held()

    def step_record(self, epoch: int) -> dict[str, Any]:
        """The exchange's part of step ``epoch``'s record: ``broadcasts``, which owners sent per layer (empty
        where every owner always sends), and ``cache_bytes``, what this rank keeps of earlier exchanges."""
        return {"broadcasts": self._strategy.decisions(epoch), "cache_bytes": self._strategy.cache_bytes()}

    @property
    def sampling(self) -> ExchangeStrategy:
        """The strategy that decides which rows travel (a staleness rule's wrapped one): what ``psc``'s feature
        cache and ``dgs``' explainer read of it."""
        return self._strategy.sampling

    # ------------------------------------------------------ swap, state, end
    def swap(self, sampler: BoundarySampler | None, rule: StalenessRule | None, codec: Codec | None) -> None:
        """Train with the strategy of ``sampler`` and ``rule`` and with ``codec`` from the next call on: the old
        strategy's flights complete first (collective over the plan's column). Raises ValueError, before
        anything changes, where the plan cannot carry the new strategy."""
        strategy = make_strategy(sampler, rule)
        problem = self.plan.refusal(samples=strategy.samples, caches=strategy.caches,
                                    per_receiver=strategy.per_receiver)
        if problem:
            raise ValueError(problem)
        self.close()
        strategy.tests_progress = self._tests_progress
        self.plan.strategy = strategy
        strategy.bind(self.plan)
        self.plan.codec = codec

    @property
    def keeps_state(self) -> bool:
        """Whether the strategy keeps per-rank state a checkpoint must save (the same on every rank)."""
        return self._strategy.keeps_state

    def state_dict(self) -> dict[str, Any]:
        """This rank's strategy state: caches, versions, kept flights (completed first: collective)."""
        self.after_evaluation()  # a flight still held is posted, so that every rank completes the same ones
        return self._strategy.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._strategy.load_state_dict(state)

    def close(self) -> None:
        """Complete every flight kept for later calls (collective over the plan's column; idempotent), so none is
        pending when its buffers go or MPI is finalised. Training may go on afterwards: kept flights stay kept,
        completed."""
        self.after_evaluation()
        self._strategy.complete_outstanding()
