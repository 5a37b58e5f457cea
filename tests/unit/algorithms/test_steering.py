"""Steered evaluation's rules (algorithms/training/steering.py): each reason on a hand-written signal, the gap
bookkeeping, the counts the signal is made of, and a checkpoint's steering state (round trip, hostile values)."""

from __future__ import annotations

import math

import pytest
import torch

from algorithms.training.steering import (EvaluationSteering, counts_width, state_problem, steered_value,
                                          steering_counts)


def _steering(target: float | None = 0.8, every: int = 5, epochs: int = 50, validation: int = 10_000,
              drop: float = 0.02) -> EvaluationSteering:
    return EvaluationSteering(every, epochs, target, validation, drop)


def test_first_step_is_evaluated_then_only_the_ceiling_while_far_from_the_target() -> None:
    steering = _steering()
    assert steering.due(1, 0.10) == "first"
    steering.observe_exact(1, 0.20)  # gap 0.10
    decided = {epoch: steering.due(epoch, 0.10 + 0.01 * epoch) for epoch in range(2, 12)}
    assert decided == {2: None, 3: None, 4: None, 5: None, 6: "ceiling", 7: None, 8: None, 9: None,
                       10: None, 11: "ceiling"}


def test_target_fires_once_signal_plus_gap_plus_two_standard_errors_reach_it() -> None:
    steering = _steering(target=0.8, validation=10_000)
    se = math.sqrt(0.8 * 0.2 / 10_000)
    steering.due(1, 0.50)
    steering.observe_exact(1, 0.60)  # gap 0.10
    below = 0.8 - 0.10 - 2 * se - 1e-6
    assert steering.due(2, below) is None
    assert steering.due(3, below + 2e-6) == "target"


def test_gap_is_the_largest_of_the_latest_two_and_never_negative() -> None:
    steering = _steering(target=0.8, every=100)
    se2 = 2 * math.sqrt(0.8 * 0.2 / 10_000)
    steering.due(1, 0.30)
    steering.observe_exact(1, 0.60)  # gap 0.30: soon forgotten
    for epoch, (signal, exact) in enumerate([(0.60, 0.62), (0.61, 0.60), (0.62, 0.50)], start=2):
        steering.pending[epoch] = signal  # as if due() had decided them
        steering.observe_exact(epoch, exact)
    assert steering.gaps == pytest.approx([-0.01, -0.12])
    assert steering.due(5, 0.8 - se2 - 1e-6) is None  # a negative gap counts as 0, not as a head start
    assert steering.due(6, 0.8 - se2 + 1e-6) == "target"


def test_a_fall_of_the_signal_beyond_drop_and_noise_is_evaluated_after_the_warm_up() -> None:
    steering = EvaluationSteering(100, 50, None, 1_000_000, 0.02, warmup=3)  # noise below the 0.02 drop
    steering.due(1, 0.5)
    assert steering.due(2, 0.70) is None
    assert steering.due(3, 0.60) is None  # a fall within the guard's warm-up: it would not count it
    assert steering.due(4, 0.69) is None  # within drop
    assert steering.due(5, 0.67) == "fall"


def test_no_target_no_fall_only_first_ceiling_and_last() -> None:
    steering = _steering(target=None, every=4, epochs=10)
    reasons = [steering.due(epoch, 0.5) for epoch in range(1, 11)]
    assert reasons == ["first", None, None, None, "ceiling", None, None, None, "ceiling", "last"]


def test_counts_and_value_match_accuracy_and_micro_f1() -> None:
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([0, 0, 0, 1])
    validation = torch.tensor([True, True, False, True])
    counts = steering_counts(logits, labels, validation, multilabel=False)
    assert counts.tolist() == [2.0] and counts.numel() == counts_width(False)
    assert steered_value(counts.tolist(), 3, multilabel=False) == pytest.approx(2 / 3)
    multi = torch.tensor([[1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]])
    truth = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    counts = steering_counts(multi, truth, torch.tensor([True, True, False]), multilabel=True)
    assert counts.tolist() == [2.0, 1.0, 0.0] and counts.numel() == counts_width(True)  # tp, fp, fn
    assert steered_value(counts.tolist(), 2, multilabel=True) == pytest.approx(4 / 5)


def test_state_round_trip_decides_as_the_uninterrupted_steering() -> None:
    first, resumed = _steering(), _steering()
    for epoch in range(1, 8):
        if first.due(epoch, 0.1 * epoch):
            first.observe_exact(epoch, 0.1 * epoch + 0.05)
    resumed.load_state_dict(first.state_dict())
    assert state_problem(first.state_dict()) is None
    assert [first.due(e, 0.1 * e) for e in range(8, 12)] == [resumed.due(e, 0.1 * e) for e in range(8, 12)]


@pytest.mark.parametrize("state,clause", [
    ("text", "not the four fields"),
    ({"last_exact": 1, "gaps": [], "best": 0.5}, "not the four fields"),
    ({"last_exact": -3, "gaps": [], "best": 0.5, "pending": {}}, "not a count"),
    ({"last_exact": True, "gaps": [], "best": 0.5, "pending": {}}, "not a count"),
    ({"last_exact": 1, "gaps": [float("nan")], "best": 0.5, "pending": {}}, "gaps"),
    ({"last_exact": 1, "gaps": [], "best": "high", "pending": {}}, "best signal"),
    ({"last_exact": 1, "gaps": [], "best": 0.5, "pending": {"x": 0.1}}, "pending"),
    ({"last_exact": 1, "gaps": [], "best": 0.5, "pending": {"3": float("inf")}}, "pending"),
])
def test_hostile_steering_state_is_refused_in_one_clause(state: object, clause: str) -> None:
    problem = state_problem(state)
    assert problem is not None and clause in problem
