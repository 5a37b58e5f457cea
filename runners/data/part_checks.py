"""Every array of a shard checked before scipy, torch or a compiled kernel touches it.

A checksum in ``meta.json`` detects a damaged file; it does not stop a hostile author, who rewrites it. A shard
whose ``indptr`` ends short of its entries made scipy write past an array (glibc: ``malloc(): invalid size``),
one with ``indptr[10] = 10^12`` asked for a 10^12-entry allocation. So a part is checked in two steps, both
vectorised, O(entries), with at most a byte or two per entry beyond the arrays themselves:

1. :func:`member_problem`, before any array is read: each ``.npy`` member's header (its dtype, its shape and
   that its declared size is what the member holds), against what the part must be (``meta.json``'s rows and
   feature width): nothing is allocated from a size the file only claims.
2. :func:`part_problem`, once read: ``indptr`` (``rows + 1`` entries, from 0, non-decreasing, ending at the
   entry count), ``indices`` (node ids in ``[0, num_nodes)``), ``data`` (one finite weight per entry),
   ``features`` (finite, ``meta.json``'s ``feature_dtype``), ``labels`` (classes in range, or a 0/1 matrix for a
   multi-label dataset) and the masks (0/1, one per row).

Each answer is one clause naming the array, the first bad position and what was expected (the caller prefixes
the file). Who reads shards: :mod:`runners.data.shard_reader` (every training and bench run) and the cost
model's :mod:`runners.perf.workload` (structure only).
"""

from __future__ import annotations

import zipfile
from tokenize import TokenError
from typing import IO, Any, Iterable

import numpy as np

PART_ARRAYS = ("indptr", "indices", "data", "features", "labels", "train", "val", "test")
STRUCTURE = ("indptr", "indices", "data")
MASKS = ("train", "val", "test")
PART_KINDS = {"indptr": "iu", "indices": "iu", "data": "fiu", "features": "f", "labels": "iub",
              "train": "biu", "val": "biu", "test": "biu"}
"""numpy dtype kinds each shard array may have (anything else is refused before it is read)."""
_KIND_WORDS = {"iu": "an integer", "fiu": "a numeric", "f": "a floating-point", "iub": "an integer",
               "biu": "a boolean (or 0/1 integer)"}
HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
"""The ``.npy`` header versions ``np.savez`` writes for numeric arrays."""
_SCAN_BLOCK = 1 << 22
"""Entries scanned at a time where a check needs a temporary (a bool per entry): 4 MiB at most."""


def _shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


def expected_shapes(meta: dict[str, Any], index: int) -> dict[str, tuple[int | None, ...]]:
    """The shape each array of part ``index`` must have (None: any length, the entry count)."""
    rows = meta["row_offsets"][index + 1] - meta["row_offsets"][index]
    labels: tuple[int | None, ...] = (rows, meta["num_classes"]) if meta["multilabel"] else (rows,)
    return {"indptr": (rows + 1,), "indices": (None,), "data": (None,), "features": (rows, meta["feature_dim"]),
            "labels": labels, "train": (rows,), "val": (rows,), "test": (rows,)}


def _shape_fits(shape: tuple[int, ...], expected: tuple[int | None, ...]) -> bool:
    return len(shape) == len(expected) and all(want is None or have == want for have, want in zip(shape, expected))


def npy_header(handle: IO[bytes], available: int) -> tuple[str | None, tuple[int, ...], np.dtype]:
    """The shape and dtype an ``.npy`` stream's header declares, read without reading its data, and why it
    cannot be read safely (or None): a header that does not parse, a version ``np.save`` does not write for
    numbers, objects, or a declared size other than the ``available`` bytes the stream holds (so nothing is
    ever allocated from a size the file only claims)."""
    empty: tuple[str | None, tuple[int, ...], np.dtype] = (None, (), np.dtype(np.uint8))
    try:
        version = np.lib.format.read_magic(handle)
        if version not in HEADER_READERS:
            return (f"is in .npy format {version}, expected 1.0 or 2.0", *empty[1:])
        shape, _, dtype = HEADER_READERS[version](handle)
        header_bytes = handle.tell()
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, SyntaxError, TypeError, TokenError) as exc:
        return (f"has no readable .npy header ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
                *empty[1:])
    if dtype.hasobject:
        return ("holds Python objects; only numbers are read", tuple(shape), dtype)
    declared = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if available != header_bytes + declared:
        return (f"declares {declared} bytes of data but holds {available - header_bytes}", tuple(shape), dtype)
    return None, tuple(shape), dtype


