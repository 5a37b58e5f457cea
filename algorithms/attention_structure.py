"""The structure an attention layer works on: the stored entries of its blocks, on the device, cached.

An attention call (:mod:`algorithms.attention`) reads the entries of the row blocks it attends over
(the own block and the blocks of the received parts, or the own and halo blocks of a static halo) laid
side by side: per entry its destination row and source position, in row order and again in source
order (the transpose, for the backward), the entries' weights where a sample scales them, and the
sources' global ids where attention dropout needs them.

Cached with the operator (a ``DistSpMM`` or ``StaticHalo``), shared by the layers that use it and gone
with it, while the blocks are the same objects (across epochs when the exchange is exact). Memory per
stored entry: four int64 (32 bytes; plus a float weight where a sample scales entries), and 8 bytes per
row and per source.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.csr import entry_rows, scipy_csr

__all__ = ["AttentionEdges", "cached_edges", "cached_structure_bytes"]


@dataclass
class AttentionEdges:
    """The stored entries of one attention call: ``n`` destination rows over ``S`` sources, CSR order.

    ``row``/``col``: each entry's destination row and source position (``E`` int64, sorted by row);
    ``crow``: row pointers; ``weight``: the entries' ``w`` (None: all 1); ``order_t``, ``crow_t``,
    ``row_t``: the same entries sorted by source (the transpose's CSR). ``sources``: global id of
    each source (None where unknown). ``pinned``: the blocks it was built from (keeps their ids valid
    as cache keys).
    """

    n: int
    s: int
    crow: torch.Tensor
    row: torch.Tensor
    col: torch.Tensor
    weight: torch.Tensor | None
    crow_t: torch.Tensor
    row_t: torch.Tensor
    order_t: torch.Tensor
    sources: torch.Tensor | None
    pinned: tuple[Any, ...]

    @property
    def count(self) -> int:
        return int(self.col.numel())

    def nbytes(self) -> int:
        tensors = [self.crow, self.row, self.col, self.weight, self.crow_t, self.row_t, self.order_t, self.sources]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    @staticmethod
    def build(blocks: list[sp.csr_matrix], n: int, source_ids: list[np.ndarray | range | None],
              dtype: torch.dtype, device: torch.device, pinned: tuple[Any, ...]) -> "AttentionEdges":
        """From column blocks (each ``n x S_b``, columns in source order) laid side by side."""
        matrix = sp.hstack(blocks, format="csr") if len(blocks) > 1 else sp.csr_matrix(blocks[0]) if blocks \
            else sp.csr_matrix((n, 0))
        matrix.sort_indices()
        s = matrix.shape[1]
        col = matrix.indices.astype(np.int64)
        row = entry_rows(matrix.indptr)
        order_t = np.argsort(col, kind="stable")
        crow_t = np.concatenate(([0], np.cumsum(np.bincount(col, minlength=s)))).astype(np.int64)
        ones = matrix.nnz == 0 or bool(np.all(matrix.data == 1.0))
        known = all(ids is not None for ids in source_ids)
        sources = (np.concatenate([np.asarray(ids, dtype=np.int64) for ids in source_ids] + [np.empty(0, np.int64)])
                   if known else None)

        def tensor(array: np.ndarray, kind: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=kind)

        return AttentionEdges(n, s, tensor(matrix.indptr), tensor(row), tensor(col),
                              None if ones else tensor(matrix.data, dtype), tensor(crow_t), tensor(row[order_t]),
                              tensor(order_t), None if sources is None else tensor(sources), pinned)


_STRUCTURES: "weakref.WeakKeyDictionary[object, OrderedDict[tuple[Any, ...], AttentionEdges]]" = \
    weakref.WeakKeyDictionary()
"""Attention structures per operator (a ``DistSpMM`` or ``StaticHalo``), shared by the layers that use it
and gone with it: at most :data:`_KEPT` per operator (evaluation's, and this epoch's where a policy
changes the blocks)."""
_KEPT = 4


def cached_edges(operator: object, blocks: list[Any], n: int, source_ids: list[np.ndarray | range | None],
                 dtype: torch.dtype, device: torch.device) -> AttentionEdges:
    """The structure of ``blocks`` (scipy or torch CSR) laid side by side, cached with ``operator``.

    Keyed by the blocks' identities (the entry pins them, so an id cannot be reused while cached): the
    exact blocks are the same objects every epoch, a sample's are new ones.
    """
    cache = _STRUCTURES.setdefault(operator, OrderedDict())
    key = (n, device, *(id(block) for block in blocks))
    edges = cache.get(key)
    if edges is None or (edges.sources is None and all(ids is not None for ids in source_ids)):
        scipy_blocks = [b if sp.issparse(b) else scipy_csr(b) for b in blocks]
        edges = cache[key] = AttentionEdges.build(scipy_blocks, n, source_ids, dtype, device, tuple(blocks))
        while len(cache) > _KEPT:
            cache.popitem(last=False)
    cache.move_to_end(key)
    return edges


def cached_structure_bytes(*operators: object) -> int:
    """Bytes of the attention structures cached with ``operators`` on this rank (0 where none)."""
    return sum(edges.nbytes() for op in operators if op is not None for edges in _STRUCTURES.get(op, {}).values())
