"""The sharded dataset format (DESIGN section 6): write once, read one's own part(s).

A dataset directory holds:

* ``meta.json``: ``format_version``, ``name``, ``num_nodes``, ``num_edges``,
  ``feature_dim``, ``num_classes``, ``multilabel``, ``partitioner``,
  ``num_parts``, ``row_offsets`` (``num_parts + 1``), ``permutation_file``,
  ``files`` (file name -> SHA-256), ``partition_stats``
  (:func:`runners.data.partition.partition_statistics`), ``feature_dtype``
  (``float32``, or ``float64`` when the input's features were float64: they
  are kept, not rounded; ``train`` casts them to its ``--dtype``), and for
  ``bytegnn`` its block radius ``partition_hops``;
* ``permutation.npy``: new node id -> original node id;
* ``part-NNNNN.npz`` per part: ``indptr``, ``indices`` (GLOBAL new ids),
  ``data`` (edge weights), ``features``, ``labels``, ``train``, ``val``,
  ``test`` for the part's rows only.

``write_shards`` writes into a temporary directory next to the target and
renames it into place, so a crash never leaves a half-written dataset; an
exception (also SIGINT, or SIGTERM through the command's handler) removes the
temporary directory (:func:`removed_on_failure`).
A run on ``G`` row groups merges ``num_parts / G`` adjacent parts per group.

This module writes the format (and keeps an output directory safe to replace); reading it, with every check of
``meta.json`` and of a part, is :mod:`runners.data.shard_reader`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import scipy.sparse as sp

from runners.data.datasets import GraphData, feature_dtype
from runners.data.partition import DEFAULT_HOPS, BoundaryAccumulator, partition, relabel
# the reading side; load_local_graph, read_part and the meta rules are imported from here by callers too
from runners.data.shard_reader import (FORMAT_VERSION, META_RULES, OWN_FILE, STATS_RULES,  # noqa: F401
                                       ShardError, dataset_files, load_local_graph, part_file, read_meta,
                                       read_part, read_permutation, sha256_file)
from runners.data.stages import NoStages
from runners.data.stages import progress_line as _progress
from sparse_dist.log import get_logger

SCRATCH_FILE = re.compile(r"\d+\.bin")
FEATURE_BLOCK = 1 << 16
"""Nodes whose features the writer handles at once (memory only)."""
PROGRESS_AFTER = 2.0
"""Seconds a writing step runs before it prints progress lines."""
"""The edge buckets ``prepare synthetic --stream`` keeps in ``buckets/`` of its temporary directory."""


@contextlib.contextmanager
def removed_on_failure(temporary: Path) -> Iterator[Path]:
    """Create the directory ``temporary`` (afresh); remove it if the body raises anything, then re-raise."""
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir(parents=True)
    try:
        yield temporary
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def _process_runs(pid: int, word: bytes) -> bool | None:
    """Whether process ``pid`` runs, and whether its command line holds ``word``: None (gone), False (a
    process with that id runs something else), True."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return word in handle.read()
    except OSError:
        return False


def _only_own_files(directory: Path) -> bool:
    """Whether ``directory`` holds nothing but files prepare writes (:data:`OWN_FILE`, and the streamed
    generator's ``buckets/N.bin``), none of them a symbolic link."""
    for entry in directory.iterdir():
        if entry.is_symlink():
            return False
        if entry.is_dir():
            if entry.name != "buckets" or not all(not f.is_symlink() and f.is_file() and SCRATCH_FILE.fullmatch(f.name)
                                                  for f in entry.iterdir()):
                return False
        elif not (entry.is_file() and OWN_FILE.fullmatch(entry.name)):
            return False
    return True


def _remove_own(directory: Path) -> None:
    """Remove a directory :func:`_only_own_files` passed: its files one by one, then the (empty) directories."""
    for entry in directory.iterdir():
        if entry.is_dir():
            for item in entry.iterdir():
                item.unlink()
            entry.rmdir()
        else:
            entry.unlink()
    directory.rmdir()


