"""The guard's bias signal in one process (algorithms.training.bias and its use in algorithms.training.guard): the
rule, the interval it chooses, and how its strikes become a decision. Under mpiexec, with a policy biased on
purpose: tests/mpi/cases/bias_cases.py."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from algorithms.training import bias
from algorithms.training.bias import SameWeights
from algorithms.training.guard import Guard, GuardSettings
from guard_runs import OneRank


def kept() -> dict:
    return {"model": {"w": np.arange(3.0)}}


BIASED = SameWeights(policy_loss=1.2, exact_loss=1.0, policy_val=0.60, exact_val=0.70)  # 10 points on 500 nodes
EVEN = SameWeights(policy_loss=1.2, exact_loss=1.0, policy_val=0.68, exact_val=0.70)


@pytest.mark.parametrize("reference, step, expected", [(0.4, 1.0, 8), (0.41, 1.0, 12), (0.61, 1.0, 16),
                                                       (0.05, 1.0, 1), (0.051, 1.0, 2), (0.13, 1.0, 3),
                                                       (0.0, 1.0, 1), (1.0, 0.0, 1)])
def test_the_interval_is_the_first_rung_that_keeps_the_reference_within_five_percent(
        reference: float, step: float, expected: int) -> None:
    every = bias.reference_interval(reference, step)
    assert every == expected
    if step > 0:
        assert reference <= bias.REFERENCE_SHARE * step * every  # within the share
    if step > 0 and every > 2:  # from the third rung on, more than two thirds of it
        assert 2 / 3 * bias.REFERENCE_SHARE * step * every <= reference


@pytest.mark.parametrize("ratio, epochs, expected", [(1.58, 40, 41), (0.2, 40, 6), (0.4, 200, 12), (1.0, 10, 24),
                                                     (0.05, 1000, 2)])
def test_the_measuring_reading_counts_in_the_share_of_a_run_of_known_length(ratio: float, epochs: int,
                                                                           expected: int) -> None:
    """On 40 epochs of the 200k synthetic a reading cost 1.58 steps: the one beside step 2 spends 4% of the run, so
    none follows (K > E); where more fit, the first plus ``E // K`` stay within 5% of ``E`` steps."""
    every = bias.reference_interval(ratio, 1.0, epochs=epochs)
    assert every == expected
    assert every >= bias.reference_interval(ratio, 1.0)  # never more often than without the run's length
    readings = 1 + (epochs // every if every <= epochs else 0)
    assert readings * ratio <= bias.REFERENCE_SHARE * epochs or readings == 1


def test_a_reading_strikes_when_both_forwards_say_the_policy_is_worse_beyond_the_noise() -> None:
    floor = bias.gap_threshold(0.70, 500, 2.0)
    assert floor == pytest.approx(2.0 * (0.7 * 0.3 / 500) ** 0.5)  # 4.1 points
    assert "exact on the same weights" in bias.strikes(BIASED, 500, 2.0)
    assert bias.strikes(EVEN, 500, 2.0) is None  # 2 points: within the noise
    assert bias.strikes(SameWeights(0.9, 1.0, 0.60, 0.70), 500, 2.0) is None  # the policy fits better: no bias seen
    assert bias.strikes(BIASED, 20, 2.0) is None  # 20 validation nodes: 10 points is noise


def test_a_reading_is_made_of_summed_losses_and_counts() -> None:
    seen = bias.reading(np.array([0.8, 0.5, 300.0, 350.0]), 500)
    assert seen == SameWeights(0.8, 0.5, 0.6, 0.7)
    multilabel = bias.reading(np.array([0.8, 0.5, 10, 0, 10, 20, 0, 0]), 500)  # tp, fp, fn of each forward
    assert (multilabel.policy_val, multilabel.exact_val) == (pytest.approx(2 / 3), 1.0)  # 2tp / (2tp + fp + fn)


def test_local_sums_compare_the_two_forwards_on_the_same_rows() -> None:
    labels = torch.tensor([0, 1, 1, 0])
    masks = {"val": torch.tensor([False, True, True, True])}
    run = SimpleNamespace(graph=SimpleNamespace(multilabel=False, num_classes=2), train_rows=torch.tensor([0]),
                          train_labels=labels[:1], global_counts={"train": 1}, masks=masks, labels=labels)
    exact = torch.tensor([[2.0, 0.0], [0.0, 2.0], [0.0, 2.0], [2.0, 0.0]])  # right everywhere
    policy = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [0.0, 2.0]])  # one validation row right of three
    sums = bias.local_sums(policy, exact, run).numpy()
    assert sums[0] == pytest.approx(np.log(2.0)) and sums[0] > sums[1]
    assert list(sums[2:]) == [1.0, 3.0]


