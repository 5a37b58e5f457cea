"""Policies check themselves in one method from the flags alone; ``TrainConfig.from_args`` fills a run's
configuration from a command line by field name; a third-party policy plugs in without touching the trainer.

In-process, no MPI.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any

import pytest

from algorithms.policies import AxisSpec, EpochWork, PolicyBase, PolicySpec, RunShape, register_sampler
from algorithms.policies.registry import KINDS
from algorithms.train import TrainConfig
from runners import train_cmd
from runners.bench import train as bench_train


def _train_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    return parser.parse_args(["--data", ".", *argv])


@pytest.mark.parametrize("spec, shape, expected", [
    ("psc:budget=0.5", RunShape(replication=2),
     "--sample psc:budget=0.5 samples each receiver's own edges: it needs --replication 1 (1D)"),
    ("psc:budget=0.5,cache=0.3", RunShape(input_exchange="once"),
     "--sample psc:budget=0.5,cache=0.3 feeds layer 0 from its feature cache; --input-exchange once contradicts "
     "it (leave it at auto)"),
    ("dgs:nodes=0.5", RunShape(dropout_side="receiver"),
     "--sample dgs:nodes=0.5 explains with the rows its layers exchanged, which must be the rows it multiplies "
     "when explaining: use --dropout-side owner or auto"),
    ("dgs:nodes=0.5", RunShape(model="gat"),
     "--sample dgs:nodes=0.5 explains GCN and SAGE layers (their exchange is A H), not --layer-kind gat"),
    ("bns:p=0.5+pipe:tau=1,gamma=0.5", RunShape(),
     "--plan p2p --sample bns:p=0.5 --stale pipe:tau=1,gamma=0.5: pipe: gamma smooths each boundary row over "
     "consecutive messages; with a sampling policy rows arrive in some epochs only, so combine gamma=0 with "
     "sampling"),
    ("bns:p=0.5", RunShape(plan="dense-bcast"), "--plan dense-bcast --sample bns:p=0.5 --stale none: boundary "
                                                "sampling needs the sparse-bcast or p2p plan"),
    ("sancus-e:eps=1", RunShape(plan="p2p"), "--plan p2p --sample none --stale sancus-e:eps=1: staleness "
                                             "policies (cached historical blocks) need a broadcast plan"),
    ("psc:budget=0.5+sancus-e:eps=1", RunShape(plan="sparse-bcast"),
     "--plan sparse-bcast --sample psc:budget=0.5 --stale sancus-e:eps=1: per-receiver sampling"),
])
def test_a_policy_refuses_a_run_it_cannot_serve_in_one_sentence(spec: str, shape: RunShape, expected: str) -> None:
    assert (PolicySpec.parse(spec).refusal(shape) or "").startswith(expected)


@pytest.mark.parametrize("spec, shape", [
    ("bns:p=1", RunShape(plan="dense-bcast")),  # p = 1 is the exact path, which every plan carries
    ("bns:p=0.5,side=owner+sancus-h:eps=0.1", RunShape(plan="sparse-bcast", replication=2, model="gat")),
    ("psc:budget=0.5,cache=0.3+pipe:tau=2", RunShape()),
    ("dgs:nodes=0.5,features=0.5", RunShape(model="sage", dropout_side="owner")),
    ("pipe:tau=1,gamma=0.9", RunShape(plan="dense-bcast")),
])
def test_runs_a_policy_can_serve_are_not_refused(spec: str, shape: RunShape) -> None:
    assert PolicySpec.parse(spec).refusal(shape) is None


def test_train_refuses_through_the_policies_check_before_mpi() -> None:
    args = _train_args("--sample", "psc:budget=0.5", "--replication", "2")
    assert train_cmd.check_arguments(args) == ("--sample psc:budget=0.5 samples each receiver's own edges: it "
                                               "needs --replication 1 (1D)")
    assert train_cmd.check_arguments(_train_args("--sample", "psc:budget=0.5")) is None


def test_a_parsed_axis_holds_its_policy_and_a_run_gets_its_own_seeded_copy() -> None:
    spec = AxisSpec.parse("sample", "dgs:nodes=0.5,features=0.8")
    run = spec.build(seed=9)
    assert run.seed == 9 and spec.policy.seed == 0 and run is not spec.policy
    run.node_p = [0.5]  # per-run state (an explanation) stays in the run's copy
    assert spec.policy.node_p is None and spec.build(seed=9).node_p is None
    rule = AxisSpec.parse("stale", "sancus-e:eps=1")
    assert rule.build() is rule.policy  # frozen and stateless: shared


def test_from_args_takes_every_field_train_parses() -> None:
    argv = ["--model", "sage", "--hidden", "7", "--layers", "3", "--dropout", "0.25", "--lr", "0.02",
            "--weight-decay", "0.001", "--weight-decay-scope", "all", "--epochs", "11", "--eval-every", "2",
            "--seed", "5", "--plan", "sparse-bcast", "--replication", "2", "--feature-norm", "none",
            "--dtype", "float64", "--sample", "bns:p=0.5,side=owner", "--stale", "sancus-e:eps=1", "--clip", "1.5",
            "--input-exchange", "per-epoch", "--dropout-side", "owner", "--halo-budget", "4M",
            "--audit-every", "3", "--progress", "thread", "--compress", "fp16"]
    args = _train_args(*argv)
    assert train_cmd.check_arguments(args) is None
    config = TrainConfig.from_args(args)
    missing = [spec.name for spec in fields(TrainConfig) if not hasattr(args, spec.name)]
    assert missing == []  # every field of the configuration is a flag of `train`
    record = config.record()
    for spec in fields(TrainConfig):
        value = getattr(args, spec.name)
        assert record[spec.name] == (str(value) if isinstance(value, AxisSpec) else value), spec.name
    assert (record["hidden"], record["halo_budget"], record["sample"]) == (7, 4 << 20, "bns:p=0.5,side=owner")


def test_bench_config_keeps_defaults_for_flags_it_lacks_and_applies_its_overrides() -> None:
    parser = argparse.ArgumentParser()
    bench_train.add_arguments(parser)
    args = parser.parse_args(["--synthetic", "100", "--hidden", "32", "--epochs", "4", "--warmup", "1",
                              "--seed", "3", "--dropout", "0.4"])
    config = bench_train._config(args, {"feature_norm": "none"})
    assert (config.hidden, config.epochs, config.seed, config.dropout, config.feature_norm) == (32, 5, 3, 0.4, "none")
    assert (config.lr, config.sample.is_none, config.replication) == (TrainConfig.lr, True, 1)  # not bench flags
    baseline = bench_train._config(args, {}, dropout=0.0)
    assert (baseline.dropout, baseline.attention_dropout, baseline.feature_norm) == (0.0, 0.0, "row")


@dataclass(frozen=True)
class _EveryOther(PolicyBase):
    """A third-party sampler for the test: refuses the broadcast plans itself, and works per epoch."""

    p: float = 0.5
    side: str = "receiver"
    seed: int = 0
    name: str = "every-other"
    samples = True

    def refusal(self, run: RunShape) -> str | None:
        return "is a p2p policy" if run.plan != "p2p" else None

    def epoch_work(self, parts: Any) -> EpochWork | None:
        return EpochWork()


def test_a_registered_policy_is_parsed_checked_and_listed_without_touching_the_parser() -> None:
    register_sampler("every-other", lambda seed, **params: _EveryOther(seed=seed, **params), {"p": float},
                     "every-other[:p=P]")
    try:
        spec = PolicySpec.parse("every-other:p=0.25+sancus-e:eps=1")
        assert spec.sample.build(seed=2) == _EveryOther(0.25, seed=2)
        assert spec.refusal(RunShape(plan="dense-bcast")) == ("--sample every-other:p=0.25 is a p2p policy")
        assert "every-other[:p=P]" in AxisSpec("sample").accepted()
        assert spec.sample.policy.epoch_work(None).before_epoch(0) == {}
    finally:
        del KINDS["sample"]["every-other"]
