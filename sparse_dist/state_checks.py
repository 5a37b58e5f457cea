"""Checks on per-rank policy state read back from a checkpoint's rank file, before any of it is used.

A rank file passes its checksum, but a checksum stops damage, not an author who rewrites it (and the digest).
What such a file holds reaches sparse kernels that do not check their indices (a cached block's column ids
index the cached rows in torch's CSR product), so every array is checked here for what its use assumes:
CSR structure within its shape, shapes that fit the plan and each other, finite values, integer ids in range.
Each check raises :class:`StateError` with one clause naming the field; the resume turns it into one sentence
agreed by every rank (:func:`runners.train_cmd._resume`).
"""

from __future__ import annotations

from typing import Any

import torch


class StateError(ValueError):
    """A checkpoint's policy state that this run cannot use (one clause)."""


def tensor(value: Any, what: str, *, dims: int, floating: bool) -> torch.Tensor:
    """``value`` as a ``dims``-dimensional tensor of a floating (finite values) or integer dtype."""
    if not isinstance(value, torch.Tensor) or value.dim() != dims:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise StateError(f"{what} is {shape}, expected a {dims}-dimensional tensor")
    if floating != value.is_floating_point() or value.is_complex():
        raise StateError(f"{what} has dtype {value.dtype}, expected {'floating' if floating else 'integer'} values")
    if floating and value.numel() and not bool(torch.isfinite(value).all()):
        raise StateError(f"{what} holds non-finite values")
    return value


def count(value: Any, what: str, low: int = 0) -> int:
    """``value`` as an integer ``>= low`` (a bool is not one)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise StateError(f"{what} is {value!r}, expected an integer >= {low}")
    return value


def ids(value: Any, what: str, bound: int, low: int = 0) -> torch.Tensor:
    """A 1-D integer tensor whose entries lie in ``[low, bound)``."""
    found = tensor(value, what, dims=1, floating=False)
    if found.numel() and (int(found.min()) < low or int(found.max()) >= bound):
        raise StateError(f"{what} holds ids outside [{low}, {bound})")
    return found


def rows(value: Any, what: str, dtype: torch.dtype | None = None, n_rows: int | None = None) -> torch.Tensor:
    """A 2-D floating tensor (of ``dtype`` and ``n_rows`` rows where given), finite."""
    found = tensor(value, what, dims=2, floating=True)
    if dtype is not None and found.dtype != dtype:
        raise StateError(f"{what} has dtype {found.dtype}, this run's is {dtype}")
    if n_rows is not None and found.shape[0] != n_rows:
        raise StateError(f"{what} has {found.shape[0]} rows, expected {n_rows}")
    return found


def payload(value: Any, what: str) -> torch.Tensor:
    """A 2-D tensor of received rows as a flight keeps them (floating rows finite; a codec's integer payload
    as it is)."""
    if isinstance(value, torch.Tensor) and not value.is_floating_point():
        return tensor(value, what, dims=2, floating=False)
    return rows(value, what)


def csr(entry: Any, what: str, n_rows: int, max_columns: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                        tuple[int, int]]:
    """``indptr``, ``indices``, ``data`` and ``shape`` of a CSR block of ``n_rows`` rows and at most
    ``max_columns`` columns: row pointers from 0 to the entry count and nondecreasing, column ids within the
    shape, finite values."""
    if not isinstance(entry, dict):
        raise StateError(f"{what} is not a block")
    shape = entry.get("shape")
    if not isinstance(shape, (list, tuple)) or len(shape) != 2:
        raise StateError(f"{what}'s shape {shape!r} is not two sizes")
    height, width = count(shape[0], f"{what}'s row count"), count(shape[1], f"{what}'s column count")
    if height != n_rows or width > max_columns:
        raise StateError(f"{what} is {height} x {width}, this run's block is {n_rows} x at most {max_columns}")
    indptr = tensor(entry.get("indptr"), f"{what}'s row pointers", dims=1, floating=False)
    indices = ids(entry.get("indices"), f"{what}'s column ids", max(width, 0))
    data = tensor(entry.get("data"), f"{what}'s values", dims=1, floating=True)
    if indptr.numel() != height + 1 or int(indptr[0]) != 0 or int(indptr[-1]) != indices.numel():
        raise StateError(f"{what}'s row pointers do not run from 0 to its {indices.numel()} entries over "
                         f"{height} rows")
    if indptr.numel() > 1 and bool((indptr[1:] < indptr[:-1]).any()):
        raise StateError(f"{what}'s row pointers decrease")
    if data.numel() != indices.numel():
        raise StateError(f"{what} has {data.numel()} values for {indices.numel()} column ids")
    return indptr, indices, data, (height, width)
