"""An exact evaluation run beside a training step, in turns (``TrainConfig.overlap_evaluation``).

The evaluation of the weights a step starts from is the same exact forward as :meth:`Trainer.evaluate`, run by
:class:`sparse_dist.turns.TakingTurns` in three turns the step hands over: before its forward (the evaluation's
layer 0, its first exchange posted), before its backward (that exchange's product, the next exchange posted) and
before the gradient allreduce (the rest, and the accuracy counts). The weights do not change until the optimiser
steps, after the last turn, so the metrics are those of the weights the step started from, exactly as an
evaluation after the previous step would give; only the wall clock differs: the evaluation's transfers travel
while the step computes.

The evaluation posts on its own duplicate of the replica column (:meth:`ExchangePlan.posting_on`): MPICH with
two VCIs (``--overlap-evaluation`` asks for them) then sends its transfers on their own connections, so the
step's rows do not queue behind them (measured at 1 Gbit/s: psc's exchange wait 0.18 -> 0.09 s a step).

What the turns took (their wall time, their bytes and waits: :class:`EvaluationShare`; the compute they measure,
on a timer of their own) is kept apart, so the step's record stays the step's own. Every rank hands over its turns at the
same points of the same step, so the MPI calls of both computations come in the same order everywhere.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from algorithms.training.metrics import bytes_by_phase, counters_since
from sparse_dist.accounting import ComputeTimer
from sparse_dist.comm import Communicator
from sparse_dist.exchange_plan import ExchangePlan
from sparse_dist.turns import TakingTurns


class EvaluationShare:
    """What an evaluation's turns took inside one step: wall seconds and communication counters (the compute
    they measure is booked apart, :meth:`ComputeTimer.apart`)."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.counters: dict[str, dict[str, float]] = {}

    def add(self, wall: float, counters: dict[str, dict[str, float]]) -> None:
        self.wall += wall
        for phase, values in counters.items():
            into = self.counters.setdefault(phase, {})
            for key, value in values.items():
                into[key] = into.get(key, 0.0) + value

    def excluded_from(self, before: dict[str, dict[str, float]],
                      wall: float) -> tuple[dict[str, dict[str, float]], float]:
        """The step's ``before`` counters and wall time with this share taken out."""
        shifted = {phase: {key: value + self.counters.get(phase, {}).get(key, 0.0) for key, value in values.items()}
                   for phase, values in before.items()}
        return shifted, wall - self.wall

    def bytes(self) -> dict[str, dict[str, int]]:
        return bytes_by_phase(self.counters)


class AlongsideEvaluation:
    """One evaluation, run in turns beside one step (collective: every turn may post or wait on exchanges)."""

    def __init__(self, comm: Communicator, timer: ComputeTimer, device: torch.device,
                 evaluate: Callable[[], dict[str, float]], plan: ExchangePlan, own_comm: Communicator) -> None:
        """``own_comm``: the duplicate of ``plan``'s replica column the evaluation posts its exchanges on."""
        self.comm, self.timer, self.device = comm, timer, device
        self.plan, self.own_comm = plan, own_comm
        self.share = EvaluationShare()

        def work() -> dict[str, float]:
            if device.type == "cuda":
                torch.cuda.set_device(device)  # the current device is per thread
            with torch.no_grad():  # grad mode is per thread too
                return evaluate()

        self._turns: TakingTurns[dict[str, float]] = TakingTurns(work, name="evaluation")

    @property
    def in_flight(self) -> bool:
        return self._turns.running

    def _timed(self, step: Callable[[], Any]) -> Any:
        before = self.comm.stats.snapshot()
        start = time.perf_counter()
        with self.timer.apart(), self.plan.posting_on(self.own_comm):
            result = step()
        self.share.add(time.perf_counter() - start, counters_since(self.comm, before))
        return result

    def turn(self) -> None:
        """Run the evaluation up to its next exchange (posted, its local product done)."""
        self._timed(self._turns.advance)

    def finish(self) -> dict[str, float]:
        """Run the evaluation to its end; its metrics (global, as :meth:`Trainer.evaluate`'s)."""
        return self._timed(self._turns.finish)
