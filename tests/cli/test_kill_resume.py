"""Twelve kill -9s of every process of a checkpointing run (mpiexec and its ranks, at seeded random moments:
a third in start-up, the others just after a new checkpoint set, so that kills fall in start-up, epochs and
commits alike),
each followed by ``--resume``, end where an uninterrupted run ends: the same epochs once each with the same
losses and accuracies in ``--out``, and bitwise the same final weights."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from datasets_for_tests import write
from mpirun import BIN, mpiexec_path

from algorithms.checkpoint import CheckpointError, load_checkpoint, read_pointer
from runners.data.datasets import planted_classes

SPARSE_DIST = str(BIN / "sparse-dist")
KILLS = 12  # two thirds of them after a commit: at least five sets committed between kills (asserted)
EPOCHS = 300


def _argv(data: Path, checkpoint: Path, out: Path) -> list[str]:
    return [mpiexec_path(), "-n", "2", SPARSE_DIST, "train", "--data", str(data), "--epochs", str(EPOCHS),
            "--hidden", "64", "--layers", "3", "--checkpoint", str(checkpoint), "--checkpoint-every", "5", "--out", str(out)]


def _start(argv: list[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MPIEXEC_TIMEOUT="200")
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _epochs(out: Path) -> list[tuple[int, float, float, float]]:
    """Each epoch record's (epoch, loss, val, test), in file order."""
    rows = []
    for line in out.read_text().splitlines():
        record = json.loads(line)
        if record["type"] == "epoch":
            rows.append((record["epoch"], record["loss"], record.get("val_acc"), record.get("test_acc")))
    return rows


def _committed(checkpoint: Path) -> int | None:
    """The epoch of the checkpoint's current set, or None (none yet, or its pointer mid-rename)."""
    try:
        return read_pointer(checkpoint).epoch if checkpoint.exists() else None
    except (CheckpointError, OSError):
        return None


def _kill_moment(leg: subprocess.Popen[str], checkpoint: Path, before: int | None, rng: random.Random) -> str:
    """Wait for this leg's moment: a third of the legs in start-up (0.3-1.5 s after launch), the others 0-0.2 s
    after the leg committed its first or second new set (mid-epoch, mid-commit or between); returns it."""
    if rng.random() < 1 / 3:
        pause = rng.uniform(0.3, 1.5)
        time.sleep(pause)
        return f"start+{pause:.2f}s"
    sets = rng.choice((1, 2))
    target = (before or 0) + 5 * sets
    deadline = time.monotonic() + 120
    while leg.poll() is None and time.monotonic() < deadline and (_committed(checkpoint) or 0) < target:
        time.sleep(0.01)
    pause = rng.uniform(0.0, 0.2)
    time.sleep(pause)
    return f"set{target}+{pause:.2f}s"


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(read_pointer(checkpoint).directory / "main.ckpt")["model"]


@pytest.mark.slow
def test_kills_of_every_process_then_resume_end_as_the_uninterrupted_run(tmp_path: Path) -> None:
    # epochs of tens of milliseconds (about 30 ms here at 64 features and hidden 64): a leg's kill lands within a
    # few epochs of its moment even on a loaded machine, where the checkpoint pointer is polled late
    data = write(planted_classes(nodes=20_000, classes=4, degree=8, features=64), tmp_path / "d", parts=2,
                 partitioner="block")
    whole = tmp_path / "whole"
    whole.mkdir()
    reference = _start(_argv(data, whole / "run.ckpt", whole / "r.jsonl"))
    _, err = reference.communicate(timeout=300)
    assert reference.returncode == 0, err
    legs = tmp_path / "legs"
    legs.mkdir()
    argv = _argv(data, legs / "run.ckpt", legs / "r.jsonl")
    rng = random.Random(20261128)
    kills, moments, committed = 0, [], set()
    while kills < KILLS:
        before = _committed(legs / "run.ckpt")
        leg = _start(argv + (["--resume"] if before is not None else []))
        moments.append(_kill_moment(leg, legs / "run.ckpt", before, rng))
        assert leg.poll() is None, f"the run finished after {kills} kills (moments {moments}); lengthen it"
        os.killpg(leg.pid, signal.SIGKILL)
        kills += 1
        _, err = leg.communicate(timeout=60)
        assert leg.returncode == -signal.SIGKILL, err
        committed.add(_committed(legs / "run.ckpt"))
    assert len(committed - {None}) >= 5 and max(committed - {None}) < EPOCHS, (committed, moments)
    last = _start(argv + (["--resume"] if (legs / "run.ckpt").exists() else []))
    _, err = last.communicate(timeout=300)
    assert last.returncode == 0, err
    expected, found = _epochs(whole / "r.jsonl"), _epochs(legs / "r.jsonl")
    assert [row[0] for row in found] == list(range(1, EPOCHS + 1))
    assert found == expected
    mine, theirs = _weights(legs / "run.ckpt"), _weights(whole / "run.ckpt")
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