@dataclass(frozen=True)
class Leftover:
    """A temporary (``.NAME.tmp-PID``) or set-aside (``.NAME.old-PID``) directory of an earlier prepare."""

    path: Path
    removed: bool
    why: str


def clear_leftovers(out_dir: str | Path) -> list[Leftover]:
    """Find what a killed ``prepare`` of ``out_dir`` left beside it and remove what is provably its own.

    Its temporary directory ``.NAME.tmp-PID`` (and the old dataset ``.NAME.old-PID`` that ``--overwrite`` set
    aside, once ``out_dir`` is a dataset again) is removed when process PID no longer runs and the directory
    holds nothing but files prepare writes; anything else is kept and reported with the command that removes
    it. A prepare still running (its command line says ``prepare``) is left alone, unreported.
    """
    out_dir = Path(out_dir)
    found: list[Leftover] = []
    if not out_dir.name or not out_dir.parent.is_dir():
        return found
    pattern = re.compile(re.escape(f".{out_dir.name}.") + r"(tmp|old)-(\d+)")
    for path in sorted(out_dir.parent.iterdir()):
        match = pattern.fullmatch(path.name)
        if not match or int(match.group(2)) == os.getpid():
            continue
        kind, pid = match.group(1), int(match.group(2))
        runs = _process_runs(pid, b"prepare")
        if runs:
            continue
        if runs is not None:
            found.append(Leftover(path, False, f"process {pid}, whose name it bears, still runs; remove it with "
                                               f"`rm -r {path}` if no prepare writes it"))
        elif path.is_symlink() or not path.is_dir() or not _only_own_files(path):
            found.append(Leftover(path, False, f"it holds files prepare did not write; remove it yourself "
                                               f"(`rm -r {path}`) if it is not yours"))
        elif kind == "old" and not (out_dir / "meta.json").is_file():
            found.append(Leftover(path, False, f"the dataset a killed `prepare --overwrite` moved aside from "
                                               f"{out_dir}: `mv {path} {out_dir}` restores it, `rm -r {path}` "
                                               f"removes it"))
        else:
            _remove_own(path)
            found.append(Leftover(path, True, f"left by a prepare (process {pid}) that was killed"))
    return found


def _listing(paths: list[Path], shown: int = 3) -> str:
    names = [p.name + ("/" if p.is_dir() and not p.is_symlink() else "") for p in sorted(paths)]
    more = f", ... ({len(names)} entries in all)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _not_replaceable(out_dir: Path) -> str | None:
    """What makes ``out_dir`` more than a dataset ``prepare`` may replace, or None (absent, empty, or a dataset
    directory holding only the files prepare wrote, as its meta.json lists them)."""
    if out_dir.is_symlink():
        return "a symbolic link"
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        return "a file"
    entries = list(out_dir.iterdir())
    if not entries:
        return None
    if not (out_dir / "meta.json").is_file():
        return f"a directory with no meta.json, holding {_listing(entries)}"
    try:
        meta = read_meta(out_dir)
    except ShardError as exc:
        return f"its meta.json is not one prepare wrote: {str(exc).removeprefix(str(out_dir / 'meta.json') + ': ')}"
    foreign = [entry for entry in entries if entry.name not in dataset_files(meta)
               or entry.is_dir() or entry.is_symlink()]
    if foreign:
        return f"a dataset directory that also holds {_listing(foreign)}, which prepare did not write"
    return None


