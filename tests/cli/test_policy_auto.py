"""``train --policy auto`` under real mpiexec on Cora: it measures, says its choice and the runner-up once, records
every candidate, and trains with the choice (the config record's policies are the chosen ones); a resumed run
keeps its first leg's choice; flags that contradict it are refused before MPI starts. The ranking itself:
tests/unit/runners/test_policy_auto.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from datasets_for_tests import cora, write
from mpirun import BIN, run_mpi
from refusals import refused

SPARSE_DIST = str(BIN / "sparse-dist")


@pytest.fixture(scope="module")
def cora_shards(tmp_path_factory) -> Path:
    return write(cora(), tmp_path_factory.mktemp("auto") / "cora", parts=12, partitioner="block")


def _train(data: Path, out: Path, ranks: int, *extra: str) -> tuple[str, list[dict[str, Any]]]:
    result = run_mpi(ranks, [SPARSE_DIST, "train", "--data", str(data), "--threads", "1", "--print-every", "1000",
                             "--policy", "auto", "--out", str(out), *extra], timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Warning" not in result.stderr, result.stderr  # its probes' torch notices are not the user's
    return result.stdout, [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def test_auto_says_its_choice_once_and_trains_with_it(cora_shards: Path, tmp_path: Path) -> None:
    said, records = _train(cora_shards, tmp_path / "a.jsonl", 3, "--epochs", "3")  # 3 ranks: rows not divided
    assert said.count("policy auto: chose ") == 1 and said.count("policy auto: runner-up ") == 1, said
    config = next(r for r in records if r["type"] == "config")
    auto = next(r for r in records if r["type"] == "policy_auto")
    chosen, candidates = auto["chosen"], auto["candidates"]
    assert (config["sample"], config["compress"], config["evaluation_plan"]) == (
        chosen["sample"], chosen["compress"], chosen["evaluation_plan"])
    # every sampling x compression, evaluated on the plan and from the receptive field (Cora's fits anywhere)
    assert candidates[0] == chosen and len(candidates) == 18
    assert sorted(c["evaluation_plan"] for c in candidates) == ["field"] * 9 + ["same"] * 9
    assert [c["time_to_accuracy"] for c in candidates] == sorted(c["time_to_accuracy"] for c in candidates)
    assert auto["measured"]["alpha"] > 0 and auto["measured"]["gb_per_s"] > 0
    assert all(auto["measured"]["codec_seconds_per_value"][c] > 0 for c in ("int8,feedback", "adaptive,feedback"))
    assert sum(r["type"] == "epoch" for r in records) == 3


@pytest.mark.slow
def test_a_resumed_auto_run_keeps_its_first_legs_choice(cora_shards: Path, tmp_path: Path) -> None:
    """The choice is in the checkpoint's configuration; a second measurement could choose otherwise and the
    checkpoint would not fit."""
    checkpoint = tmp_path / "run.ckpt"
    _, first = _train(cora_shards, tmp_path / "a.jsonl", 2, "--epochs", "3", "--checkpoint", str(checkpoint))
    said, records = _train(cora_shards, tmp_path / "a.jsonl", 2, "--epochs", "5", "--checkpoint", str(checkpoint),
                           "--resume")
    assert "policy auto: chose" not in said and "resumed from" in said, said
    chosen = next(r for r in first if r["type"] == "policy_auto")["chosen"]
    assert [r["epoch"] for r in records if r["type"] == "epoch"] == [1, 2, 3, 4, 5]
    leg = next(r for r in records if r["type"] == "leg")
    assert (leg["config"]["sample"], leg["config"]["compress"], leg["config"]["evaluation_plan"]) == (
        chosen["sample"], chosen["compress"], chosen["evaluation_plan"]), leg


@pytest.mark.parametrize("flags,sentence", [
    (["--sample", "bns:keep=0.1"], "--policy auto chooses the sampling and compression itself; leave --sample out"),
    (["--compress", "int8"], "leave --compress out"),
    (["--plan", "cover"], "which --plan cover knows only from the covers the run computes"),
    (["--mode", "minibatch"], "--policy auto is for full-graph training"),
])
def test_flags_that_contradict_auto_are_refused(flags: list[str], sentence: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    said = refused(["train", "--data", "/no/such/dataset", "--policy", "auto", *flags], capsys)
    assert sentence in said, said
