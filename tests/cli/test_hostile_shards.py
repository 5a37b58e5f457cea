"""A shard, permutation or checkpoint rewritten by a hostile author (its checksum rewritten to match) is refused in
one sentence naming the file, the array and the first bad position, before scipy, torch or a compiled kernel
touches it; a lock file that is a FIFO or a link is refused, not read or truncated.

Each case is one finding of the probe of hostile data files (N1-N8): before the checks, N1 corrupted the heap
(glibc ``malloc(): invalid size``, SIGABRT), N3 asked for a 10^12-entry allocation and blamed memory, the
others were scipy or internal tracebacks.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from datasets_for_tests import random_directed, write
from mpirun import BIN, run_mpi

from algorithms.checkpoint import _encode, load_checkpoint, read_pointer
from runners.data import shards
from runners.data.shards import ShardError, read_meta, read_part, read_permutation
from runners.output_lock import OutputLocks

SPARSE_DIST = str(BIN / "sparse-dist")


def _forge(data: Path, name: str, change: Callable[[dict[str, np.ndarray]], None]) -> Path:
    """Change ``name``'s arrays (an .npz part or the .npy permutation) and rewrite its SHA-256, as a forger would."""
    path = data / name
    if name.endswith(".npz"):
        with np.load(path) as archive:
            arrays = {key: archive[key] for key in archive.files}
        change(arrays)
        np.savez(path, **arrays)
    else:
        arrays = {"order": np.load(path)}
        change(arrays)
        np.save(path, arrays["order"])
    meta = json.loads((data / "meta.json").read_text())
    meta["files"][name] = shards.sha256_file(path)
    (data / "meta.json").write_text(json.dumps(meta))
    return path


def _set(key: str, at: int, value: float) -> Callable[[dict[str, np.ndarray]], None]:
    def change(arrays: dict[str, np.ndarray]) -> None:
        arrays[key] = arrays[key].astype(np.float64 if isinstance(value, float) and np.isnan(value) else
                                         arrays[key].dtype)
        arrays[key][at] = value
    return change


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return write(random_directed(n=100), tmp_path / "d", parts=2, partitioner="block")


def _entries(data: Path) -> int:
    with np.load(data / "part-00001.npz") as archive:
        return int(archive["indices"].size)


FINDINGS: dict[str, tuple[Callable[[int], Callable[[dict[str, np.ndarray]], None]], str]] = {
    # id: (the change, given part 1's entry count E -> what the refusal says after the file's name)
    "N1 indptr ends short": (lambda e: _set("indptr", -1, e - 10),
                             r"array 'indptr' at position 50 is {e10}, below the \d+ before it; expected non-decreasing"),
    "N2 indptr swapped": (lambda e: lambda a: a.__setitem__("indptr", a["indptr"][[0, 2, 1, *range(3, 51)]]),
                          r"array 'indptr' at position 2 is \d+, below the \d+ before it; expected non-decreasing"),
    "N2 indptr negative": (lambda e: _set("indptr", 5, -3), r"array 'indptr' at position 5 is -3, below the"),
    "N3 indptr huge": (lambda e: _set("indptr", 10, 10 ** 12),
                       r"array 'indptr' at position 11 is \d+, below the 1000000000000 before it"),
    "N4 indptr ends beyond": (lambda e: _set("indptr", -1, e + 10),
                              r"array 'indptr' at position 50 is {e_plus}, expected the entry count {e}"),
    "N4 indptr starts at 1": (lambda e: _set("indptr", 0, 1),
                              r"array 'indptr' at position 0 is 1, expected 0 \(row pointers start at 0\)"),
    "N5 data short": (lambda e: lambda a: a.__setitem__("data", a["data"][:-1]),
                      r"array 'data' has shape \({e_minus},\), expected \(any\) from meta.json|"
                      r"array 'data' has {e_minus} entries, expected one per entry of 'indices' \({e}\)"),
    "N6 NaN weight": (lambda e: _set("data", 3, float("nan")),
                      r"array 'data' is of type float64, expected|array 'data' at position 3 is nan, expected a finite"),
    "N6 inf weight": (lambda e: _set("data", 3, np.inf), r"array 'data' at position 3 is inf, expected a finite edge"),
    "index beyond the nodes": (lambda e: _set("indices", 7, 100),
                               r"array 'indices' at position 7 is 100, expected a node id in \[0, 100\)"),
    "label beyond the classes": (lambda e: _set("labels", 4, 9),
                                 r"array 'labels' at 4 is 9, expected a class in \[0, 3\] \(num_classes=4\)"),
    "mask of 2s": (lambda e: lambda a: a.__setitem__("val", a["val"].astype(np.int8) * 2),
                   r"array 'val' at position \d+ is 2, expected 0 or 1 \(a mask\)"),
    "features of another dtype": (lambda e: lambda a: a.__setitem__("features", a["features"].astype(np.float16)),
                                  r"array 'features' is of type float16, expected float32 \(meta.json's feature_dtype\)"),
    "features of another width": (lambda e: lambda a: a.__setitem__("features", a["features"][:, :-1]),
                                  r"array 'features' has shape \(50, \d+\), expected \(50, \d+\) from meta.json"),
    "compressed member": (lambda e: lambda a: None, r"array 'indptr' is a compressed member"),
}