def output_problem(out_dir: str | Path, overwrite: bool) -> str | None:
    """Why ``prepare`` may not write the dataset directory ``out_dir`` (one sentence naming it), or None.

    ``--overwrite`` replaces only a directory that is a sparse_dist dataset (its ``meta.json`` passes
    :func:`read_meta`) and holds nothing but the files its ``meta.json`` lists, or an empty directory;
    anything else is refused, with or without ``--overwrite``, so no user file is ever removed.
    """
    out_dir = Path(out_dir)
    found = _not_replaceable(out_dir)
    if found is not None:
        return (f"{out_dir} is not a dataset directory prepare may replace ({found}): --overwrite replaces only "
                f"one holding just the files its meta.json lists, so nothing was changed; choose another --out or "
                f"move what is there yourself")
    if out_dir.exists() and not overwrite:
        what = "an empty directory" if not any(out_dir.iterdir()) else "a sparse_dist dataset"
        return f"{out_dir} already exists ({what}); pass --overwrite to replace it"
    return None


def dataset_problem(nodes: int, parts: int, train_nodes: int | None) -> str | None:
    """Why a graph of ``nodes`` nodes (``train_nodes`` of them in the training split, None: not known yet) cannot
    become ``parts`` shards that ``train`` can use, or None. Said before anything is written."""
    if nodes < 2:
        return f"the graph has {nodes} node(s); training needs at least 2"
    if parts > nodes:
        return f"--parts {parts} is more than the graph's {nodes} nodes; use --parts {nodes} or fewer"
    if train_nodes == 0:
        return (f"the training split of the {nodes} nodes is empty; give some nodes train=True (--masks) or a "
                f"larger training fraction (--split)")
    return None


NPZ_DATE = (1980, 1, 1, 0, 0, 0)
"""The date every member of a shard archive carries (zip's earliest), so a dataset's bytes and its SHA-256s
depend on its contents only, never on when it was written."""
WRITE_BLOCK = 1 << 22
"""Elements an array member is converted and written in at once (bounded memory for a part's columns)."""


class NpzWriter:
    """A ``.npz`` (a zip of ``.npy`` members, stored, zip64, as ``np.savez`` writes it, read by ``np.load``)
    written member by member: :meth:`add` writes a whole array (converted to ``dtype`` a block at a time),
    :meth:`open_rows` starts a member whose rows are appended later (:meth:`append_rows`). One member is open
    at a time per archive; every member is dated :data:`NPZ_DATE`."""

    def __init__(self, path: Path) -> None:
        self.archive = zipfile.ZipFile(path, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True)
        self.member: Any = None
        self.expected = 0

    def _start(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        info = zipfile.ZipInfo(f"{name}.npy", date_time=NPZ_DATE)
        info.external_attr = 0o600 << 16  # as ZipFile.open(name, "w") gives np.savez's members
        member = self.archive.open(info, "w", force_zip64=True)
        np.lib.format.write_array_header_1_0(member, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                      "fortran_order": False, "shape": tuple(shape)})
        return member

    def add(self, name: str, array: np.ndarray, dtype: Any = None) -> None:
        dtype = np.dtype(dtype or array.dtype)
        flat = array.reshape(-1) if array.flags.c_contiguous else np.ascontiguousarray(array).reshape(-1)
        with self._start(name, dtype, array.shape) as member:
            for lo in range(0, flat.size, WRITE_BLOCK):
                member.write(flat[lo:lo + WRITE_BLOCK].astype(dtype, copy=False).tobytes())

    def open_rows(self, name: str, dtype: Any, shape: tuple[int, ...]) -> None:
        self.member = self._start(name, np.dtype(dtype), shape)
        self.dtype, self.expected = np.dtype(dtype), int(np.prod(shape))

    def append_rows(self, rows: np.ndarray) -> None:
        self.member.write(np.ascontiguousarray(rows, dtype=self.dtype).tobytes())
        self.expected -= rows.size

    def close_rows(self) -> None:
        if self.expected != 0:
            raise ShardError(f"{self.archive.filename}: a streamed member got {-self.expected} values too many"
                             if self.expected < 0 else f"{self.archive.filename}: a streamed member is "
                             f"{self.expected} values short")
        self.member.close()
        self.member = None

    def close(self) -> None:
        if self.member is not None:
            self.member.close()
        self.archive.close()


