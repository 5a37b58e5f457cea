"""Checkpoint sets (algorithms/checkpoint.py) in one process: the pointer, its set, leftovers, refusals.

The multi-rank behaviour (kills at every point of a commit, elastic resume) is in test_checkpoint_mpi.py.
"""

from pathlib import Path
from typing import Any

import pytest
import torch

from algorithms.checkpoint import (MAIN_FILE, CheckpointError, SetWriter, checkpoint_mismatch, load_checkpoint,
                                   rank_file, read_pointer, remove_leftovers, save_checkpoint)


class OneRank:
    """The part of a Communicator that SetWriter uses, for a world of one rank."""

    rank, size = 0, 1

    def allgather_object(self, value: Any) -> list[Any]:
        return [value]


def _commit(path: Path, epoch: int, writer: SetWriter | None = None) -> SetWriter:
    writer = writer or SetWriter(OneRank(), path, replication=1, plan="p2p")  # type: ignore[arg-type]
    writer.commit(epoch, {"epoch": epoch, "w": torch.full((3,), float(epoch))}, {"rank": 0, "epoch": epoch})
    return writer


def test_a_commit_makes_the_new_set_current_and_removes_the_previous_one(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    writer = _commit(path, 2)
    first = read_pointer(path)
    assert first.epoch == 2 and first.directory.name == f"run.ckpt.e000002.{writer.token}"
    assert sorted(first.files) == [MAIN_FILE, rank_file(0)] and first.has_rank_files
    _commit(path, 4, writer)
    current = read_pointer(path)
    assert current.epoch == 4 and current.load(MAIN_FILE)["w"].tolist() == [4.0, 4.0, 4.0]
    assert current.load(rank_file(0))["epoch"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.ckpt", current.directory.name]
    assert sorted(p.name for p in current.directory.iterdir()) == [MAIN_FILE, rank_file(0)]


def test_leftovers_are_removed_but_nothing_the_project_did_not_write(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    _commit(path, 2)
    current = read_pointer(path).directory.name
    interrupted = tmp_path / "run.ckpt.e000004.0123abcd"  # a set whose commit never happened
    interrupted.mkdir()
    (interrupted / MAIN_FILE).write_bytes(b"x")
    (interrupted / ".rank00001.ckpt.tmp-77").write_bytes(b"half")
    with_notes = tmp_path / "run.ckpt.e000006.89abcdef"
    with_notes.mkdir()
    (with_notes / MAIN_FILE).write_bytes(b"x")
    (with_notes / "notes.txt").write_text("mine")  # not ours: it and its directory stay
    (tmp_path / ".run.ckpt.tmp-4242").write_bytes(b"pointer temporary")
    (tmp_path / ".run.ckpt.rank00003.tmp-9").write_bytes(b"single-file format temporary")
    for foreign in ("run.ckpt.backup", "run.ckpt.e000008.nothex!!", ".run.ckpt.tmp-x", "other.ckpt.e000002.0123abcd"):
        (tmp_path / foreign).mkdir()
    removed = remove_leftovers(path, keep=current)
    assert sorted(removed) == [".run.ckpt.rank00003.tmp-9", ".run.ckpt.tmp-4242", interrupted.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".run.ckpt.tmp-x", "other.ckpt.e000002.0123abcd", "run.ckpt", "run.ckpt.backup", "run.ckpt.e000008.nothex!!",
         current, with_notes.name])
    assert sorted(p.name for p in with_notes.iterdir()) == ["notes.txt"]
    assert read_pointer(path).load(MAIN_FILE)["epoch"] == 2  # the current set untouched


def test_only_temporaries_go_when_sets_are_not_to_be_touched(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    (tmp_path / "run.ckpt.e000004.0123abcd").mkdir()
    (tmp_path / ".run.ckpt.tmp-1").write_bytes(b"")
    assert remove_leftovers(path, keep=None, sets=False) == [".run.ckpt.tmp-1"]
    assert (tmp_path / "run.ckpt.e000004.0123abcd").is_dir()


def test_a_set_file_that_is_not_the_pointers_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.ckpt"
    _commit(path, 2)
    current = read_pointer(path)
    save_checkpoint(current.directory / MAIN_FILE, {"epoch": 2, "w": torch.zeros(3)})  # valid file, other content
    with pytest.raises(CheckpointError, match="not the file the pointer .* names"):
        current.load(MAIN_FILE)
    for name in list(current.directory.iterdir()):
        name.unlink()
    current.directory.rmdir()
    with pytest.raises(CheckpointError, match="names the set .* which is missing"):
        current.load(MAIN_FILE)


def test_old_single_file_checkpoints_and_foreign_pointers_are_refused_in_one_sentence(tmp_path: Path) -> None:
    old = tmp_path / "old.ckpt"
    save_checkpoint(old, {"model": {}, "optimizer": {}, "epoch": 5})
    with pytest.raises(CheckpointError) as caught:
        read_pointer(old)
    assert str(caught.value) == (f"{old}: a checkpoint of the single-file format written before checkpoint sets; "
                                 f"this version cannot resume it (start the run again, or finish it with the "
                                 f"version that wrote it)")
    escaping = tmp_path / "run.ckpt"
    save_checkpoint(escaping, {"kind": "sparse_dist checkpoint set", "set": "../elsewhere", "epoch": 1,
                               "world_size": 1, "replication": 1, "plan": "p2p", "files": {MAIN_FILE: "0" * 64}})
    with pytest.raises(CheckpointError, match="not a sparse_dist checkpoint pointer"):
        read_pointer(escaping)
    escaping.write_bytes(b"plain text")
    with pytest.raises(CheckpointError, match="not a sparse_dist checkpoint"):
        load_checkpoint(escaping)


def test_a_mismatch_names_each_differing_field_with_both_values() -> None:
    state = {"epoch": 30, "config": {"hidden": 16, "lr": 0.01, "heads": 8}, "graph": {"name": "cora", "nodes": 2708}}
    assert checkpoint_mismatch(state, {"hidden": 16, "lr": 0.01, "heads": 8}, {"name": "cora", "nodes": 2708}) is None
    assert checkpoint_mismatch(state, {"hidden": 32, "lr": 0.01}, {"name": "cora", "nodes": 3000}) == (
        "the checkpoint (epoch 30) belongs to another run: hidden 16 in the checkpoint, 32 in this run; heads 8 in "
        "the checkpoint, (not set) in this run; graph nodes 2708 in the checkpoint, 3000 in this run")