def plain(dtype: np.dtype, kinds: str) -> bool:
    """Whether ``dtype`` is a plain number of one of ``kinds`` (numpy kind letters): no objects, no fields, no
    sub-arrays. Every reader of an ``.npy`` asks this of the dtype its header declares."""
    return not dtype.hasobject and dtype.fields is None and dtype.subdtype is None and dtype.kind in kinds


def member_problem(archive: zipfile.ZipFile, archive_bytes: int, meta: dict[str, Any], index: int,
                   names: Iterable[str] = PART_ARRAYS) -> str | None:
    """Why the ``.npy`` members ``names`` of part ``index`` cannot be read safely, or None, from their headers
    alone: a member missing, a header that does not parse, a dtype of the wrong kind (or with fields, or
    objects), a shape other than :func:`expected_shapes`, a declared size other than the bytes it holds, or a
    member compressed or reaching past the archive's ``archive_bytes``."""
    members = {info.filename: info for info in archive.infolist()}
    missing = [name for name in names if name + ".npy" not in members]
    if missing:
        return f"missing arrays {missing}"
    shapes = expected_shapes(meta, index)
    for name in names:
        info = members[name + ".npy"]
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            return (f"array {name!r} is a compressed member; prepare stores its arrays uncompressed (np.savez, "
                    f"not np.savez_compressed), so their sizes are the bytes on disk")
        if info.header_offset + info.file_size > archive_bytes:
            return f"array {name!r} claims {info.file_size} bytes, more than the file's {archive_bytes}"
        with archive.open(info) as member:
            problem, shape, dtype = npy_header(member, info.file_size)
        if problem:
            return f"array {name!r} {problem}"
        kinds = PART_KINDS[name]
        if not plain(dtype, kinds):
            return f"array {name!r} is of type {dtype}, expected {_KIND_WORDS[kinds]} type"
        if name == "features" and dtype.name != meta.get("feature_dtype", "float32"):
            return (f"array 'features' is of type {dtype}, expected {meta.get('feature_dtype', 'float32')} "
                    f"(meta.json's feature_dtype)")
        if not _shape_fits(tuple(shape), shapes[name]):
            want = _shape_text(tuple("any" if n is None else n for n in shapes[name]))  # type: ignore[misc]
            return f"array {name!r} has shape {_shape_text(tuple(shape))}, expected {want} from meta.json"
    return None


def _first_where(values: np.ndarray, bad: Any) -> int | None:
    """The first flat position where ``bad(block)`` is true, scanning ``values`` a block at a time (a bool per
    entry of one block at most), or None."""
    flat = values.reshape(-1)
    for start in range(0, flat.size, _SCAN_BLOCK):
        hits = bad(flat[start:start + _SCAN_BLOCK])
        if hits.any():
            return start + int(np.argmax(hits))
    return None


def _unsigned_max(values: np.ndarray) -> int:
    """The largest entry of integer ``values`` read as unsigned (a view, no copy): a negative entry reads as at
    least 2^(bits-1), so one pass answers "all in [0, bound)" where ``min`` and ``max`` take two."""
    if values.dtype.kind == "b":
        return int(values.max())
    return int(values.view(np.dtype(f"u{values.dtype.itemsize}")).max())


def _first_non_finite(values: np.ndarray) -> int | None:
    """The first flat position of a NaN or infinity in ``values`` (floating point), or None. A block whose sum is
    finite has none (NaN and infinities propagate through a sum), so the per-entry scan runs only on a block
    whose sum is not (one that holds one, or whose finite values overflow): about a third of the time of
    ``isfinite`` on every entry."""
    flat = values.reshape(-1)
    for start in range(0, flat.size, _SCAN_BLOCK):
        block = flat[start:start + _SCAN_BLOCK]
        with np.errstate(all="ignore"):  # the sum of a block holding NaN or overflowing says so
            total = block.sum()
        if np.isfinite(total):
            continue
        hits = ~np.isfinite(block)
        if hits.any():
            return start + int(np.argmax(hits))
    return None


