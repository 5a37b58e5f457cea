"""Reading the sharded dataset format (DESIGN section 6): ``meta.json`` checked field by field, a rank's own
part(s) checked against their checksums and merged into its row group (:func:`load_local_graph`, collective
validation). The format itself is described in :mod:`runners.data.shards`, which writes it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
import scipy.sparse as sp

from algorithms.training.graph import LocalGraph
from runners.data.part_checks import PART_ARRAYS, member_problem, npy_header, part_problem, plain
from sparse_dist.comm import Communicator, said_once
from sparse_dist.layout import RowLayout

FORMAT_VERSION = 1
META_FIELDS = ("format_version", "name", "num_nodes", "num_edges", "feature_dim", "num_classes", "multilabel",
               "partitioner", "num_parts", "row_offsets", "permutation_file", "files")
PERMUTATION_FILE = "permutation.npy"
OWN_FILE = re.compile(r"meta\.json|permutation\.npy|part-\d{5}\.npz")
"""Every file name ``prepare`` writes into a dataset directory; nothing else there is ever removed."""


class ShardError(ValueError):
    """A dataset directory that is missing, damaged or does not fit the run."""


def sha256_of(handle: BinaryIO) -> str:
    """The SHA-256 of what is left to read from ``handle``, read a MiB at a time."""
    digest = hashlib.sha256()
    for block in iter(lambda: handle.read(1 << 20), b""):
        digest.update(block)
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return sha256_of(handle)


def part_file(index: int) -> str:
    return f"part-{index:05d}.npz"


def dataset_files(meta: dict[str, Any]) -> set[str]:
    """The file names ``prepare`` wrote into a dataset directory: ``meta.json`` and every file it lists
    (plain names of :data:`OWN_FILE`'s form once :func:`read_meta` passed)."""
    return {"meta.json", str(meta["permutation_file"]), *map(str, meta["files"])}


def _count(low: int) -> Callable[[Any], bool]:
    return lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= low


def _text(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _counts(value: Any) -> bool:
    return isinstance(value, list) and all(map(_count(0), value))


_SHA256 = re.compile(r"[0-9a-f]{64}")
META_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "name": (_text, "a non-empty string"),
    "num_nodes": (_count(1), "an integer >= 1"),
    "num_edges": (_count(0), "an integer >= 0"),
    "feature_dim": (_count(1), "an integer >= 1"),
    "num_classes": (_count(1), "an integer >= 1"),
    "multilabel": (lambda value: isinstance(value, bool), "true or false"),
    "partitioner": (_text, "a non-empty string"),
    "num_parts": (_count(1), "an integer >= 1"),
    "row_offsets": (_counts, "a list of integers >= 0"),
    "permutation_file": (_text, "a file name"),
    "files": (lambda value: isinstance(value, dict) and all(isinstance(v, str) and _SHA256.fullmatch(v)
                                                             for v in value.values()),
              "an object of file name -> SHA-256 (64 hex digits)"),
    "feature_dtype": (lambda value: value in ("float32", "float64"), "'float32' or 'float64'"),
    "feature_norm": (lambda value: value in ("row", "none"), "'row' or 'none'"),
    "partition_seed": (_count(0), "an integer >= 0"),
    "partition_hops": (_count(1), "an integer >= 1"),
    "ogb_name": (_text, "a non-empty string"),
    "eval_metric": (_text, "a non-empty string"),
    "partition_stats": (lambda value: isinstance(value, dict), "an object"),
}
"""Every field a reader of ``meta.json`` uses: its test and what it must be (those of :data:`META_FIELDS`
are required, the others optional). Fields no reader uses are left alone."""
STATS_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{key: (_counts, "a list of integers >= 0, one per part")
       for key in ("inner_nodes", "boundary_nodes", "edges", "cut_edges")},
    "train_nodes": (lambda value: value is None or _counts(value), "null or a list of integers >= 0, one per part"),
    "boundary_over_inner": (lambda value: isinstance(value, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in value), "a list of numbers >= 0"),
    "total_boundary_nodes": (_count(0), "an integer >= 0"),
    "total_cut_edges": (_count(0), "an integer >= 0"),
    "predicted_forward_bytes_per_feature": (lambda value: isinstance(value, dict) and all(
        map(_count(0), value.values())), "an object of plan -> integer >= 0"),
}
"""The ``partition_stats`` figures readers use (``resources`` and ``prepare``'s report)."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def name_problem(name: Any) -> str | None:
    """Why ``name`` (read from a ``meta.json``) is not a file ``prepare`` writes into a dataset directory, or None.

    A name is data, never a path: it must be a plain file name (no separator, not ``..``, not absolute) of
    :data:`OWN_FILE`'s form, so that nothing outside the directory is ever opened or removed through it."""
    if not isinstance(name, str) or "/" in name or "\\" in name or "\0" in name or name in ("", ".", ".."):
        return "which is not a plain file name inside the dataset directory"
    if not OWN_FILE.fullmatch(name) or name == "meta.json":
        return "which is not a file prepare writes (permutation.npy, part-NNNNN.npz)"
    return None