def guard(audit_every: int = 0, **settings: object) -> tuple[Guard, OneRank]:
    comm = OneRank()
    given = {"warmup": 0, "patience": 2, **settings}
    watch = Guard(GuardSettings(**given), comm, active=True, validation_size=500, audit_every=audit_every)
    watch.note_step(1.0)  # the steps' typical seconds, which the reference's budget is a share of
    return watch, comm


def test_without_an_audit_interval_an_evaluation_after_step_two_prices_it_then_readings_choose_again() -> None:
    watch, comm = guard()
    assert not any(watch.reference_due(epoch) for epoch in range(1, 20))  # no reading of its own to measure
    watch.price_reference(1, 0.01)  # step 1 pays one-off costs: its evaluation prices nothing
    assert watch.state.reference_every == 0 and comm.calls == 0
    watch.price_reference(2, 0.2)  # 0.2 / (0.05 * 1.0) = 4, agreed in one allgather
    assert watch.state.reference_every == 4 and comm.calls == 1
    watch.price_reference(3, 0.01)  # once chosen, later evaluations leave it to the readings
    assert watch.state.reference_every == 4 and comm.calls == 1
    assert [epoch for epoch in range(3, 13) if watch.reference_due(epoch)] == [4, 8, 12]
    watch.observe_reference(4, EVEN, 0.4)  # a reading dearer than the evaluation: chosen again from it
    assert watch.state.reference_every == 8 and comm.calls == 2
    given, _ = guard(audit_every=5)  # --audit-every: its forward, its interval; nothing measured
    assert [epoch for epoch in range(1, 11) if given.reference_due(epoch)] == [5, 10]
    given.observe_reference(5, EVEN, 0.2)
    given.price_reference(5, 0.2)
    assert given.state.reference_every == 0


def test_an_evaluation_dearer_than_the_budget_leaves_a_short_run_without_readings() -> None:
    """40 epochs of the 200k synthetic at P = 2 over 200 Mbit/s: an exact evaluation took 2.1 s against steps of
    0.8 s, more than 5% of the run's steps (1.6 s): no reading at all, where one to measure cost 3.8 s."""
    watch = Guard(GuardSettings(warmup=0, patience=2), OneRank(), active=True, validation_size=500, epochs=40)
    watch.price_reference(11, 2.1)  # before any step: nothing to price against
    assert watch.state.reference_every == 0
    watch.note_step(0.8)
    watch.price_reference(11, 2.1)
    assert watch.state.reference_every > 40
    assert not any(watch.reference_due(epoch) for epoch in range(1, 41))
    cheap = Guard(GuardSettings(warmup=0, patience=2), OneRank(), active=True, validation_size=500, epochs=40)
    cheap.note_step(0.8)
    cheap.price_reference(11, 0.3)  # 0.3 / (0.05 * 0.8) = 7.5: every 8 epochs, four readings in 1.6 s
    due = [epoch for epoch in range(12, 41) if cheap.reference_due(epoch)]
    assert due == [16, 24, 32, 40] and len(due) * 0.3 <= bias.REFERENCE_SHARE * 40 * 0.8


