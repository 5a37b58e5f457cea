"""What the accuracy guard's tests share: a single-rank stand-in for the one collective the guard enters (unit
tests), and the short training loop of its multi-rank cases (tests/mpi/cases/guard_cases.py, bias_cases.py)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from algorithms.train import TrainConfig, Trainer
from runners.data.shards import load_local_graph


class OneRank:
    """The one collective the guard enters, on a single rank (records how often it was entered)."""

    def __init__(self) -> None:
        self.calls = 0

    def allgather_array(self, values: np.ndarray, phase: str = "other") -> np.ndarray:
        self.calls += 1
        return values.reshape(1, -1)


def trainer(comm: Any, data: str, **config: Any) -> Trainer:
    """A trainer over ``data``'s parts at ``comm``'s size (collective)."""
    return Trainer(comm, load_local_graph(comm, data, comm.size, 1), TrainConfig(**config))


def train(run: Trainer, until: int) -> dict[str, float]:
    """Steps, each followed by its evaluation, up to epoch ``until``; the last evaluation's metrics (collective)."""
    metrics: dict[str, float] = {}
    while run.epoch < until:
        run.train_epoch(evaluation_follows=True)
        metrics = run.evaluate()
    return metrics


def weights(run: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in run.parameters()]


def trains_on_alike(run: Trainer, until: int, found: Callable[[Trainer], Any], expected: Any,
                    final: list[torch.Tensor], what: str) -> list[str]:
    """Train resumed ``run`` on to ``until``; why it differs from the uninterrupted run (its decisions, as
    ``found`` reads them, against ``expected``; its final weights against ``final``), named by ``what``."""
    train(run, until)
    problems = []
    if found(run) != expected:
        problems.append(f"{what}: decisions {found(run)} != {expected}")
    if not all(torch.equal(a, b) for a, b in zip(weights(run), final)):
        problems.append(f"{what}: final weights differ from the uninterrupted run's")
    return problems