def _feature_rows(features: Any) -> Callable[[int, int], np.ndarray]:
    """``rows(lo, hi)`` of node features given as an array or as a generator of row blocks (an object with
    ``rows(lo, hi)``, ``shape`` and ``dtype``, e.g. :class:`runners.data.rmat.RmatFeatures`)."""
    if hasattr(features, "rows"):
        return features.rows
    return lambda lo, hi: features[lo:hi]


def _write_features(writers: list[NpzWriter], features: Any, part_of: np.ndarray, sizes: np.ndarray,
                    dtype: Any, block: int, progress: bool) -> None:
    """Every part's ``features`` member, written in one pass over the nodes in blocks of ``block`` original ids:
    each row goes to its part's archive. A part's rows are its nodes in original order (:func:`relabel` is a
    stable sort), the order the blocks come in, so the whole feature matrix is never held."""
    rows_of = _feature_rows(features)
    width = int(features.shape[1])
    n = part_of.size
    for index, writer in enumerate(writers):
        writer.open_rows("features", dtype, (int(sizes[index]), width))
    started = time.perf_counter()
    blocks = (n + block - 1) // block
    for number, lo in enumerate(range(0, n, block), 1):
        rows = rows_of(lo, min(lo + block, n))
        owner = part_of[lo:lo + block]
        for index, writer in enumerate(writers):
            writer.append_rows(rows[owner == index])
        if progress and time.perf_counter() - started > PROGRESS_AFTER:
            _progress("prepare: writing features (blocks of nodes)", number, blocks, started)
    for writer in writers:
        writer.close_rows()


