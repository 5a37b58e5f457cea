"""A checkpoint's per-rank policy state rewritten by a forger (its checksum and the pointer's digest fixed, as
test_refusals does for shards): the resume refuses it in one sentence naming the field, said once, before any
of it is used. Before these checks a cached block's column ids of 10^8 were accepted and the run went on."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from datasets_for_tests import cora, write
from mpirun import BIN, run_mpi

from algorithms.checkpoint import load_checkpoint, read_pointer, save_checkpoint
from sparse_dist import state_checks as checks

SPARSE_DIST = str(BIN / "sparse-dist")
RANK_FILE = "rank00000.ckpt"


@pytest.fixture(scope="module")
def cora_shards(tmp_path_factory) -> Path:
    return write(cora(), tmp_path_factory.mktemp("forged") / "cora", parts=2, partitioner="block")


def _forge(pointer: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite rank 0's policy file with ``edit`` and fix its header and the pointer's digest."""
    found = read_pointer(pointer)
    state = load_checkpoint(found.directory / RANK_FILE)
    edit(state)
    digest = save_checkpoint(found.directory / RANK_FILE, state)
    saved = load_checkpoint(pointer)
    saved["files"][RANK_FILE] = digest
    save_checkpoint(pointer, saved)


def _first(table: dict[Any, Any]) -> Any:
    return table[next(iter(table))]


def _cache(state: dict[str, Any]) -> dict[str, Any]:
    return _first(state["strategy"]["cache"])


def _set(table: dict[Any, Any], key: str, value: Any) -> None:
    table[key] = value


def _kept_rows(state: dict[str, Any]) -> dict[Any, torch.Tensor]:
    return _first(state["strategy"]["rows"])[0]["rows"]


CASES = {  # name: (policy flags, edit, the clause the refusal must hold)
    "cached column ids out of range": (
        ["--plan", "dense-bcast", "--stale", "sancus-e:eps=1"],
        lambda s: _cache(s)["indices"].fill_(10**8), "column ids holds ids outside [0,"),
    "cached row pointers that decrease": (
        ["--plan", "dense-bcast", "--stale", "sancus-e:eps=1"],
        lambda s: _cache(s)["indptr"].__setitem__(1, 10**6), "row pointers"),
    "cached rows of another height": (
        ["--plan", "dense-bcast", "--stale", "sancus-e:eps=1"],
        lambda s: _set(_cache(s), "values", _cache(s)["values"][:-1]), "rows has"),
    "cached block of another shape": (
        ["--plan", "dense-bcast", "--stale", "sancus-e:eps=1"],
        lambda s: _set(_cache(s), "shape", [5, 5]), "this run's block is"),
    "kept pipelined rows that are not numbers": (
        ["--stale", "pipe:tau=1"],
        lambda s: _kept_rows(s).update({k: torch.full_like(v, float("nan")) for k, v in _kept_rows(s).items()}),
        "holds non-finite values"),
    "feedback residuals of text": (
        ["--compress", "int8,feedback"],
        lambda s: s["codec"]["residuals"].update({k: "x" for k in s["codec"]["residuals"]}),
        "the feedback residual"),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n == "cached column ids out of range"
                                               else pytest.mark.slow) for n in CASES])
def test_a_forged_policy_state_is_refused_in_one_sentence(cora_shards: Path, tmp_path: Path, name: str) -> None:
    flags, edit, clause = CASES[name]
    pointer = tmp_path / "run.ckpt"
    base = [SPARSE_DIST, "train", "--data", str(cora_shards), "--threads", "1", "--print-every", "1000",
            "--checkpoint", str(pointer), *flags]
    first = run_mpi(2, [*base, "--epochs", "4", "--out", str(tmp_path / "a.jsonl")], timeout=180)
    assert first.returncode == 0, first.stdout + first.stderr
    _forge(pointer, edit)
    resumed = run_mpi(2, [*base, "--epochs", "8", "--resume", "--out", str(tmp_path / "a.jsonl")], timeout=180)
    said = resumed.stderr
    assert resumed.returncode != 0
    assert "its policy state for rank 0 does not fit this run: " in said and clause in said, said
    assert said.count("error:") == 1 and "Traceback" not in said, said


@pytest.mark.parametrize("entry,clause", [
    ({"shape": [2, 3], "indptr": torch.tensor([0, 2, 1]), "indices": torch.tensor([0, 1]),
      "data": torch.ones(2)}, "row pointers"),
    ({"shape": [2, 3], "indptr": torch.tensor([0, 1, 2]), "indices": torch.tensor([0, 3]),
      "data": torch.ones(2)}, "outside [0, 3)"),
    ({"shape": [2, 3], "indptr": torch.tensor([0, 1, 2]), "indices": torch.tensor([0, 1]),
      "data": torch.tensor([1.0, float("inf")])}, "non-finite"),
    ({"shape": [2, 3], "indptr": torch.tensor([0, 1, 2]), "indices": torch.tensor([0, 1]),
      "data": torch.ones(3)}, "3 values for 2 column ids"),
    ({"shape": [2, 9], "indptr": torch.tensor([0, 1, 2]), "indices": torch.tensor([0, 1]),
      "data": torch.ones(2)}, "at most 3"),
    ({"shape": "2x3"}, "not two sizes"),
    ({"shape": [2, 3], "indptr": torch.tensor([0.0, 1.0, 2.0]), "indices": torch.tensor([0, 1]),
      "data": torch.ones(2)}, "expected integer values"),
])
def test_csr_checks_name_the_first_broken_field(entry: dict[str, Any], clause: str) -> None:
    with pytest.raises(checks.StateError, match=None) as info:
        checks.csr(entry, "block", 2, 3)
    assert clause in str(info.value), str(info.value)


def test_a_well_formed_csr_passes() -> None:
    entry = {"shape": [2, 3], "indptr": torch.tensor([0, 1, 1]), "indices": torch.tensor([2]), "data": torch.ones(1)}
    indptr, indices, data, shape = checks.csr(entry, "block", 2, 3)
    assert shape == (2, 3) and indices.tolist() == [2] and indptr.tolist() == [0, 1, 1]