def test_off_without_a_policy_or_once_exact_it_reads_nothing() -> None:
    for settings, active in ((GuardSettings(bias="off"), True), (GuardSettings(mode="off"), True),
                             (GuardSettings(), False)):
        watch = Guard(settings, OneRank(), active=active, validation_size=500)
        assert not any(watch.reference_due(epoch) for epoch in range(1, 50))
    exact, _ = guard()
    exact.tightened(3, "bns:keep=0.6", "exact", True, {"sample": "none"})
    assert not any(exact.reference_due(epoch) for epoch in range(1, 50))
    with pytest.raises(ValueError, match="guard bias must be one of"):
        GuardSettings(bias="on")


def test_patience_strikes_in_a_row_after_the_warmup_tighten_without_restoring() -> None:
    watch, comm = guard(audit_every=2, warmup=4)
    for epoch in (2, 4):  # within the warm-up: read, not counted
        watch.observe_reference(epoch, BIASED, 0.1)
    assert watch.state.bias_strikes == 0
    watch.observe_reference(6, BIASED, 0.1)
    watch.observe_reference(8, EVEN, 0.1)  # the run of strikes is broken
    record = watch.observe_reference(10, BIASED, 0.1)
    assert record["strikes"] == 1 and record["every"] == 2 and record["threshold"] == pytest.approx(0.0410, abs=1e-4)
    watch.observe_metrics(10, {"val_acc": 0.7}, kept)
    assert not watch.due
    watch.observe_reference(12, BIASED, 0.1)
    watch.observe_metrics(12, {"val_acc": 0.7}, kept)
    assert watch.due and "exact on the same weights" in watch.state.pending and "2 checks in a row" in \
        watch.state.pending
    assert not watch.state.restore and not watch.state.give_up  # a bias is not a collapse
    watch.tightened(13, "bns:keep=0.1", "bns:keep=0.2", False, {"sample": "bns:keep=0.2"})
    assert watch.state.bias_strikes == 0
    watch.observe_reference(14, BIASED, 0.1)  # the tighter policy's own warm-up
    assert watch.state.bias_strikes == 0


def test_its_state_travels_with_the_guards() -> None:
    watch, _ = guard()
    watch.observe_reference(2, BIASED, 0.2)
    watch.observe_reference(4, BIASED, 0.2)
    copy, _ = guard()
    copy.load_state_dict(watch.state_dict())
    assert copy.state == watch.state and copy.state.reference_every == 4 and copy.state.bias_strikes == 2
    assert [epoch for epoch in range(3, 9) if copy.reference_due(epoch)] == [4, 8]
    older = dict(watch.state_dict(), guard={k: v for k, v in watch.state.record().items()
                                            if k not in ("reference_every", "reference_checks", "bias_strikes",
                                                         "bias_seen")})
    resumed, _ = guard()
    resumed.load_state_dict(older)  # a checkpoint from before the bias signal, resumed at epoch 50
    assert not resumed.reference_due(51) and resumed.state.bias_strikes == 0
    resumed.price_reference(51, 0.2)  # priced by the resumed leg's first evaluation after a step
    assert resumed.reference_due(52)


def test_readings_chosen_again_after_each_one_stay_within_the_budget_when_they_grow_dearer() -> None:
    """Readings that cost more than the first (a loaded machine): choosing K again from the means after every
    reading keeps the total within 5% of the steps; a fixed K from the first reading would not."""
    epochs, step, costs = 40, 1.0, iter([0.2, 0.5, 0.9, 1.2, 1.5, 1.8, 2.0, 2.0, 2.0, 2.0])
    spent, read, epoch = 0.0, 0, bias.MEASURED_AT
    every = 0
    while epoch <= epochs:
        cost = next(costs)
        spent, read = spent + cost, read + 1
        every = bias.reference_interval(spent / read, step, epochs=epochs, after=epoch, spent=spent)
        epoch = (epoch // every + 1) * every
    assert spent <= bias.REFERENCE_SHARE * epochs * step + 0.2  # the measuring reading may exceed it alone
    assert read >= 2
    fixed = bias.reference_interval(0.2, step, epochs=epochs)
    assert 0.2 + sum([0.5, 0.9, 1.2, 1.5, 1.8][:epochs // fixed]) > bias.REFERENCE_SHARE * epochs * step