def write_shards(data: GraphData, out_dir: str | Path, parts: int, partitioner: str = "block", seed: int = 0,
                 overwrite: bool = False, hops: int = DEFAULT_HOPS, symmetric: bool = False,
                 stages: Any = None, progress: bool = False, feature_block: int = FEATURE_BLOCK) -> dict[str, Any]:
    """Partition ``data`` into ``parts`` shards under ``out_dir``; returns the meta dict (``hops``: bytegnn's K).

    An existing ``out_dir`` is replaced only under :func:`output_problem`'s rules (checked again at the swap);
    a graph ``train`` could not use (:func:`dataset_problem`) is refused before anything is written.
    ``symmetric``: the adjacency is already a symmetric CSR without self-loops, indices sorted (METIS takes it
    as it is). ``data.features`` may be an array or a generator of row blocks (:func:`_feature_rows`): the
    features are written in one pass of ``feature_block`` nodes, straight into the parts' archives, then each
    part's rows one part at a time, so besides the input the writer holds one block and one part's rows.
    ``stages`` (:class:`runners.data.stages.Stages`) times and measures the partition and the writing;
    ``progress``: progress lines on stderr.
    """
    out_dir = Path(out_dir)
    stages = stages or NoStages()
    problem = output_problem(out_dir, overwrite)
    if problem:
        raise ShardError(problem)
    problem = dataset_problem(int(data.num_nodes), parts, int(np.count_nonzero(data.masks["train"])))
    if problem:
        raise ShardError(f"{data.name}: {problem}")
    with stages.stage(f"partition ({partitioner})"):
        part_of = partition(partitioner, data.adjacency, parts, seed, data.masks["train"], masks=data.masks,
                            hops=hops, symmetric=symmetric)
    order, offsets = relabel(part_of, parts)
    new_id = np.empty_like(order)
    new_id[order] = np.arange(order.size)
    source = sp.csr_matrix(data.adjacency)
    features_dtype = feature_dtype(data.features)  # an array or a generator of blocks: both have a dtype

    with removed_on_failure(out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")) as temporary:
        files: dict[str, str] = {}
        np.save(temporary / "permutation.npy", order)
        files["permutation.npy"] = sha256_file(temporary / "permutation.npy")
        statistics = BoundaryAccumulator(offsets)
        writers = [NpzWriter(temporary / part_file(index)) for index in range(parts)]
        try:
            with stages.stage("write features"):
                _write_features(writers, data.features, part_of, np.diff(offsets), features_dtype, feature_block,
                                progress)
            del part_of
            with stages.stage("write adjacency"):
                started = time.perf_counter()
                for index in range(parts):
                    # One part's rows at a time, relabelled on the fly: never a second copy of the whole graph.
                    lo, hi = offsets[index], offsets[index + 1]
                    nodes = order[lo:hi]
                    rows = source[nodes]
                    rows = sp.csr_matrix((rows.data, new_id[rows.indices], rows.indptr), shape=rows.shape)
                    rows.sort_indices()
                    writer = writers[index]
                    writer.add("indptr", rows.indptr, np.int64)
                    writer.add("indices", rows.indices, np.int64)
                    writer.add("data", rows.data, np.float32)
                    for key, values in (("labels", data.labels), *((k, data.masks[k]) for k in ("train", "val", "test"))):
                        writer.add(key, values[nodes])
                    writer.close()
                    statistics.add_part(index, rows.indices, int(data.masks["train"][nodes].sum()))
                    del rows
                    name = part_file(index)
                    files[name] = sha256_file(temporary / name)
                    if progress and time.perf_counter() - started > PROGRESS_AFTER:
                        _progress("prepare: writing parts", index + 1, parts, started)
        finally:
            for writer in writers:
                writer.close()
        stats = statistics.summary()
        meta = {"format_version": FORMAT_VERSION, "name": data.name, "num_nodes": int(data.num_nodes),
                "num_edges": int(sum(stats["edges"])), "feature_dim": int(data.features.shape[1]),
                "feature_dtype": np.dtype(features_dtype).name,
                "num_classes": int(data.num_classes), "multilabel": bool(data.multilabel),
                "partitioner": partitioner, "partition_seed": seed, "num_parts": parts,
                **({"partition_hops": hops} if partitioner == "bytegnn" else {}),
                "row_offsets": offsets.tolist(), "permutation_file": "permutation.npy", "files": files,
                "partition_stats": stats, **data.meta_extra}
        return finish_dataset(temporary, out_dir, meta)


def finish_dataset(temporary: Path, out_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Write ``meta.json`` into the finished temporary directory and swap it into place.

    A previous dataset at ``out_dir`` (checked again now: it may have changed while the input was read)
    is renamed aside (``.NAME.old-PID``), the new one renamed into place, then the old one's files (only
    those its meta.json lists, and meta.json) are removed and its directory with them. A crash between the
    two renames leaves both complete datasets beside ``out_dir``, never a half-written one (the next
    ``prepare`` of the same ``--out`` finds them: :func:`clear_leftovers`). Only plain names of
    :data:`OWN_FILE`'s form are removed, so nothing outside the old directory, or not written by
    ``prepare``, ever is.
    """
    (temporary / "meta.json").write_text(json.dumps(meta, indent=1))
    problem = output_problem(out_dir, overwrite=True)
    if problem:
        raise ShardError(problem)
    if not out_dir.exists():
        os.replace(temporary, out_dir)
        return meta
    if not any(out_dir.iterdir()):
        os.replace(temporary, out_dir)  # rename(2) replaces an empty directory
        return meta
    old_files = [name for name in dataset_files(read_meta(out_dir)) if OWN_FILE.fullmatch(name)]
    aside = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    os.replace(out_dir, aside)
    os.replace(temporary, out_dir)
    for name in old_files:  # plain names of our own form (read_meta): never a path outside the directory
        (aside / name).unlink(missing_ok=True)
    try:
        aside.rmdir()
    except OSError:  # something appeared there meanwhile: not ours to remove
        get_logger(__name__).warning("kept %s: it holds files prepare did not write", aside)
    return meta
