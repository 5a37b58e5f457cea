"""Mutations of every file format the project reads, as a hostile author or a damaged disk would make them, and
the one property each reader must keep: any mutation ends in success or in a one-sentence refusal.

A :class:`Mutation` is plain data (format, operation, target, position, value, whether the checksum is
rewritten to match), so that the main lane's Hypothesis tests (``tests/unit/runners/test_fuzz_inputs.py``)
and the slow lane's campaign in subprocesses (``tests/support/fuzz_campaign.py``) draw from the same space
and a failing case can be replayed from its printed form.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMATS = ("shard", "meta", "permutation", "checkpoint", "study", "edgelist", "planetoid", "ogb")
OGB_FILES = ("raw/edge.csv.gz", "raw/num-node-list.csv.gz", "raw/node-feat.csv.gz", "raw/node-label.csv.gz",
             "split/time/train.csv.gz", "split/time/test.csv.gz")
PLANETOID_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
ARRAY_OPS = ("set", "dtype", "reshape", "shorter", "longer", "drop", "rename", "swap", "empty", "compress")
BYTE_OPS = ("flip", "truncate", "garbage")
SPECIAL = (0, -1, 1, 2, 255, 2 ** 31 - 1, 2 ** 31, 2 ** 63 - 1, -2 ** 63, 10 ** 12, float("nan"), float("inf"),
           -float("inf"), 0.5, 1e308)
DTYPES = ("int8", "uint8", "int32", "uint64", "float16", "float32", "float64", "bool", "complex64", "<U3",
          "datetime64[s]", "V8")
PART_NAMES = ("indptr", "indices", "data", "features", "labels", "train", "val", "test")


@dataclass(frozen=True)
class Mutation:
    """One change to one file of a valid input. ``where`` in [0, 1) picks a position (an entry, a byte, a
    field); ``value`` indexes :data:`SPECIAL` or :data:`DTYPES`; ``fix_checksum``: rewrite meta.json's (or the
    checkpoint's) SHA-256 to match, as a forger would."""

    format: str
    op: str
    target: str
    where: float
    value: int
    fix_checksum: bool


def random_mutation(rng: random.Random, fmt: str) -> Mutation:
    """A mutation of ``fmt`` drawn from ``rng`` (the slow lane's campaign)."""
    ops = ARRAY_OPS + BYTE_OPS if fmt in ("shard", "permutation", "edgelist") else BYTE_OPS + ("set", "drop")
    return Mutation(fmt, rng.choice(ops), rng.choice(PART_NAMES), rng.random(), rng.randrange(64),
                    rng.random() < 0.8)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _special(index: int) -> Any:
    return SPECIAL[index % len(SPECIAL)]


def mutate_array(array: np.ndarray, m: Mutation) -> np.ndarray | None:
    """``array`` changed by ``m.op`` (None: drop it)."""
    flat = array.reshape(-1)
    at = int(m.where * flat.size) if flat.size else 0
    if m.op == "set" and flat.size:
        value = _special(m.value)
        changed = flat.astype(np.float64 if isinstance(value, float) and array.dtype.kind != "f" else array.dtype)
        try:
            changed[at] = value
        except (OverflowError, ValueError):
            changed = flat.astype(np.float64)
            changed[at] = value
        return changed.reshape(array.shape)
    if m.op == "dtype":
        try:
            return array.astype(DTYPES[m.value % len(DTYPES)])
        except (TypeError, ValueError):
            return array.astype("<U3")
    if m.op == "reshape":
        return flat.reshape(1, -1) if m.value % 2 else flat
    if m.op == "shorter":
        return array[:-1] if array.ndim and array.shape[0] else array
    if m.op == "longer":
        return np.concatenate([array, array[-1:] if array.shape[0] else np.zeros((1, *array.shape[1:]), array.dtype)])
    if m.op == "swap" and flat.size > 1:
        changed = flat.copy()
        other = (at + 1 + m.value) % flat.size
        changed[at], changed[other] = flat[other], flat[at]
        return changed.reshape(array.shape)
    if m.op == "empty":
        return array[:0]
    if m.op == "drop":
        return None
    return array


