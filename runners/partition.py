"""Partitioners: which original node goes to which part, then a contiguous relabelling.

A partitioner returns ``part_of[node]``; :func:`relabel` turns it into the
permutation ``order`` (new id -> original id; nodes of part 0 first, each
part's nodes in original order) and row offsets per part. Deterministic for
a seed.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

PARTITIONERS = ("block", "random")


def partition(kind: str, adjacency: sp.csr_matrix, parts: int, seed: int = 0) -> np.ndarray:
    """``part_of`` for every node (``block``: contiguous balanced ranges; ``random``: balanced random)."""
    n = adjacency.shape[0]
    if parts < 1:
        raise ValueError(f"number of parts must be >= 1, got {parts}")
    balanced = np.repeat(np.arange(parts), [n // parts + (1 if i < n % parts else 0) for i in range(parts)])
    if kind == "block":
        return balanced
    if kind == "random":
        return np.random.default_rng(seed).permutation(balanced)
    raise ValueError(f"unknown partitioner {kind!r}; expected one of {PARTITIONERS}")


def relabel(part_of: np.ndarray, parts: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, offsets)``: new id ``k`` is original node ``order[k]``; part ``i`` owns ``[offsets[i], offsets[i+1])``."""
    order = np.argsort(part_of, kind="stable")
    counts = np.bincount(part_of, minlength=parts)
    return order.astype(np.int64), np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
