"""The audit: every ``audit_every`` epochs, an exact forward beside the policy's, and per layer the relative
error ``||H_policy - H_exact||_F / ||H_exact||_F`` over all rows, with that forward's own seconds and bytes
(kept out of the step's figures)."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np
import torch

from algorithms.training.metrics import moved_since
from sparse_dist.comm import Communicator


class Audit:
    """Runs the exact forward before the timed step (:meth:`begin`) and compares after it (:meth:`end`).

    ``forward(trace)`` is the trainer's training forward with every exchange exact, appending each layer's
    output to ``trace``. Collective: both calls, on every rank of the epochs :meth:`due` says.
    """

    def __init__(self, every: int, comm: Communicator, col_comm: Communicator,
                 forward: Callable[[list[torch.Tensor]], Any]) -> None:
        self.every, self.comm, self.col_comm, self._forward = every, comm, col_comm, forward

    def due(self, epoch: int) -> bool:
        return self.every > 0 and (epoch + 1) % self.every == 0

    def begin(self) -> dict[str, Any]:
        """The audit's exact forward: this epoch's weights and dropout masks, every exchange exact.

        Runs before the timed step (its compute is cleared with the step's timers), so neither its
        time nor its bytes count as training. Collective.
        """
        before, start = self.comm.stats.snapshot(), time.perf_counter()
        exact: list[torch.Tensor] = []
        with torch.no_grad():
            self._forward(exact)
        return {"exact": exact, "seconds": time.perf_counter() - start, "bytes": moved_since(self.comm, before)}

    def end(self, audit: dict[str, Any], used: list[torch.Tensor],
            extra: torch.Tensor | None = None) -> dict[str, Any]:
        """Per layer, ``||H_policy - H_exact||_F / ||H_exact||_F`` over all rows (one allreduce; collective).
        ``extra``: more float64 sums to add up over the replica column in the same allreduce (the guard's bias
        signal, :func:`algorithms.training.bias.local_sums`); their totals are ``sums`` in the result."""
        before, start = self.comm.stats.snapshot(), time.perf_counter()
        layers = torch.stack([torch.stack([(mine.double() - exact.double()).square().sum(),
                                           exact.double().square().sum()])
                              for mine, exact in zip(used, audit["exact"])]).reshape(-1)
        added = extra.to(device=layers.device, dtype=torch.float64) if extra is not None else layers[:0]
        sums = torch.cat([layers, added]).contiguous()
        self.col_comm.allreduce_(sums, "other")
        reduced = sums.cpu().numpy()
        totals = reduced[:layers.numel()].reshape(-1, 2)
        errors = [float(np.sqrt(gap / size)) if size > 0 else (0.0 if gap == 0 else float("inf"))
                  for gap, size in totals]
        moved = moved_since(self.comm, before)
        traffic = {phase: {key: audit["bytes"][phase][key] + moved[phase][key] for key in moved[phase]}
                   for phase in moved}
        return {"layer_error": errors, "seconds": audit["seconds"] + time.perf_counter() - start, "bytes": traffic,
                "sums": reduced[layers.numel():]}