def _mutate_bytes(path: Path, m: Mutation) -> None:
    raw = bytearray(path.read_bytes())
    at = int(m.where * len(raw)) if raw else 0
    if m.op == "flip" and raw:
        raw[at] ^= 1 << (m.value % 8)
    elif m.op == "truncate":
        raw = raw[:at]
    elif m.op == "garbage":
        raw[at:at + 16] = bytes((m.value * 37 + i * 11) % 256 for i in range(16))
    path.write_bytes(bytes(raw))


def _rewrite_npz(path: Path, m: Mutation) -> None:
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    target = m.target if m.target in arrays else sorted(arrays)[0]
    if m.op == "rename":
        arrays[target + "_x"] = arrays.pop(target)
    else:
        changed = mutate_array(arrays[target], m)
        if changed is None:
            arrays.pop(target)
        else:
            arrays[target] = changed
    (np.savez_compressed if m.op == "compress" else np.savez)(path, **arrays)


def apply(m: Mutation, dataset: Path, checkpoint: Path | None = None, study: Path | None = None,
          edgelist: Path | None = None, planetoid: Path | None = None, ogb: Path | None = None) -> Path:
    """Apply ``m`` to the file of its format (the dataset's part 1, meta.json or permutation; the checkpoint's
    main file; the study file; the edge list), rewriting checksums where ``m.fix_checksum``; returns the file."""
    if m.format in ("shard", "permutation"):
        path = dataset / ("part-00001.npz" if m.format == "shard" else "permutation.npy")
        if m.op in BYTE_OPS:
            _mutate_bytes(path, m)
        elif m.format == "shard":
            _rewrite_npz(path, m)
        else:
            changed = mutate_array(np.load(path, allow_pickle=False), m)
            np.save(path, np.zeros(0, np.int64) if changed is None else changed, allow_pickle=False)
        if m.fix_checksum:
            meta = json.loads((dataset / "meta.json").read_text())
            meta["files"][path.name] = _sha(path)
            (dataset / "meta.json").write_text(json.dumps(meta))
        return path
    if m.format == "meta":
        path = dataset / "meta.json"
        if m.op in BYTE_OPS:
            _mutate_bytes(path, m)
        else:
            meta = json.loads(path.read_text())
            keys = sorted(meta)
            key = keys[int(m.where * len(keys))]
            if m.op == "drop":
                meta.pop(key)
            else:
                meta[key] = [_special(m.value), "x", None, {}, [], True, -1][m.value % 7] if m.value % 2 else _special(m.value)
            path.write_text(json.dumps(meta))
        return path
    if m.format == "checkpoint":
        assert checkpoint is not None
        return _mutate_checkpoint(checkpoint, m)
    if m.format == "planetoid":
        assert planetoid is not None
        return _mutate_planetoid(planetoid, m)
    if m.format == "ogb":
        assert ogb is not None
        return _mutate_ogb(ogb, m)
    path = study if m.format == "study" else edgelist
    assert path is not None
    if m.format == "edgelist" and m.target in ("features", "labels"):  # the .npy beside the edge list
        path = path.with_name(f"{m.target}.npy")
        if m.op in BYTE_OPS:
            _mutate_bytes(path, m)
        else:
            changed = mutate_array(np.load(path, allow_pickle=False), m)
            np.save(path, np.zeros(0) if changed is None else changed, allow_pickle=False)
        return path
    if m.op in BYTE_OPS:
        _mutate_bytes(path, m)
    else:
        lines = path.read_text(errors="replace").splitlines()
        at = int(m.where * len(lines)) if lines else 0
        if m.op == "drop" and lines:
            lines.pop(at)
        elif lines:
            lines[at] = lines[at].split("=")[0] + (f"= {_special(m.value)!r}" if "=" in lines[at]
                                                     else f" {_special(m.value)}")
        path.write_text("\n".join(lines) + "\n")
    return path


