"""The exchange seam: strategies decide what a message carries, plan classes declare what they can carry,
and policy text has one parser (single process; the multi-rank behaviour is in test_policies_mpi)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from algorithms.policies import AxisSpec, BnsSampler, PolicySpec, SancusRule, policy_list_arg, sampling_arg
from sparse_dist.cached import CachedStrategy, HistoryCache
from sparse_dist.exchange import ExactStrategy, SampledStrategy
from sparse_dist.factory import make_strategy
from sparse_dist.plans import PLANS, DenseBroadcastPlan, PointToPointPlan, SparseBroadcastPlan, plan_class


def test_make_strategy_composes_the_two_axes() -> None:
    assert type(make_strategy()) is ExactStrategy
    assert type(make_strategy(BnsSampler(1.0))) is ExactStrategy  # p = 1 is the exact path
    sampled = make_strategy(BnsSampler(0.25, "owner"))
    assert isinstance(sampled, SampledStrategy) and sampled.samples and not sampled.caches
    assert sampled.scale == 4.0 and sampled.side == "owner"
    both = make_strategy(BnsSampler(0.5), SancusRule("e", 1, skip_backward=True))
    assert isinstance(both, CachedStrategy) and both.samples and both.caches and both.skip_backward
    assert isinstance(both.inner, SampledStrategy)


def test_plans_declare_what_they_carry_as_class_attributes() -> None:
    expected = {DenseBroadcastPlan: (False, True), SparseBroadcastPlan: (True, True), PointToPointPlan: (True, False)}
    for cls, (samples, history) in expected.items():
        assert (cls.carries_samples, cls.carries_history) == (samples, history)
        assert (cls.refusal(samples=True, caches=False) is None) == samples
        assert (cls.refusal(samples=False, caches=True) is None) == history
        assert cls.refusal(samples=False, caches=False) is None
        assert plan_class(cls.name) is cls and PLANS[cls.name] is cls

    class NoSamplingPlan(SparseBroadcastPlan):  # a new plan: its semantics are its own attributes
        name = "no-sampling"
        carries_samples = False
        no_samples_reason = "no-sampling never samples"

    assert NoSamplingPlan.refusal(samples=True, caches=True) == "no-sampling never samples"
    with pytest.raises(ValueError, match="unknown exchange plan 'ring'"):
        plan_class("ring")


def test_byte_model_rows_come_from_each_plan_class() -> None:
    rows = np.array([5, 7, 3])
    boundary = np.array([[0, 2, 1], [4, 0, 3], [1, 1, 0]])
    union = np.array([4, 3, 3])
    assert np.array_equal(DenseBroadcastPlan.moved_rows(rows, boundary, union)[2], rows)
    assert np.array_equal(SparseBroadcastPlan.moved_rows(rows, boundary, union)[0], union)
    assert np.array_equal(PointToPointPlan.moved_rows(rows, boundary, union), boundary)


def test_history_decisions_log_is_bounded_and_read_by_epoch() -> None:
    history = HistoryCache(log_limit=8)
    for epoch in range(100):
        for layer in range(2):
            history.log(epoch, layer, [0, 1, 2], np.array([True, epoch % 2 == 0, False]))
    assert len(history._log) == 8  # the log never grows with the run
    assert history.decisions(99) == [{"layer": 0, "owners": 3, "active": [0]},
                                     {"layer": 1, "owners": 3, "active": [0]}]
    assert history.decisions(98)[0]["active"] == [0, 1]
    assert history.decisions(3) == []  # older than the bound: gone


def test_one_parser_for_every_policy_text() -> None:
    joined = PolicySpec.parse("bns:p=0.1,side=owner+sancus-e:eps=1,skip_backward=1")
    assert joined.samples and joined.caches and not joined.is_exact
    assert joined.sample.build(seed=3) == BnsSampler(0.1, "owner", 3)
    assert joined.stale.build() == SancusRule("e", 1.0, True)
    assert PolicySpec.parse("exact").is_exact and PolicySpec.parse("none").text == "exact"
    listed = PolicySpec.parse_list("exact,bns:p=0.1;sancus-e:eps=1,skip_backward=1")
    assert [p.text for p in listed] == ["exact", "bns:p=0.1", "sancus-e:eps=1,skip_backward=1"]
    assert AxisSpec.parse("sample", " none ").is_none
    with pytest.raises(ValueError, match="repeats one kind"):
        PolicySpec.parse("bns:p=0.1+bns:p=0.2")
    with pytest.raises(argparse.ArgumentTypeError, match=r"unknown parameter 'q=1'.*accepted: 'none' or bns:keep=K"):
        sampling_arg("bns:q=1")
    with pytest.raises(argparse.ArgumentTypeError, match="skip_backward='2' is not a 0 or 1"):
        policy_list_arg("exact,sancus-a:eps=1,skip_backward=2")


def test_exact_strategy_refuses_a_checkpoint_with_state() -> None:
    ExactStrategy().load_state_dict({})
    with pytest.raises(ValueError, match="keeps no state"):
        ExactStrategy().load_state_dict({"versions": torch.zeros(1)})