def meta_problem(meta: Any) -> str | None:
    """What makes a parsed ``meta.json`` one ``prepare`` did not write (one clause naming the field), or None:
    a missing field, a field of the wrong type or range (:data:`META_RULES`), row offsets that do not split
    the nodes into ``num_parts`` parts, or a file name that is not :func:`name_problem`-free, or ``files``
    not listing exactly the permutation and one shard per part."""
    if not isinstance(meta, dict):
        return f"expected a JSON object, found {type(meta).__name__}"
    missing = [key for key in META_FIELDS if key not in meta]
    if missing:
        return f"missing fields {missing}"
    if meta["format_version"] != FORMAT_VERSION or isinstance(meta["format_version"], bool):
        return f"format_version {_shown(meta['format_version'])}, expected {FORMAT_VERSION}"
    for key, (test, what) in META_RULES.items():
        if key in meta and not test(meta[key]):
            return f"field {key!r} is {_shown(meta[key])}, expected {what}"
    for key, (test, what) in STATS_RULES.items():
        value = meta.get("partition_stats", {}).get(key)
        if key in meta.get("partition_stats", {}) and (not test(value) or isinstance(value, list)
                                                       and len(value) != meta["num_parts"]):
            return f"field 'partition_stats.{key}' is {_shown(value)}, expected {what} ({meta['num_parts']} parts)"
    edges = meta.get("partition_stats", {}).get("edges")
    if edges is not None and sum(edges) != meta["num_edges"]:
        return f"field 'partition_stats.edges' sums to {sum(edges)}, expected num_edges = {meta['num_edges']}"
    offsets = meta["row_offsets"]
    if (len(offsets) != meta["num_parts"] + 1 or offsets[0] != 0 or offsets[-1] != meta["num_nodes"]
            or any(a > b for a, b in zip(offsets, offsets[1:]))):
        return (f"field 'row_offsets' must have num_parts + 1 = {meta['num_parts'] + 1} non-decreasing entries "
                f"from 0 to num_nodes = {meta['num_nodes']}")
    for key, names in (("permutation_file", [meta["permutation_file"]]), ("files", list(meta["files"]))):
        for name in names:
            problem = name_problem(name)
            if problem:
                return f"field {key!r} names {_shown(name)}, {problem}"
    expected = {meta["permutation_file"], *map(part_file, range(meta["num_parts"]))}
    if set(meta["files"]) != expected:
        odd = sorted(set(meta["files"]) ^ expected)
        return (f"field 'files' must list {meta['permutation_file']} and one part-NNNNN.npz per part "
                f"({meta['num_parts']} parts); {', '.join(odd[:3])}{' ...' if len(odd) > 3 else ''} "
                f"{'is' if len(odd) == 1 else 'are'} amiss")
    return None