def _position(array: np.ndarray, flat: int) -> str:
    return str(flat) if array.ndim == 1 else _shape_text(tuple(int(i) for i in np.unravel_index(flat, array.shape)))


def _value(array: np.ndarray, flat: int) -> str:
    return repr(array.reshape(-1)[flat].item())


def structure_problem(arrays: dict[str, np.ndarray], num_nodes: int) -> str | None:
    """Why ``indptr``, ``indices`` and ``data`` (shapes already checked) are not CSR rows over ``num_nodes``
    columns, or None."""
    indptr, indices, data = arrays["indptr"], arrays["indices"], arrays["data"]
    if indptr[0] != 0:
        return f"array 'indptr' at position 0 is {_value(indptr, 0)}, expected 0 (row pointers start at 0)"
    falls = _first_where(np.diff(indptr), lambda step: step < 0)
    if falls is not None:
        return (f"array 'indptr' at position {falls + 1} is {_value(indptr, falls + 1)}, below the "
                f"{_value(indptr, falls)} before it; expected non-decreasing row pointers")
    if indptr[-1] != indices.size:
        return (f"array 'indptr' at position {indptr.size - 1} is {_value(indptr, indptr.size - 1)}, expected the "
                f"entry count {indices.size} (the length of 'indices')")
    if data.size != indices.size:
        return f"array 'data' has {data.size} entries, expected one per entry of 'indices' ({indices.size})"
    if indices.size and _unsigned_max(indices) >= num_nodes:
        at = _first_where(indices, lambda ids: (ids < 0) | (ids >= num_nodes))
        assert at is not None
        return f"array 'indices' at position {at} is {_value(indices, at)}, expected a node id in [0, {num_nodes})"
    if data.dtype.kind == "f":
        at = _first_non_finite(data)
        if at is not None:
            return f"array 'data' at position {at} is {_value(data, at)}, expected a finite edge weight"
    return None


def part_problem(meta: dict[str, Any], index: int, arrays: dict[str, np.ndarray]) -> str | None:
    """Why the arrays of part ``index`` that ``arrays`` holds (the structure's three together, or none of them;
    headers already passed :func:`member_problem`) are not what ``prepare`` writes, or None:
    :func:`structure_problem` and the entry count ``meta.json``'s ``partition_stats`` gives the part (the memory
    estimate reads it), then features, labels and masks."""
    if "indptr" in arrays:
        problem = structure_problem(arrays, meta["num_nodes"])
        if problem:
            return problem
        edges = meta.get("partition_stats", {}).get("edges")
        if edges is not None and edges[index] != arrays["indices"].size:
            return (f"array 'indices' holds {arrays['indices'].size} entries, but meta.json's "
                    f"partition_stats.edges gives part {index} {edges[index]}")
    if "features" in arrays:
        features = arrays["features"]
        at = _first_non_finite(features)
        if at is not None:
            return f"array 'features' at {_position(features, at)} is {_value(features, at)}, expected a finite value"
    if "labels" in arrays:
        labels, classes = arrays["labels"], meta["num_classes"]
        at = None
        if meta["multilabel"]:
            at = _first_where(labels, lambda block: (block != 0) & (block != 1))
            expected = "0 or 1 (a multi-label matrix)"
        elif labels.size and _unsigned_max(labels) >= classes:
            at = _first_where(labels, lambda block: (block < 0) | (block >= classes))
            expected = f"a class in [0, {classes - 1}] (num_classes={classes})"
        if at is not None:
            return f"array 'labels' at {_position(labels, at)} is {_value(labels, at)}, expected {expected}"
    for name in MASKS:
        if name in arrays and arrays[name].dtype != np.bool_:
            at = _first_where(arrays[name], lambda block: (block != 0) & (block != 1))
            if at is not None:
                return f"array {name!r} at position {at} is {_value(arrays[name], at)}, expected 0 or 1 (a mask)"
    return None
