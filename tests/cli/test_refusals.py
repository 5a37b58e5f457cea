"""One sentence instead of a traceback: hostile or wrong-typed shards and checkpoints, graphs `train` could not
use (refused by `prepare` before it writes anything), and what the machine causes (out of memory, a full or
read-only disk, Ctrl-C, SIGTERM)."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import pickle
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets_for_tests import random_directed, write
from mpirun import BIN, ROOT, mpiexec_path, run_mpi

from algorithms.checkpoint import CheckpointError, load_checkpoint
from runners.cli import describe_environment_error, user_errors
from runners.data.shards import ShardError, dataset_problem, read_meta
from runners.data import shards
from runners.results import partial_beside

SPARSE_DIST = str(BIN / "sparse-dist")


class _Hostile:
    """Unpickling this runs a command: what a malicious file would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _checkpoint_file(path: Path, payload: bytes) -> Path:
    path.write_bytes(b"SPARSE_DIST_CHECKPOINT 1 %s\n" % hashlib.sha256(payload).hexdigest().encode() + payload)
    return path


def test_shard_and_checkpoint_errors_are_user_errors() -> None:
    assert issubclass(ShardError, user_errors()) and issubclass(CheckpointError, user_errors())


def test_a_hostile_or_wrong_typed_checkpoint_is_refused_without_running_anything(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    hostile = _checkpoint_file(tmp_path / "hostile.ckpt", pickle.dumps(_Hostile(marker), protocol=2))
    with pytest.raises(CheckpointError, match=r"hostile.ckpt: refused: not a checkpoint this version can read safely "
                                              r"\(.*GLOBAL posix.system"):
        load_checkpoint(hostile)
    buffer = io.BytesIO()
    torch.save({"model": np.zeros(3)}, buffer)  # numpy objects: not among the types a checkpoint may hold
    with pytest.raises(CheckpointError, match="wrong.ckpt: refused: .*numpy"):
        load_checkpoint(_checkpoint_file(tmp_path / "wrong.ckpt", buffer.getvalue()))
    assert not marker.exists()


def _replace_part(data: Path, arrays: dict[str, np.ndarray] | None, raw: bytes | None = None) -> Path:
    """Rewrite part 1 (arrays as an .npz, or raw bytes) and fix its checksum in meta.json, as a forger would."""
    path = data / "part-00001.npz"
    if raw is not None:
        path.write_bytes(raw)
    else:
        np.savez(path, **arrays)
    meta = json.loads((data / "meta.json").read_text())
    meta["files"]["part-00001.npz"] = shards.sha256_file(path)
    (data / "meta.json").write_text(json.dumps(meta))
    return path


def _arrays(data: Path) -> dict[str, np.ndarray]:
    with np.load(data / "part-00001.npz") as archive:
        return {key: archive[key] for key in archive.files}


@pytest.mark.parametrize("kind, needle", [
    ("pickled", "array 'features' holds Python objects; only numbers are read"),
    ("not a zip", "not a shard written by `sparse-dist prepare` ("),
    ("text labels", "array 'labels' is of type <U3, expected an integer type"),
    ("short mask", "array 'train' has shape (99), expected (100) from meta.json"),
])
def test_a_forged_shard_is_one_sentence(tmp_path: Path, kind: str, needle: str) -> None:
    data = write(random_directed(), tmp_path / "d", parts=2, partitioner="block")
    arrays = _arrays(data)
    if kind == "pickled":
        arrays["features"] = np.array([_Hostile(tmp_path / "ran")] * 3, dtype=object)
    elif kind == "text labels":
        arrays["labels"] = arrays["labels"].astype("U3")
    elif kind == "short mask":
        arrays["train"] = arrays["train"][:-1]
    path = _replace_part(data, None if kind == "not a zip" else arrays, b"PK not really" * 20 if kind == "not a zip" else None)
    with pytest.raises(ShardError) as info:
        shards.read_part(data, read_meta(data), 1)
    assert str(info.value).startswith(f"{path}: ") and needle in str(info.value), str(info.value)
    assert not (tmp_path / "ran").exists()


def test_a_forged_shard_under_mpiexec_is_said_once(tmp_path: Path) -> None:
    data = write(random_directed(), tmp_path / "d", parts=2, partitioner="block")
    arrays = _arrays(data)
    arrays["features"] = np.array([1, "x", None], dtype=object)
    path = _replace_part(data, arrays)
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(data), "--epochs", "1"], timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"sparse-dist train: error: rank 1: {path}: array 'features' holds Python objects; "
                             f"only numbers are read\n")


# ---------------------------------------------------------------- graphs train could not use
def test_dataset_problems() -> None:
    assert dataset_problem(1, 1, 1) == "the graph has 1 node(s); training needs at least 2"
    assert dataset_problem(10, 11, 3) == "--parts 11 is more than the graph's 10 nodes; use --parts 10 or fewer"
    assert dataset_problem(10, 2, 0).startswith("the training split of the 10 nodes is empty;")
    assert dataset_problem(10, 10, None) is None


