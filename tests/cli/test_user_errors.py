"""Every user error is found before work starts, said once per job, without a traceback, and leaves no debris."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from datasets_for_tests import random_directed, write
from mpirun import BIN, ROOT, run_case, run_mpi

from runners.data import shards, stream_synthetic
from runners.data.datasets import DatasetError, load_edge_list, planted_classes
from runners.results import ResultsWriter, output_path_problem

SPARSE_DIST = str(BIN / "sparse-dist")


def _said(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


def _temporaries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp" in p.name)


# ---------------------------------------------------------------- 1. class ids of an edge list
def _edge_list(tmp_path: Path, ids: list[int]) -> tuple[Path, Path, Path]:
    n = len(ids)
    (tmp_path / "edges.txt").write_text("# src dst\n" + "".join(f"{i} {i + 1}\n" for i in range(n - 1)))
    np.save(tmp_path / "x.npy", np.ones((n, 3), dtype=np.float32))
    (tmp_path / "labels.txt").write_text("".join(f"{i}\n" for i in ids))
    return tmp_path / "edges.txt", tmp_path / "x.npy", tmp_path / "labels.txt"


def _ids_with_99() -> list[int]:
    ids = [i % 4 for i in range(20)]
    ids[17] = 99
    return ids


def test_class_ids_must_be_the_distinct_ids_0_to_c_minus_1(tmp_path: Path) -> None:
    edges, x, labels = _edge_list(tmp_path, _ids_with_99())
    with pytest.raises(DatasetError) as info:
        load_edge_list(edges, x, labels)
    assert str(info.value) == (f"{labels}: node 17 has class id 99, but the file's 5 distinct id(s) imply classes "
                               f"0..4 (1 node(s) outside); pass --num-classes 100 if 99 is meant")
    assert load_edge_list(edges, x, labels, num_classes=100).num_classes == 100
    with pytest.raises(DatasetError, match="node 17 has class id 99, but --num-classes 50 means classes 0..49"):
        load_edge_list(edges, x, labels, num_classes=50)
    plain = load_edge_list(*_edge_list(tmp_path, [i % 4 for i in range(20)]))  # a text file: one id per line
    assert plain.num_classes == 4 and not plain.multilabel and plain.labels.tolist()[:5] == [0, 1, 2, 3, 0]


def test_negative_class_ids_are_refused(tmp_path: Path) -> None:
    ids = [i % 3 for i in range(10)]
    ids[4] = -2
    edges, x, labels = _edge_list(tmp_path, ids)
    with pytest.raises(DatasetError, match="node 4 has class id -2; class ids must be 0 or more"):
        load_edge_list(edges, x, labels, num_classes=3)


def _command(*argv: str) -> subprocess.CompletedProcess[str]:
    """``sparse-dist ARGV`` as one process (prepare is single-process), with a timeout."""
    return subprocess.run([SPARSE_DIST, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_prepare_says_the_bad_class_id_once(tmp_path: Path) -> None:
    edges, x, labels = _edge_list(tmp_path, _ids_with_99())
    result = _command("prepare", "edgelist", "--edges", str(edges), "--node-features", str(x),
                      "--labels", str(labels), "--out", str(tmp_path / "d"))
    assert result.returncode == 2, _said(result)
    assert _said(result).count("node 17 has class id 99") == 1, _said(result)
    assert "Traceback" not in _said(result)
    assert not (tmp_path / "d").exists() and _temporaries(tmp_path) == []


def test_bad_prepare_flags_are_refused_before_mpi_starts(tmp_path: Path) -> None:
    result = _command("prepare", "edgelist", "--out", str(tmp_path / "d"), "--labels", "y.npy")
    assert result.returncode == 2, _said(result)
    assert result.stderr.count("sparse-dist prepare: error: prepare edgelist needs --edges, --node-features") == 1
    assert "Traceback" not in _said(result) and "aborting" not in _said(result)


# ---------------------------------------------------------------- 2. train paths, before any shard is read
def test_unusable_train_paths_are_refused_before_the_shards_are_read(tmp_path: Path) -> None:
    data = write(random_directed(), tmp_path / "d", parts=2)
    blob = bytearray((data / "part-00001.npz").read_bytes())
    blob[200] ^= 0xFF  # reading the shards first would report this instead
    (data / "part-00001.npz").write_bytes(bytes(blob))
    (tmp_path / "results").mkdir()
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(data), "--epochs", "1", "--out", str(tmp_path / "results"),
                         "--checkpoint", str(tmp_path / "none.ckpt"), "--resume"], timeout=120)
    assert result.returncode == 2, _said(result)
    said = _said(result)
    assert said.count(f"--out {tmp_path / 'results'}: is a directory; expected the path of a results file") == 1, said
    assert said.count(f"--checkpoint {tmp_path / 'none.ckpt'}: no such file to --resume from") == 1, said
    assert "checksum" not in said and "Traceback" not in said and "aborting" not in said
    assert list((tmp_path / "results").iterdir()) == []


def test_an_output_path_must_lie_in_a_writable_directory(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("")
    assert output_path_problem(tmp_path / "new" / "deeper" / "r.jsonl", "--out", "a file", "r.jsonl") is None
    assert output_path_problem(tmp_path / "plain" / "r.jsonl", "--out", "a file", "r.jsonl") == (
        f"--out {tmp_path / 'plain' / 'r.jsonl'}: {tmp_path / 'plain'} is not a directory; expected the path of "
        f"a file in a directory")
    assert output_path_problem(tmp_path, "--checkpoint", "a checkpoint file", "run.ckpt") == (
        f"--checkpoint {tmp_path}: is a directory; expected the path of a checkpoint file, "
        f"e.g. {tmp_path / 'run.ckpt'}")


# ---------------------------------------------------------------- 3. said once, traceback only with --debug
MISSING = "--data /nonexistent: no such dataset directory"


def test_a_missing_dataset_is_said_once_without_a_traceback() -> None:
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", "/nonexistent", "--epochs", "1"], timeout=120)
    assert result.returncode != 0
    assert _said(result).count(MISSING) == 1, _said(result)
    assert "Traceback" not in _said(result)


def test_debug_shows_the_traceback_of_a_user_error() -> None:
    result = run_mpi(2, [SPARSE_DIST, "--debug", "train", "--data", "/nonexistent", "--epochs", "1"], timeout=120)
    assert result.returncode != 0
    assert "Traceback (most recent call last)" in _said(result) and "PathError" in _said(result)
    assert MISSING in _said(result)


def test_a_user_error_on_one_rank_is_said_once_and_ends_the_job(tmp_path: Path) -> None:
    segments = tmp_path / "segments.txt"
    start = time.monotonic()
    result = run_case(3, "user_error_on_one_rank.py", str(segments), timeout=120)
    assert result.returncode == 2, _said(result)
    assert time.monotonic() - start < 60
    assert _said(result).count("case: error: injected user error on rank 1: input.txt has a bad value") == 1
    assert "Traceback" not in _said(result)
    mapped = segments.read_text().split()
    assert mapped, "rank 1 mapped no MPICH shared-memory segment: nothing to check"
    assert [path for path in mapped if os.path.exists(path)] == []  # MPI_Abort alone would leave them


# ---------------------------------------------------------------- 4. no temporary files after a failure
def _fail_on_second_call(real):
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected failure while writing")
        return real(*args, **kwargs)

    return failing


def test_a_failed_prepare_leaves_no_temporary_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shards, "sha256_file", _fail_on_second_call(shards.sha256_file))
    with pytest.raises(RuntimeError, match="injected"):
        shards.write_shards(planted_classes(nodes=400, classes=2, features=4), tmp_path / "d", parts=2)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_streamed_prepare_leaves_no_temporary_directory(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_synthetic, "_node_data", _fail_on_second_call(stream_synthetic._node_data))
    with pytest.raises(RuntimeError, match="injected"):
        stream_synthetic.write_streamed_synthetic(tmp_path / "d", nodes=400, degree=3, parts=2, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_a_results_writer_streams_to_a_partial_name_until_it_is_closed(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path / "r.jsonl")
    writer.write({"type": "config"})
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl.partial"]  # a run killed now keeps this record
    writer.close()
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]
    assert (tmp_path / "r.jsonl").read_text() == '{"type": "config"}\n'


def test_sigterm_during_prepare_removes_its_temporary_directory(tmp_path: Path) -> None:
    command = [SPARSE_DIST, "prepare", "synthetic", "--stream", "--nodes", "300000", "--degree", "10",
               "--features", "16", "--parts", "4", "--out", str(tmp_path / "big")]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 60
        while not _temporaries(tmp_path) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _temporaries(tmp_path), "prepare never started writing"
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert list(tmp_path.iterdir()) == [], stderr


# ---------------------------------------------------------------- 5. the edge-list format in --help
def test_prepare_help_describes_the_edge_list_format() -> None:
    result = subprocess.run([sys.executable, "-m", "runners.cli", "prepare", "edgelist", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for needle in ('one edge per line: "src dst"', '"#" starts a comment', "0-based", "kept DIRECTED",
                   "--symmetrize to add every reverse edge", "Duplicate edges collapse", "self-loops are dropped",
                   "one id per line", "must be exactly 0..C-1", '"train", "val", "test"', "--split"):
        assert needle in text, needle


def test_cost_bytes_on_parts_that_do_not_merge_into_p_groups_is_one_sentence(tmp_path: Path) -> None:
    data = write(random_directed(n=120, seed=2), tmp_path / "data", parts=3)
    result = subprocess.run([SPARSE_DIST, "cost", "bytes", "--data", str(data), "--ranks", "2"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, _said(result)
    assert result.stderr == (f"sparse-dist cost: error: {data}: 3 parts cannot be merged into 2 row groups (P / c "
                             f"must divide the parts; prepare it with --parts 2 or a multiple)\n"), _said(result)
