"""``train --audit-every K``: an exact forward beside the policy's, its figures kept apart from training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from datasets_for_tests import random_directed, write
from mpirun import BIN, run_mpi

SPARSE_DIST = str(BIN / "sparse-dist")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(random_directed(n=300, seed=3), tmp_path_factory.mktemp("audit") / "data", parts=2)


def _epochs(data: Path, out: Path, *flags: str) -> list[dict]:
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(data), "--epochs", "4", "--print-every", "100",
                         "--out", str(out), *flags], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return [r for r in map(json.loads, out.read_text().splitlines()) if r["type"] == "epoch"]


@pytest.mark.slow
def test_the_exact_path_audits_to_zero_and_the_audit_moves_no_training_byte(data: Path, tmp_path: Path) -> None:
    flags = ["--plan", "sparse-bcast", "--input-exchange", "per-epoch"]
    audited = _epochs(data, tmp_path / "a.jsonl", *flags, "--audit-every", "2")
    plain = _epochs(data, tmp_path / "p.jsonl", *flags)
    assert [("audit" in e) for e in audited] == [False, True, False, True]
    for epoch in (audited[1], audited[3]):
        assert len(epoch["audit"]["layer_error"]) == 2 and max(epoch["audit"]["layer_error"]) < 1e-6
        assert epoch["audit"]["bytes"]["forward"]["recv"]["max"] > 0  # the audit's own exact forward
        assert epoch["audit"]["seconds"]["max"] > 0
    for mine, theirs in zip(audited, plain):
        assert mine["loss"] == theirs["loss"]
        assert mine["bytes"] == theirs["bytes"]  # training figures exclude the audit's exchanges


@pytest.mark.parametrize("flags", [["--plan", "p2p", "--sample", "bns:p=0.5"],
                                   ["--plan", "dense-bcast", "--stale", "sancus-e:eps=1"]])
def test_a_policy_audits_to_its_error_against_the_exact_forward(data: Path, tmp_path: Path, flags: list[str]) -> None:
    # every epoch of bns samples; epochs 2 and 4 of sancus-e:eps=1 reuse blocks cached one step earlier
    epochs = _epochs(data, tmp_path / "r.jsonl", *flags, "--input-exchange", "per-epoch", "--audit-every", "2")
    for epoch in (epochs[1], epochs[3]):
        errors = epoch["audit"]["layer_error"]
        assert errors[0] > 1e-4 and errors[-1] > 1e-4, errors


def test_a_negative_audit_interval_is_refused_before_mpi(data: Path) -> None:
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(data), "--audit-every", "-1"], timeout=60)
    assert result.returncode == 2 and "argument --audit-every: must be an integer >= 0 and <= 10000000, got -1" in result.stderr
