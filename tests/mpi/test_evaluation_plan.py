"""``--evaluation-plan cover``: exact evaluations on a cover plan of their own beside a sampled p2p training;
``--evaluation-plan field``: from the receptive field each rank holds (tests/mpi/cases/field_cases.py).

Under real mpiexec: tests/mpi/cases/evaluation_plan_cases.py (one launch of 4 ranks: P = 2, 3 with an empty row
group, 4, and c = 2, against one process and against the same run evaluated on its training plan); a whole
``train`` run steered and overlapped, whose every reported accuracy is the same-plan run's with fewer evaluation
bytes. Its refusals, said before MPI starts, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from datasets_for_tests import cora, write
from mpirun import BIN, run_case, run_mpi
from refusals import refused

SPARSE_DIST = str(BIN / "sparse-dist")
METRICS = ("train_acc", "val_acc", "test_acc")


def test_cover_evaluations_equal_one_process_and_the_training_plans_evaluations() -> None:
    result = run_case(4, "evaluation_plan_cases.py", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "evaluation plan cases (32 runs on this rank): all checks pass" in result.stdout, (result.stdout
                                                                                             + result.stderr)


def test_field_evaluations_equal_one_process_and_the_training_plans_evaluations() -> None:
    result = run_case(4, "field_cases.py", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "field evaluation cases (32 runs on this rank): all checks pass" in result.stdout, (result.stdout
                                                                                              + result.stderr)


def _train(data: Path, out: Path, *extra: str) -> list[dict[str, Any]]:
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(data), "--threads", "1", "--print-every", "1000",
                         "--epochs", "12", "--sample", "psc:budget=0.3", "--steer-evaluation", "--eval-every", "3",
                         "--overlap-evaluation", "--out", str(out), *extra], timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def test_a_steered_overlapped_run_reports_the_same_accuracies_with_fewer_bytes(tmp_path: Path) -> None:
    """The evaluation beside the next step (in turns, on its own duplicate communicator) on the cover plan, and from
    the receptive field: every epoch's metrics are the same-plan run's (to one node's tie), its evaluations move
    fewer bytes (the field's none), the training (losses, bytes) the same."""
    graph = cora()
    data = write(graph, tmp_path / "cora", parts=2)
    # the same weights give the same accuracies; a node whose two best logits lie within float32's rounding of
    # each other may go either way when partial sums are added in another order: one node a split at most
    one_node = {f"{split}_acc": 1.0 / int(graph.masks[split].sum()) for split in ("train", "val", "test")}
    same = _train(data, tmp_path / "same.jsonl")
    assert "evaluation_plan_setup_seconds" not in next(r for r in same if r["type"] == "setup")
    reference = {r["epoch"]: r for r in same if r["type"] == "epoch"}
    for evaluation_plan in ("cover", "field"):
        other = _train(data, tmp_path / f"{evaluation_plan}.jsonl", "--evaluation-plan", evaluation_plan)
        setup = next(r for r in other if r["type"] == "setup")
        assert setup["evaluation_plan_setup_seconds"]["max"] > 0
        assert ("evaluation_field" in setup) == (evaluation_plan == "field")  # what the field keeps, per rank
        rows = {r["epoch"]: r for r in other if r["type"] == "epoch"}
        assert sorted(rows) == sorted(reference) == list(range(1, 13))
        evaluated = 0
        for epoch, row in rows.items():
            assert row["loss"] == reference[epoch]["loss"]
            assert row["bytes"]["forward"] == reference[epoch]["bytes"]["forward"]
            assert all(abs(row[k] - reference[epoch][k]) <= one_node[k] * 1.001 for k in METRICS)
            assert ("eval_bytes" in row) == ("eval_bytes" in reference[epoch])
            if "eval_bytes" in row:
                evaluated += 1
                sent = row["eval_bytes"]["forward"]["sent"]["max"]
                assert sent < reference[epoch]["eval_bytes"]["forward"]["sent"]["max"]
                assert sent == 0 or evaluation_plan == "cover", (evaluation_plan, row["eval_bytes"])
        assert evaluated >= 4  # first, every 3 epochs, last
        assert abs(other[-1]["test_acc"] - same[-1]["test_acc"]) <= one_node["test_acc"] * 1.001


@pytest.mark.parametrize("plan,argv,sentence", [
    ("cover", ["--layer-kind", "gat"], "attention (gat) weighs each edge by its source row itself"),
    ("field", ["--layer-kind", "gat"], "attention (gat) weighs each edge by its rows' scores through its operator"),
    ("cover", ["--mode", "minibatch"], "is for 1D full-graph training"),
    ("field", ["--grid", "2,1,1"], "is for 1D full-graph training"),
])
def test_evaluation_plan_refusals_are_one_sentence(plan: str, argv: list[str], sentence: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    said = refused(["train", "--data", "d", "--evaluation-plan", plan, *argv], capsys)
    assert sentence in said, said