def _mutate_ogb(directory: Path, m: Mutation) -> Path:
    """Change one of an OGB dataset's gzipped CSVs: its compressed bytes, or one line of its text."""
    import gzip

    path = directory / OGB_FILES[m.value % len(OGB_FILES)]
    if m.op in BYTE_OPS:
        _mutate_bytes(path, m)
        return path
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    at = int(m.where * len(lines)) if lines else 0
    if m.op == "drop" and lines:
        lines.pop(at)
    elif lines:
        fields = lines[at].split(",")
        fields[int(m.where * 7) % len(fields)] = str(_special(m.value // 3))
        lines[at] = ",".join(fields)
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return path


def _mutate_planetoid(directory: Path, m: Mutation) -> Path:
    """Change one ``ind.cora.*`` file: its bytes, or one entry of the object it holds (a sparse matrix's
    ``indptr``, ``indices`` or ``data``, a label array, a neighbour in the graph, a test id), re-pickled."""
    import pickle

    import scipy.sparse as sp

    part = PLANETOID_PARTS[m.value % len(PLANETOID_PARTS)]
    path = directory / f"ind.cora.{part}"
    if m.op in BYTE_OPS:
        _mutate_bytes(path, m)
        return path
    if part == "test.index":
        ids = np.loadtxt(path, dtype=np.int64, ndmin=1)
        changed = mutate_array(ids, m)
        np.savetxt(path, np.zeros(0) if changed is None else changed.reshape(-1), fmt="%s")
        return path
    with open(path, "rb") as handle:
        obj = pickle.load(handle, encoding="latin1")
    if sp.issparse(obj):
        field = ("indptr", "indices", "data")[int(m.where * 3)]
        changed = mutate_array(getattr(obj, field), m)
        obj.__dict__[field if changed is not None else "data"] = changed if changed is not None else obj.data[:-1]
    elif isinstance(obj, np.ndarray):
        obj = mutate_array(obj, m)
    elif isinstance(obj, dict) and obj:
        key = sorted(obj)[int(m.where * len(obj))]
        obj[key] = [_special(m.value)] if m.op == "set" else "x"
    with open(path, "wb") as handle:
        pickle.dump(obj, handle, protocol=2)
    return path


def _mutate_checkpoint(pointer: Path, m: Mutation) -> Path:
    """Change the set's ``main.ckpt``: its bytes, or (``set``/``drop``/array ops) one tensor of its weights,
    re-encoded with a matching header and pointer digest where ``m.fix_checksum``."""
    import torch

    from algorithms.checkpoint import _encode, load_checkpoint, read_pointer

    current = read_pointer(pointer)
    path = current.directory / "main.ckpt"
    if m.op in BYTE_OPS:
        _mutate_bytes(path, m)
        if not m.fix_checksum:
            return path
        header, _, payload = path.read_bytes().partition(b"\n")
        digest = hashlib.sha256(payload).hexdigest()
        path.write_bytes(b"SPARSE_DIST_CHECKPOINT 1 " + digest.encode() + b"\n" + payload)
    else:
        state = load_checkpoint(path)
        names = sorted(state["model"])
        name = names[int(m.where * len(names))]
        if m.op == "drop":
            state["model"].pop(name)
        else:
            changed = mutate_array(state["model"][name].numpy(), m)
            state["model"][name] = torch.from_numpy(np.ascontiguousarray(changed)) \
                if changed is not None and changed.dtype.kind in "fiub" else "not a tensor"
        data, digest = _encode(state)
        path.write_bytes(data)
    if m.fix_checksum:
        record = load_checkpoint(pointer)
        record["files"]["main.ckpt"] = digest
        pointer.write_bytes(_encode(record)[0])
    return path


def one_sentence(message: str, where: str) -> bool:
    """Whether a refusal is one line that names the file or flag it is about."""
    return "\n" not in message.strip() and where in message and "Traceback" not in message