def read_meta(data_dir: str | Path) -> dict[str, Any]:
    """``meta.json`` of a dataset directory, checked for every field the readers use (:func:`meta_problem`).

    Refused (:class:`ShardError`, naming the file and the field): a ``meta.json`` that is a symbolic link,
    not UTF-8 or not JSON, any :func:`meta_problem`, and a file it lists that is a symbolic link, so that
    no reader of the dataset ever opens a path outside its directory."""
    if not Path(data_dir).is_dir():
        raise ShardError(f"{data_dir}: no such dataset directory; expected a directory made by "
                         f"`sparse-dist prepare ... --out {data_dir}`")
    path = Path(data_dir) / "meta.json"
    if path.is_symlink():
        raise ShardError(f"{path}: a symbolic link, not a file prepare wrote; a dataset holds its own files")
    if not path.is_file():
        raise ShardError(f"{data_dir}: not a prepared dataset (no meta.json); run `sparse-dist prepare` first")
    raw = path.read_bytes()
    try:
        meta = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ShardError(f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                         f"prepare writes meta.json as JSON in UTF-8") from None
    except json.JSONDecodeError as exc:
        raise ShardError(f"{path}: not valid JSON ({exc})") from None
    problem = meta_problem(meta)
    if problem:
        raise ShardError(f"{path}: {problem}")
    linked = sorted(name for name in dataset_files(meta) if (Path(data_dir) / name).is_symlink())
    if linked:
        raise ShardError(f"{path}: field {'permutation_file' if linked[0] == meta['permutation_file'] else 'files'!r} "
                         f"names {linked[0]}, which is a symbolic link; a dataset prepare wrote holds its own files")
    return meta


def _verified(path: Path, meta: dict[str, Any]) -> BinaryIO:
    """``path`` opened once (every later read goes through this handle, so what was checked is what is read),
    refused if missing or if its SHA-256 is not ``meta.json``'s (damage, not hostility)."""
    if not path.is_file():
        raise ShardError(f"{path}: shard file missing")
    handle = open(path, "rb")
    if sha256_of(handle) != meta["files"].get(path.name):
        handle.close()
        raise ShardError(f"{path}: checksum does not match meta.json (file damaged or replaced)")
    handle.seek(0)
    return handle


def read_part(data_dir: Path, meta: dict[str, Any], index: int,
              names: tuple[str, ...] = PART_ARRAYS) -> dict[str, np.ndarray]:
    """Arrays ``names`` of part ``index``, each checked before anything uses it (:mod:`runners.data.part_checks`:
    headers before reading, values after); a problem raises :class:`ShardError` naming the file, the array and
    the first bad position."""
    path = data_dir / part_file(index)
    arrays: dict[str, np.ndarray] = {}
    with _verified(path, meta) as handle:
        try:
            with zipfile.ZipFile(handle) as archive:
                problem = member_problem(archive, os.fstat(handle.fileno()).st_size, meta, index, names)
            if not problem:
                handle.seek(0)
                with np.load(handle, allow_pickle=False) as archive:
                    arrays = {key: archive[key] for key in names}
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:  # not an .npz, truncated
            raise ShardError(f"{path}: not a shard written by `sparse-dist prepare` ({exc})") from None
    problem = problem or part_problem(meta, index, arrays)
    if problem:
        raise ShardError(f"{path}: {problem}")
    return arrays


def _permutation_header_problem(handle: BinaryIO, n: int) -> str | None:
    """Why the ``.npy`` header of ``handle`` is not a 1-D integer array of ``n`` entries filling the file, or None."""
    problem, shape, dtype = npy_header(handle, os.fstat(handle.fileno()).st_size)
    if problem:
        return problem
    if not plain(dtype, "iu") or shape != (n,):
        return f"expected a 1-D integer array of num_nodes = {n} entries, found {dtype} of shape {shape}"
    return None


