"""``--policy auto``'s ranking (runners/policy_auto.py) on a hand-made workload: a slow link makes a sampled,
compressed configuration the fastest to accuracy, evaluated from the receptive field where it fits; a free link
with a costly codec makes it exact or sampled without compression; every candidate the plan refuses is left out. The run itself: tests/cli/test_policy_auto.py."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.training.config import TrainConfig
from runners.perf.cost_model import ModelShape, Rates
from runners.perf.field_cost import field_memory, field_sizes, predict_field_evaluation
from runners.perf.workload import Workload
from runners.policy_auto import CODECS, SAMPLES, Measured, rank_candidates, with_checkpoint_policies
from sparse_dist.cost import Network

SHAPE = ModelShape((128, 128, 128, 47))
# two row groups of 100k rows, degree 15, a third of the entries cut, 60k boundary rows each way
WORK = Workload("two", np.array([100_000, 100_000]), np.array([1_000_000, 1_000_000]), np.array([500_000, 500_000]),
                np.array([[0, 60_000], [60_000, 0]]), np.array([60_000, 60_000]))
RATES = Rates(spmm=2e9, dense=1e10)  # a step of about 0.5 s on one core, as the 200k synthetic at P = 2


def _measured(gb_per_s: float, codec_seconds: float) -> Measured:
    return Measured(20e-6, 1e-9 / gb_per_s, RATES, {"int8,feedback": codec_seconds, "adaptive,feedback": codec_seconds})


def test_a_slow_link_picks_a_sampled_compressed_configuration() -> None:
    # 200 Mbit/s, evaluated every 10 epochs (steered): the step's exchange sets the pace
    ranked = rank_candidates(WORK, SHAPE, TrainConfig(eval_every=10), _measured(0.025, 5e-9), threads=1)
    assert len(ranked) == len(SAMPLES) * len(CODECS)
    best = ranked[0]
    assert best.sample != "none" and best.compress != "none", best
    assert [c.time_to_accuracy for c in ranked] == sorted(c.time_to_accuracy for c in ranked)
    exact = next(c for c in ranked if c.sample == "none" and c.compress == "none")
    assert best.time_to_accuracy < 0.5 * exact.time_to_accuracy


def test_a_free_link_and_a_costly_codec_leave_compression_out() -> None:
    ranked = rank_candidates(WORK, SHAPE, TrainConfig(), _measured(100.0, 5e-8), threads=1)
    assert ranked[0].compress == "none", ranked[0]


def test_a_plan_that_cannot_sample_keeps_only_compression() -> None:
    ranked = rank_candidates(WORK, SHAPE, TrainConfig(plan="dense-bcast"), _measured(0.025, 5e-9), threads=1)
    assert {c.sample for c in ranked} == {"none"} and {c.compress for c in ranked} == set(CODECS)


def test_a_resumed_auto_run_takes_the_policies_its_checkpoint_holds() -> None:
    config = with_checkpoint_policies(TrainConfig(), {"sample": "psc:budget=0.1", "stale": "none",
                                                      "compress": "adaptive,feedback"})
    assert (str(config.sample), str(config.stale), config.compress) == ("psc:budget=0.1", "none", "adaptive,feedback")
    assert config.evaluation_plan == "same"  # the checkpoint holds none: the run's own
    assert with_checkpoint_policies(TrainConfig(), {"evaluation_plan": "field"}).evaluation_plan == "field"
    assert with_checkpoint_policies(TrainConfig(), {"evaluation_plan": "no-such-plan"}) == TrainConfig()
    assert with_checkpoint_policies(TrainConfig(), "not a table") == TrainConfig()
    assert with_checkpoint_policies(TrainConfig(), {"sample": "no-such-policy"}) == TrainConfig()


def test_the_compute_probe_multiplies_part_of_a_large_rank(monkeypatch) -> None:
    """A rank with more rows than the probe takes: its first rows against its own columns (a probe of 16,384
    rows once multiplied a 16,384-row operand by a 16,384-row dense block, not the rank's columns)."""
    import scipy.sparse as sp

    import runners.policy_auto as auto
    from algorithms.training.graph import LocalGraph
    from sparse_dist.layout import RowLayout

    monkeypatch.setattr(auto, "_PROBE_ROWS", 7)
    monkeypatch.setattr(auto, "WARM_UP_SECONDS", 0.0)
    layout = RowLayout.from_counts([30, 20])
    rows = sp.random(20, 50, density=0.2, format="csr", random_state=0)  # group 1's rows, global columns
    graph = LocalGraph(layout, rows, np.random.default_rng(0).random((20, 6)), np.zeros(20, np.int64),
                       {"train": np.ones(20, bool)}, 2, False)
    (spmm_seconds, spmm_units), (dense_seconds, dense_units) = auto._compute_seconds(graph, TrainConfig(hidden=4), 1)
    local = rows[:7, 30:50]
    assert spmm_units == local.nnz * 4 and dense_units == 7 * 6 * 4
    assert spmm_seconds > 0 and dense_seconds > 0


def test_a_probe_is_timed_after_its_warm_up(monkeypatch) -> None:
    """Cold, a probe ran several times slower than the step it prices (``WARM_UP_SECONDS``): its work runs untimed
    until the warm-up has passed, then three timed calls give the median."""
    import runners.policy_auto as auto

    clock, calls = [0.0], []
    monkeypatch.setattr(auto.time, "perf_counter", lambda: clock[0])

    def work() -> None:  # each call takes 0.1 s of the fake clock, the second timed one 0.3 s (the median: 0.1)
        calls.append(clock[0])
        clock[0] += 0.3 if len(calls) == 6 else 0.1

    assert auto.median_seconds(work, warm_up=0.35) == pytest.approx(0.1)
    assert len(calls) == 4 + 3  # untimed at 0, 0.1, 0.2 and 0.3 (0.4 >= 0.35), then three timed
    calls.clear()
    auto.median_seconds(work)
    assert len(calls) == 1 + 3


def test_the_rates_are_the_median_ranks_and_the_link_the_slowest_ranks(monkeypatch) -> None:
    """One rank's probe ten times slow (oversubscribed cores, for a second) does not price every step; the link's
    figures stay the slowest rank's. The probes come before the link, after a barrier."""
    import runners.policy_auto as auto

    order: list[str] = []
    monkeypatch.setattr(auto, "_compute_seconds", lambda *a, **k: (order.append("compute") or ((1.0, 1e9), (1.0, 4e9))))
    monkeypatch.setattr(auto, "_codec_seconds", lambda *a, **k: 2e-9)
    monkeypatch.setattr(auto, "link", lambda comm: (order.append("link") or (1e-4, 1e-9)))

    class Ranks:
        size, rank = 3, 0

        def idle_barrier(self) -> None:
            order.append("barrier")

        def allgather_array(self, local: np.ndarray) -> np.ndarray:
            slow = local * np.array([2.0, 2.0, 0.1, 0.1] + [10.0] * (local.size - 4))
            return np.stack([local * 1.5, slow, local * 2.0])

    measured = auto.measure(Ranks(), Ranks(), None, TrainConfig(), threads=1)
    assert order == ["barrier", "compute", "link"]
    assert (measured.rates.spmm, measured.rates.dense) == (1.5e9, 6e9)  # the median of 1.5, 0.1 and 2 times
    assert (measured.alpha, measured.beta) == (2e-4, 2e-9)  # the largest of 1.5, 2 and 2 times
    assert measured.codec_seconds == pytest.approx({"int8,feedback": 4e-9, "adaptive,feedback": 4e-9})


def test_the_disk_estimate_of_an_auto_run_holds_whatever_it_chooses() -> None:
    """A checkpoint's policy files are priced before auto chooses: at the most any candidate keeps (the feedback
    residuals of a compressed choice), and with the guard's copy of the weights."""
    import argparse

    from runners.model_defaults import fill_model_defaults
    from runners.resources import train_disk
    from runners.train_flags import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def disk(*flags: str) -> int:
        args = parser.parse_args(["--data", "x", "--checkpoint", "/nowhere/run.ckpt", *flags])
        fill_model_defaults(args)
        return train_disk(META, args, 2)["set"]

    chosen = [disk(*(["--sample", s] if s != "none" else []), *(["--compress", c] if c != "none" else []))
              for s in SAMPLES for c in CODECS]
    assert disk("--policy", "auto") == max(chosen) > disk()


# Cora's sizes in two parts (what train_disk reads of a prepared dataset's meta.json)
META = {"feature_dim": 1433, "num_classes": 7, "num_nodes": 2708, "num_edges": 10556, "num_parts": 2,
        "row_offsets": [0, 1354, 2708], "partition_stats": {}}


def test_a_slow_link_evaluates_from_the_receptive_field_where_it_fits_and_a_free_link_does_not() -> None:
    slow, free = _measured(0.025, 5e-9), _measured(100.0, 5e-9)
    ranked = rank_candidates(WORK, SHAPE, TrainConfig(), slow, threads=1, nodes=200_000, field_room=1e12)
    assert len(ranked) == 2 * len(SAMPLES) * len(CODECS) and ranked[0].evaluation == "field", ranked[0]
    assert "--evaluation-plan field" in ranked[0].text
    same = next(c for c in ranked if c.evaluation == "same" and (c.sample, c.compress) == (ranked[0].sample,
                                                                                           ranked[0].compress))
    assert ranked[0].step == same.step and ranked[0].cycle < same.cycle  # the same step, a cheaper evaluation
    assert rank_candidates(WORK, SHAPE, TrainConfig(), free, threads=1, nodes=200_000,
                           field_room=1e12)[0].evaluation == "same"
    bound = float(field_memory(WORK, SHAPE, 200_000, references=True).max())
    for room in (None, bound * 0.99):  # unknown memory, or too little: the field is not weighed
        assert {c.evaluation for c in rank_candidates(WORK, SHAPE, TrainConfig(), slow, threads=1, nodes=200_000,
                                                      field_room=room)} == {"same"}
    assert {c.evaluation for c in rank_candidates(WORK, SHAPE, TrainConfig(), slow, threads=1, nodes=200_000,
                                                  field_room=bound)} == {"same", "field"}


def test_the_field_is_weighed_only_where_the_run_takes_it() -> None:
    slow = _measured(0.025, 5e-9)

    def plans(config: TrainConfig, shape: ModelShape = SHAPE) -> set[str]:
        return {c.evaluation for c in rank_candidates(WORK, shape, config, slow, threads=1, nodes=200_000,
                                                      field_room=1e12)}

    assert plans(TrainConfig(evaluation_plan="field")) == {"field"}  # asked for: priced as it will run
    assert plans(TrainConfig(evaluation_plan="cover")) == {"cover"}  # another plan asked for: kept, not replaced
    assert plans(TrainConfig(model="gat"), ModelShape((128, 128, 128, 47), kind="gat")) == {"same"}
    assert plans(TrainConfig(replication=2)) == {"same"}


def test_the_field_grows_from_its_first_ring_up_to_the_graph() -> None:
    # own 100k rows, a halo of 60k: S_3 = 100k, S_2 = 160k, then x1.6 a ring, at most N
    assert field_sizes(WORK, 3, 200_000)[0].tolist() == [200_000, 200_000, 160_000, 100_000]
    assert field_sizes(WORK, 3, 1_000_000)[0].tolist() == pytest.approx([409_600, 256_000, 160_000, 100_000])
    evaluation = predict_field_evaluation(WORK, SHAPE, RATES, Network("n", 1e-5, 1e-9, 1e-5, 1e-9), 200_000)
    assert evaluation.exchange == 0.0 and evaluation.compute > 0.0


def test_free_memory_per_rank_is_what_the_node_has_beyond_the_estimates() -> None:
    from runners.resources import free_memory_per_rank

    available = 8 << 30

    def record(estimates: list[int], hosts: list[str]) -> dict:
        return {"estimate_per_rank": estimates, "host_per_rank": hosts, "available_per_node": {"a": available,
                                                                                                "b": available}}

    assert free_memory_per_rank(None) is None
    assert free_memory_per_rank(record([1 << 20], ["a"])) == available - (1 << 20)
    assert free_memory_per_rank(record([available * 2], ["a"])) == 0.0
    # two ranks on node a share its memory; node b's one rank has more: the smaller share counts
    assert free_memory_per_rank(record([1 << 30, 1 << 30, 1 << 30], ["a", "a", "b"])) == (available - (2 << 30)) / 2
