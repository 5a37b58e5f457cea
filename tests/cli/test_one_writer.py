"""One writer per output under real mpiexec: a second job on a running job's ``--out`` or ``--checkpoint`` is
refused in one sentence naming the holder, and the first job's files come out complete; a file at ``--out`` or
``--checkpoint`` that is not ours is refused and left untouched, byte for byte. (A killed holder blocks nobody:
tests/mpi/test_checkpoint.py.)"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from datasets_for_tests import cora, write
from mpirun import BIN, ROOT, finish, mpiexec_path, run_mpi

from algorithms.checkpoint import read_pointer
from runners.output_lock import lock_beside
from runners.results import partial_beside

SPARSE_DIST = str(BIN / "sparse-dist")


@pytest.fixture(scope="module")
def cora_data(tmp_path_factory) -> Path:
    return write(cora(), tmp_path_factory.mktemp("one_writer") / "cora", parts=2, partitioner="block")


def _train(data: Path, *extra: str):
    return run_mpi(2, [SPARSE_DIST, "train", "--data", str(data), "--print-every", "1000", *extra], timeout=120)


@pytest.mark.slow
def test_a_second_job_on_a_running_jobs_outputs_is_refused_and_the_first_completes(cora_data: Path,
                                                                                     tmp_path: Path) -> None:
    out, path = tmp_path / "same.jsonl", tmp_path / "same.ckpt"
    first = subprocess.Popen([mpiexec_path(), "-n", "2", SPARSE_DIST, "train", "--data", str(cora_data), "--epochs",
                              "12", "--seed", "1", "--out", str(out), "--checkpoint", str(path), "--checkpoint-every",
                              "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1", MPIEXEC_TIMEOUT="200"))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None and not (
                partial_beside(out).exists() and '"type": "epoch"' in partial_beside(out).read_text()):
            time.sleep(0.05)
        assert first.poll() is None, first.communicate()
        holder = json.loads(lock_beside(out).read_text())
        assert holder["host"] == socket.gethostname()
        os.kill(holder["pid"], signal.SIGSTOP)  # rank 0 keeps its locks, however long the second job takes to start
        try:
            same = _train(cora_data, "--epochs", "12", "--seed", "2", "--out", str(out), "--checkpoint", str(path))
            other_out = _train(cora_data, "--epochs", "12", "--seed", "2", "--out", str(tmp_path / "other.jsonl"),
                               "--checkpoint", str(path))
        finally:
            os.kill(holder["pid"], signal.SIGCONT)
        for refused, flag, output in ((same, "--out", out), (other_out, "--checkpoint", path)):
            said = refused.stdout + refused.stderr
            assert refused.returncode == 2, said
            assert said.count(f"sparse-dist train: error: {flag} {output} is being written by another run (pid "
                              f"{holder['pid']} on host {holder['host']}, since ") == 1, said
            assert said.count("error") == 1 and "Traceback" not in said, said
        assert not (tmp_path / "other.jsonl").exists() and not partial_beside(tmp_path / "other.jsonl").exists()
        completed = finish(first, 120, "the first job")
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate()
    assert completed.returncode == 0, completed.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]  # every line whole
    assert [r["type"] for r in records].count("config") == 1 and records[0]["seed"] == 1
    assert [r["epoch"] for r in records if r["type"] == "epoch"] == list(range(1, 13))
    assert records[-1]["type"] == "final" and read_pointer(path).epoch == 12


def test_an_existing_file_that_is_not_ours_is_refused_and_left_as_it_was(cora_data: Path, tmp_path: Path) -> None:
    own = tmp_path / "own"
    own.mkdir()
    notes, table = own / "notes.txt", own / "table.csv"
    notes.write_bytes(b"my notes\n\xe2\x9c\x93 done\n")
    table.write_bytes(b"a,b\n1,2\n")
    pointer = _train(cora_data, "--epochs", "2", "--checkpoint", str(notes), "--checkpoint-every", "1")
    results = _train(cora_data, "--epochs", "2", "--out", str(table))
    assert (pointer.returncode, results.returncode) == (2, 2), pointer.stderr + results.stderr
    assert pointer.stderr.count(f"sparse-dist train: error: --checkpoint {notes}: exists and is not a checkpoint of "
                                f"sparse_dist (its first line is not a checkpoint header); pass --overwrite to "
                                f"replace it, or choose another --checkpoint\n") == 1, pointer.stderr
    assert results.stderr.count(f"sparse-dist train: error: --out {table}: {table} exists and is not a results file "
                                f"of sparse_dist (its first line is not a config record); pass --overwrite to "
                                f"replace it, or choose another --out\n") == 1, results.stderr
    assert notes.read_bytes() == b"my notes\n\xe2\x9c\x93 done\n" and table.read_bytes() == b"a,b\n1,2\n"
    assert sorted(p.name for p in own.iterdir()) == ["notes.txt", "table.csv"]  # no lock file, no set, no partial