@pytest.mark.parametrize("finding", sorted(FINDINGS))
def test_a_forged_part_is_refused_naming_the_array_and_its_first_bad_position(dataset: Path, finding: str) -> None:
    import re

    entries = _entries(dataset)
    change, pattern = FINDINGS[finding]
    path = dataset / "part-00001.npz"
    if finding == "compressed member":
        with np.load(path) as archive:
            arrays = {key: archive[key] for key in archive.files}
        np.savez_compressed(path, **arrays)
        meta = json.loads((dataset / "meta.json").read_text())
        meta["files"]["part-00001.npz"] = shards.sha256_file(path)
        (dataset / "meta.json").write_text(json.dumps(meta))
    else:
        _forge(dataset, "part-00001.npz", change(entries))
    with pytest.raises(ShardError) as info:
        read_part(dataset, read_meta(dataset), 1)
    said = str(info.value)
    expected = pattern.format(e=entries, e10=entries - 10, e_plus=entries + 10, e_minus=entries - 1)
    assert said.startswith(f"{path}: ") and "\n" not in said and re.search(expected, said), said


def test_a_header_claiming_more_than_the_file_holds_allocates_nothing(dataset: Path) -> None:
    """An .npy member whose header claims 10^12 entries (a well-formed zip, CRCs and SHA-256 matching): refused
    from the header, before any allocation (np.load would have asked for 8 TB)."""
    path = dataset / "part-00001.npz"
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    with np.load(path) as archive:
        indices = archive["indices"]
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": indices.dtype.str, "fortran_order": False,
                                                  "shape": (10 ** 12,)})
    members["indices.npy"] = header.getvalue() + indices.tobytes()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, raw in members.items():
            archive.writestr(name, raw)
    meta = json.loads((dataset / "meta.json").read_text())
    meta["files"][path.name] = shards.sha256_file(path)
    (dataset / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ShardError, match=r"array 'indices' declares 8000000000000 bytes of data but holds \d+"):
        read_part(dataset, read_meta(dataset), 1)


@pytest.mark.parametrize("change, needle", [
    (lambda a: a.__setitem__("order", np.zeros_like(a["order"])), "entry 1 repeats original id 0; expected a permutation"),
    (lambda a: a.__setitem__("order", a["order"] + 1), "expected an original node id in [0, 100)"),
    (lambda a: a.__setitem__("order", a["order"][:-1]), "expected a 1-D integer array of num_nodes = 100 entries"),
])
def test_a_forged_permutation_is_refused(dataset: Path, change: Callable, needle: str) -> None:
    _forge(dataset, "permutation.npy", change)
    with pytest.raises(ShardError) as info:
        read_permutation(dataset, read_meta(dataset))
    assert needle in str(info.value) and str(info.value).startswith(str(dataset / "permutation.npy")), str(info.value)


@pytest.mark.parametrize("mode", ["full", "minibatch"])
def test_n1_under_mpiexec_is_one_sentence_said_once_in_both_modes(dataset: Path, tmp_path: Path, mode: str) -> None:
    """N1 (heap corruption before): exit 2 on every rank, the sentence once, no signal, no traceback."""
    entries = _entries(dataset)
    path = _forge(dataset, "part-00001.npz", _set("indptr", -1, entries - 10))
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(dataset), "--epochs", "1", "--mode", mode,
                         "--out", str(tmp_path / "r.jsonl")], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        f"sparse-dist train: error: rank 1: {path}: array 'indptr' at position 50 is {entries - 10}, below the "
        f"{result.stderr.split('below the ')[1].split(' ')[0]} before it; expected non-decreasing row pointers"], \
        result.stderr


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_lock_file_that_is_a_fifo_or_a_link_is_refused_and_nothing_is_truncated(tmp_path: Path, kind: str) -> None:
    """N8: a FIFO beside --out used to be an `Illegal seek` traceback; a link would have been truncated."""
    victim = tmp_path / "thesis.txt"
    victim.write_text("chapter 1\n")
    lock = tmp_path / "r.jsonl.lock"
    os.mkfifo(lock) if kind == "fifo" else lock.symlink_to(victim)
    problem = OutputLocks().take(tmp_path / "r.jsonl", "--out", overwrite=True)
    assert problem is not None and f"its lock file {lock}" in problem, problem
    assert ("not a regular file" if kind == "fifo" else "symbolic link") in problem
    assert victim.read_text() == "chapter 1\n"


def test_a_forged_checkpoint_of_another_shape_is_refused_in_one_sentence(dataset: Path, tmp_path: Path) -> None:
    """A checkpoint whose weights were re-encoded with another shape and both digests rewritten: one sentence
    naming the weight, both shapes, exit 2 (before: a `load_state_dict` size-mismatch traceback)."""
    checkpoint = tmp_path / "run.ckpt"
    argv = [SPARSE_DIST, "train", "--data", str(dataset), "--epochs", "2", "--hidden", "8",
            "--checkpoint", str(checkpoint), "--checkpoint-every", "1"]
    first = run_mpi(1, [*argv, "--out", str(tmp_path / "a.jsonl")], timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    current = read_pointer(checkpoint)
    state = load_checkpoint(current.directory / "main.ckpt")
    name = sorted(key for key in state["model"] if state["model"][key].dim() == 2)[0]
    state["model"][name] = torch.zeros(3, 3, dtype=state["model"][name].dtype)
    data, digest = _encode(state)
    (current.directory / "main.ckpt").write_bytes(data)
    record = load_checkpoint(checkpoint)
    record["files"]["main.ckpt"] = digest
    checkpoint.write_bytes(_encode(record)[0])
    resumed = run_mpi(2, [*argv, "--epochs", "3", "--resume", "--out", str(tmp_path / "b.jsonl")], timeout=120)
    assert resumed.returncode == 2, resumed.stdout + resumed.stderr
    said = resumed.stderr.splitlines()
    assert len(said) == 1 and f"weight {name!r} is (3, 3)" in said[0] and "this model's is" in said[0], said
