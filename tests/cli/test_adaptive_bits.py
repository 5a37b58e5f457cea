"""``--compress adaptive`` under mpiexec: a run resumed from a checkpoint codes its messages at the widths the
uninterrupted run agreed (the widths are replicated state), to the same weights bitwise at the same P; at
another P it starts from the checkpoint's widths, not from 8 bits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from datasets_for_tests import cora, write
from mpirun import BIN, run_mpi

from algorithms.checkpoint import MAIN_FILE, read_pointer

SPARSE_DIST = str(BIN / "sparse-dist")
FLAGS = ["--compress", "adaptive,feedback", "--threads", "1", "--print-every", "1000", "--plan", "p2p",
         "--input-exchange", "per-epoch"]


@pytest.fixture(scope="module")
def cora_shards(tmp_path_factory) -> Path:
    return write(cora(), tmp_path_factory.mktemp("adaptive") / "cora")


def _train(data: Path, out: Path, ranks: int, *extra: str) -> dict[int, dict]:
    result = run_mpi(ranks, [SPARSE_DIST, "train", "--data", str(data), *FLAGS, "--out", str(out), *extra],
                     timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    return {r["epoch"]: r for r in map(json.loads, out.read_text().splitlines()) if r["type"] == "epoch"}


@pytest.mark.slow
def test_a_resumed_run_codes_at_the_widths_the_uninterrupted_run_agreed(cora_shards: Path, tmp_path: Path) -> None:
    whole_ckpt, legs_ckpt = tmp_path / "whole.ckpt", tmp_path / "legs.ckpt"
    whole = _train(cora_shards, tmp_path / "whole.jsonl", 2, "--epochs", "10", "--checkpoint", str(whole_ckpt))
    assert any(bits != 8 for bits in whole[6]["bit_widths"]["used"].values())  # the widths did change
    _train(cora_shards, tmp_path / "legs.jsonl", 2, "--epochs", "5", "--checkpoint", str(legs_ckpt))
    legs = _train(cora_shards, tmp_path / "legs.jsonl", 2, "--epochs", "10", "--checkpoint", str(legs_ckpt),
                  "--resume")
    for epoch in range(6, 11):
        assert legs[epoch]["bit_widths"] == whole[epoch]["bit_widths"], epoch
        assert legs[epoch]["loss"] == whole[epoch]["loss"], epoch
    a, b = (read_pointer(p).load(MAIN_FILE)["model"] for p in (whole_ckpt, legs_ckpt))
    assert all(torch.equal(a[name], b[name]) for name in a)
    # at P = 3 the residuals restart at zero, the widths do not
    other = tmp_path / "other.ckpt"
    _train(cora_shards, tmp_path / "other.jsonl", 2, "--epochs", "5", "--checkpoint", str(other))
    elsewhere = _train(cora_shards, tmp_path / "other.jsonl", 3, "--epochs", "6", "--checkpoint", str(other),
                       "--resume")
    assert elsewhere[6]["bit_widths"]["used"] == whole[6]["bit_widths"]["used"]
