"""The study table counts a mini-batch run's sampling rounds and feature pulls as exchange bytes
(runners/study/collect.py), and leaves a full-graph run's figures as they were."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from runners.study.collect import summarise_run, write_csv

CONFIG = {"type": "config", "world_size": 2, "replication": 1, "plan": "p2p", "sample": "none", "stale": "none",
          "seed": 0, "model": "sage", "hidden": 8, "layers": 2, "dtype": "float32", "data": "d"}
FINAL = {"type": "final", "epochs": 2, "test_acc": 0.5, "val_acc": 0.4, "peak_memory_per_rank": [{"rss": 7}]}


def _epoch(n: int, sent: dict[str, float]) -> dict:
    """An epoch record whose ranks each sent (and received) ``sent[phase]`` bytes, the max rank twice that."""
    return {"type": "epoch", "epoch": n, "loss": 1.0, "val_acc": 0.4, "wall": float(n),
            "time": {"total": {"min": 1.0, "mean": 1.0, "max": 1.0}},
            "bytes": {phase: {side: {"min": 0, "mean": value, "max": 2 * value} for side in ("sent", "recv")}
                      for phase, value in sent.items()}}


def _row(epochs: list[dict]) -> dict:
    return summarise_run([CONFIG, *epochs, FINAL], 0, {"run": "x"})


def test_a_minibatch_runs_sample_and_fetch_bytes_are_its_exchange_bytes(tmp_path: Path) -> None:
    mini = {"forward": 0, "backward": 0, "grad_allreduce": 50, "sample": 1000, "fetch": 300}
    # as the mini-batch trainer writes them: no broadcast decisions (None), its own step parts
    row = _row([{**_epoch(n, {**mini, "sample": sample}), "broadcasts": None,
                 "time": {part: {"min": 1.0, "mean": 1.0, "max": 1.0}
                          for part in ("total", "sample", "fetch", "compute", "allreduce", "wait")}}
                for n, sample in ((1, 1000), (2, 3000))])
    assert row["broadcast_fraction"] is None and row["epoch_time"] == 1.0
    assert row["sample_bytes"] == pytest.approx((1000 + 3000) / 2 * 2)  # mean over epochs, times P
    assert row["fetch_bytes"] == pytest.approx(300 * 2)
    assert row["exchange_bytes"] == pytest.approx(row["sample_bytes"] + row["fetch_bytes"])
    assert row["exchange_bytes"] > 0
    assert row["exchange_bytes_max_rank"] == pytest.approx(((2000 + 600) * 2 + (6000 + 600) * 2) / 2)
    assert row["allreduce_bytes"] == pytest.approx(100)
    write_csv(tmp_path / "results.csv", [row])
    with open(tmp_path / "results.csv", newline="") as handle:
        written = next(csv.DictReader(handle))
    assert float(written["exchange_bytes"]) == row["exchange_bytes"] and float(written["fetch_bytes"]) == 600


@pytest.mark.parametrize("phases", [("forward", "backward", "grad_allreduce", "other"),  # a file older than them
                                    ("forward", "backward", "grad_allreduce", "sample", "fetch", "other")])
def test_a_full_graph_runs_exchange_bytes_stay_forward_plus_backward(phases: tuple[str, ...]) -> None:
    sent = {phase: {"forward": 200, "backward": 100}.get(phase, 0) for phase in phases}
    row = _row([_epoch(1, sent)])
    assert row["exchange_bytes"] == pytest.approx(300 * 2) and row["exchange_bytes_max_rank"] == pytest.approx(1200)
    assert row["sample_bytes"] == row["fetch_bytes"] == 0


def test_a_policys_own_time_parts_are_t_policy_and_stay_out_of_t_dense() -> None:
    """dgs books its explanation as ``explain`` in the epochs that explain: ``t_policy`` is its mean over the
    timed epochs; the known parts stay where they were; a mini-batch run's own parts are not a policy's."""
    traffic = {"forward": 1, "backward": 1, "grad_allreduce": 1}

    def timed(parts: dict[str, float]) -> dict:
        return {part: {"min": v, "mean": v, "max": v} for part, v in {"total": 1.0, **parts}.items()}
    explaining = [{**_epoch(n, traffic), "time": timed({"local_spmm": 0.2, "dense": 0.3,
                                                               **({"explain": 3.0} if n == 2 else {})})}
                  for n in (1, 2, 3)]
    row = _row(explaining)
    assert row["t_policy"] == pytest.approx(1.0) and row["t_dense"] == pytest.approx(0.3)
    assert row["t_local_spmm"] == pytest.approx(0.2)
    assert _row([{**_epoch(1, traffic), "time": timed({"dense": 0.3})}])["t_policy"] == 0.0
    mini = {**CONFIG, "mode": "minibatch"}
    minibatch = summarise_run([mini, {**_epoch(1, {**traffic, "sample": 1}), "broadcasts": None,
                                      "time": timed({"sample": 0.4, "compute": 0.5})}, FINAL], 0, {"run": "m"})
    assert minibatch["t_policy"] == 0.0


def test_the_waits_are_their_own_columns_not_a_policys_and_zero_in_older_files(tmp_path: Path) -> None:
    """``exchange_wait`` and ``allreduce_wait`` become ``t_exchange_wait`` and ``t_allreduce_wait`` beside
    ``t_exchange`` and ``t_allreduce`` (not ``t_policy``); a file older than the split reads as 0 waits."""
    traffic = {"forward": 1, "backward": 1, "grad_allreduce": 1}
    parts = {"local_spmm": 0.1, "exchange": 0.2, "exchange_wait": 0.3, "allreduce": 0.05, "allreduce_wait": 0.15,
             "dense": 0.2}
    timed = {part: {"min": v, "mean": v, "max": v} for part, v in {"total": 1.0, **parts}.items()}
    row = _row([{**_epoch(1, traffic), "time": timed}])
    assert row["t_exchange"] == pytest.approx(0.2) and row["t_exchange_wait"] == pytest.approx(0.3)
    assert row["t_allreduce"] == pytest.approx(0.05) and row["t_allreduce_wait"] == pytest.approx(0.15)
    assert row["t_policy"] == 0.0
    breakdown = ("t_local_spmm", "t_dense", "t_exchange", "t_exchange_wait", "t_allreduce", "t_allreduce_wait")
    assert sum(row[key] for key in breakdown) == pytest.approx(row["epoch_time_mean_rank"])
    write_csv(tmp_path / "results.csv", [row])
    with open(tmp_path / "results.csv", newline="") as handle:
        written = next(csv.DictReader(handle))
    assert float(written["t_exchange_wait"]) == pytest.approx(0.3)
    older = {part: value for part, value in timed.items() if not part.endswith("_wait")}
    row = _row([{**_epoch(1, traffic), "time": older}])
    assert row["t_exchange_wait"] == row["t_allreduce_wait"] == 0.0 and row["t_policy"] == 0.0


@pytest.mark.parametrize("alongside", [False, True])
def test_the_cycle_is_the_wall_between_rows_and_an_evaluation_beside_a_step_books_its_turns(alongside: bool) -> None:
    """``cycle_time``: the mean gap between consecutive rows' ``wall`` (the last gap left out where the last
    evaluation ran after its own step, nothing beside it); turns and evaluation bytes as written."""
    walls = [5.0, 7.0, 10.0, 13.5, 14.0]  # gaps 2, 3, 3.5, 0.5 (the last: an evaluation alone)
    epochs = [{**_epoch(n, {"forward": 10, "backward": 10, "grad_allreduce": 1}), "wall": wall,
               "eval_bytes": {"forward": {side: {"min": 0, "mean": 40, "max": 40} for side in ("sent", "recv")},
                              "other": {side: {"min": 0, "mean": 8, "max": 8} for side in ("sent", "recv")}},
               **({"evaluation_turns": {"min": 0.1, "mean": 0.2 * n, "max": 0.3}} if alongside and n < 5 else {})}
              for n, wall in enumerate(walls, 1)]
    row = summarise_run([{**CONFIG, "overlap_evaluation": alongside, "eval_every": 1}, *epochs, FINAL], 1, {})
    assert row["overlap_evaluation"] is alongside and row["eval_every"] == 1
    assert row["cycle_time"] == pytest.approx((3 + 3.5) / 2 if alongside else (3 + 3.5 + 0.5) / 3)
    assert row["t_evaluation_turns"] == pytest.approx((0.4 + 0.6 + 0.8) / 3 if alongside else 0.0)
    assert row["eval_bytes"] == pytest.approx(40 * 2)  # the evaluation's forward, all ranks; "other" is not
    older = summarise_run([CONFIG, *[{k: v for k, v in e.items() if k not in ("wall", "eval_bytes")}
                                     for e in epochs], FINAL], 1, {})
    assert older["cycle_time"] is None and older["eval_bytes"] is None and older["eval_every"] == 1


def test_a_steered_run_books_its_measured_epochs_per_evaluation() -> None:
    """``--steer-evaluation``: ``eval_every`` is the timed epochs per evaluation the run made (the cost model's
    cycle uses it), not the flag's ceiling."""
    evaluated = {1, 2, 5}
    epochs = [{**_epoch(n, {"forward": 10, "backward": 10, "grad_allreduce": 1}), "wall": float(n),
               **({"eval_bytes": {"forward": {side: {"min": 0, "mean": 40, "max": 40} for side in ("sent", "recv")}}}
                  if n in evaluated else {})} for n in range(1, 6)]
    steered = summarise_run([{**CONFIG, "eval_every": 10, "steer_evaluation": True}, *epochs, FINAL], 1, {})
    flagged = summarise_run([{**CONFIG, "eval_every": 10}, *epochs, FINAL], 1, {})
    assert steered["eval_every"] == pytest.approx(4 / 2)  # the timed epochs 2-5, evaluated at 2 and 5
    assert flagged["eval_every"] == 10