def _prepare(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPARSE_DIST, "prepare", *argv], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.mark.slow
def test_prepare_refuses_what_train_could_not_use_before_writing(tmp_path: Path) -> None:
    n = 20
    (tmp_path / "e.txt").write_text("".join(f"{i} {i + 1}\n" for i in range(n - 1)))
    np.save(tmp_path / "x.npy", np.ones((n, 3), dtype=np.float32))
    (tmp_path / "y.txt").write_text("".join(f"{i % 2}\n" for i in range(n)))
    np.savez(tmp_path / "m.npz", train=np.zeros(n, bool), val=np.ones(n, bool), test=np.ones(n, bool))
    cases = {
        "the graph has 1 node(s); training needs at least 2": ("synthetic", "--nodes", "1", "--parts", "1"),
        "prepare synthetic: --parts 8 is more than the graph's 5 nodes": ("synthetic", "--stream", "--nodes", "5",
                                                                          "--parts", "8"),
        "cora: --parts 3000 is more than the graph's 2708 nodes; use --parts 2708 or fewer": ("planetoid", "--parts",
                                                                                             "3000"),
        "--nodes 3 is fewer than --classes 5": ("synthetic", "--homophily", "0.2", "--nodes", "3", "--classes", "5",
                                                "--parts", "1"),
        "e: the training split of the 20 nodes is empty": ("edgelist", "--edges", "e.txt", "--node-features", "x.npy",
                                                           "--labels", "y.txt", "--masks", "m.npz", "--name", "e"),
    }
    for needle, argv in cases.items():
        result = _prepare(*argv, "--out", "out", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and needle in result.stderr, (needle, result.stderr)
        assert result.stderr.startswith("sparse-dist prepare: error: ")
        assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


# ---------------------------------------------------------------- what the machine causes
def test_homophily_outside_prepare_synthetic_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    for argv in (("planetoid", "--homophily", "0.2"), ("synthetic", "--stream", "--homophily", "0.2")):
        result = _prepare(*argv, "--out", "out", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("sparse-dist prepare: error: --homophily makes prepare synthetic's "
                                        "stochastic block model; it has no meaning with --stream or other sources\n")
        assert not (tmp_path / "out").exists()


def test_the_machine_s_errors_are_one_sentence_each() -> None:
    describe = describe_environment_error("train")
    oom = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 40000000000 bytes. Error code 12 (Cannot allocate memory)")
    assert describe(oom) == ("out of memory (could not allocate 37.3 GiB more); try more ranks (on more nodes), a "
                             "smaller --hidden or fewer --layers", 1)
    assert describe(MemoryError())[0] == "out of memory; try more ranks (on more nodes), a smaller --hidden or fewer --layers"
    assert describe_environment_error("prepare")(MemoryError())[0].endswith("try prepare synthetic --stream "
                                                                             "(bounded memory), or a machine with more memory")
    full = OSError(errno.ENOSPC, "No space left on device", "/scratch/d/.x.tmp-1/part-00000.npz")
    assert describe(full) == ("the disk is full writing /scratch/d/.x.tmp-1/part-00000.npz (ENOSPC); free some space "
                              "or write elsewhere", 1)
    assert describe(OSError(errno.EROFS, "Read-only file system", "/ro/x"))[0] == (
        "the file system is read-only writing /ro/x (EROFS); write elsewhere")
    assert describe(KeyboardInterrupt()) == ("interrupted (SIGINT, Ctrl-C)", 130)
    assert describe(SystemExit(143)) == ("terminated (SIGTERM)", 143)
    assert describe(SystemExit(3)) is None and describe(ValueError("x")) is None


def test_prepare_on_a_read_only_file_system_is_one_sentence(tmp_path: Path) -> None:
    target = tmp_path / "ro"
    target.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "--bind", "-o", "ro", str(target), str(target)],
                                           capture_output=True).returncode != 0:
        pytest.skip("a read-only bind mount needs root")
    try:
        result = _prepare("planetoid", "--parts", "2", "--out", str(target / "cora"))
    finally:
        subprocess.run(["umount", str(target)], check=False)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(f"sparse-dist prepare: error: the file system is read-only writing {target}/.cora.tmp-")
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("(EROFS); write elsewhere\n")
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("sig, status, sentence", [(signal.SIGINT, 130, "interrupted (SIGINT, Ctrl-C)"),
                                                   (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_ctrl_c_and_sigterm_under_mpiexec_are_one_sentence(tmp_path: Path, sig: int, status: int,
                                                           sentence: str) -> None:
    data = write(random_directed(), tmp_path / "d", parts=2, partitioner="block")
    out = tmp_path / "r.jsonl"
    process = subprocess.Popen([mpiexec_path(), "-n", "2", SPARSE_DIST, "train", "--data", str(data), "--epochs",
                                "1000000", "--out", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 120
        while process.poll() is None and time.monotonic() < deadline and not (
                partial_beside(out).exists() and '"type": "epoch"' in partial_beside(out).read_text()):
            time.sleep(0.1)
        os.killpg(process.pid, sig)  # what a terminal's Ctrl-C or scancel does: every process of the job
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == status, stderr
    assert stderr.count(f"sparse-dist train: error: {sentence}\n") == 1 and "Traceback" not in stderr, stderr
    assert partial_beside(out).read_text().endswith("\n") and not out.exists()