def read_permutation(data_dir: Path, meta: dict[str, Any]) -> np.ndarray:
    """``permutation.npy`` (new id -> original id, int64), checked: its checksum, a 1-D integer array of
    ``num_nodes`` entries (from its header, before it is read) and a permutation of ``[0, num_nodes)``."""
    path = data_dir / meta["permutation_file"]
    n = meta["num_nodes"]
    with _verified(path, meta) as handle:
        try:
            problem = _permutation_header_problem(handle, n)
            handle.seek(0)
            order = None if problem else np.load(handle, allow_pickle=False).astype(np.int64, copy=False)
        except (ValueError, OSError, EOFError) as exc:
            raise ShardError(f"{path}: not a permutation written by `sparse-dist prepare` ({exc})") from None
    if order is not None and order.size and (order.min() < 0 or order.max() >= n):
        at = int(np.flatnonzero((order < 0) | (order >= n))[0])
        problem = f"entry {at} is {int(order[at])}, expected an original node id in [0, {n})"
    elif order is not None:
        counts = np.bincount(order, minlength=n)
        if (counts != 1).any():
            repeated = int(np.argmax(counts > 1))
            problem = (f"entry {int(np.flatnonzero(order == repeated)[1])} repeats original id {repeated}; "
                       f"expected a permutation of [0, {n})")
    if problem:
        raise ShardError(f"{path}: {problem}")
    assert order is not None
    return order


def _raise_if_any(comm: Communicator, error: str | None) -> None:
    """``comm.raise_if_any(error, ShardError)``, the error marked ``every_rank`` (said once; see
    :func:`sparse_dist.comm.run_or_abort`)."""
    try:
        comm.raise_if_any(error, ShardError)
    except ShardError as exc:
        raise said_once(exc) from None


def load_local_graph(comm: Communicator, data_dir: str | Path, groups: int, replication: int) -> LocalGraph:
    """This rank's row group, merged from its adjacent parts (collective validation).

    Every rank checks its own files; any problem on any rank raises the same
    :class:`ShardError` everywhere, before any other collective.
    """
    data_dir = Path(data_dir)
    meta: dict[str, Any] | None = None
    error: str | None = None
    try:
        meta = read_meta(data_dir)
        if meta["num_parts"] % groups != 0:
            raise ShardError(f"{data_dir}: {meta['num_parts']} parts cannot be split over {groups} row groups "
                             f"(P={comm.size}, c={replication}); use a P/c that divides the number of parts")
    except ShardError as exc:
        error = str(exc)
    _raise_if_any(comm, error)
    assert meta is not None
    per_group = meta["num_parts"] // groups
    group = comm.rank // replication
    pieces: list[dict[str, np.ndarray]] = []
    try:
        pieces = [read_part(data_dir, meta, index) for index in range(group * per_group, (group + 1) * per_group)]
    except ShardError as exc:
        error = str(exc)
    _raise_if_any(comm, error)
    offsets = meta["row_offsets"][::per_group]
    n_nodes = meta["num_nodes"]
    blocks = [sp.csr_matrix((p["data"], p["indices"], p["indptr"]), shape=(p["indptr"].size - 1, n_nodes))
              for p in pieces]
    rows = sp.csr_matrix(sp.vstack(blocks)) if blocks else sp.csr_matrix((0, n_nodes))
    return LocalGraph(
        layout=RowLayout(tuple(int(x) for x in offsets)), rows=rows,
        features=np.concatenate([p["features"] for p in pieces]),
        labels=np.concatenate([p["labels"] for p in pieces]),
        masks={split: np.concatenate([p[split] for p in pieces]) for split in ("train", "val", "test")},
        num_classes=meta["num_classes"], multilabel=meta["multilabel"], name=meta["name"],
        extra={"meta": meta},
    )
