"""Counter-based hashes that every rank evaluates alike: the random decisions of the sampling policies.

A decision about one global row (or column) in one epoch is a pure function of (seed, epoch, stream,
id), so an owner and a receiver reach the same decision without talking, and it does not depend on
``P`` where the stream does not.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, vectorised over uint64 (wrapping arithmetic)."""
    z = np.asarray(values, dtype=np.uint64) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def row_hash(seed: int, epoch: int, stream: int, ids: np.ndarray, salt: int = 0) -> np.ndarray:
    """64-bit hash per id: the splitmix64 chain of ``seed``, ``epoch + salt``, ``stream``, then the id.

    ``salt`` separates policies that hash the same ids (0: BNS's boundary rows).
    """
    key = splitmix64(np.array([seed], dtype=np.uint64))
    key = splitmix64(key ^ np.array([epoch + salt], dtype=np.uint64))
    key = splitmix64(key ^ np.array([stream], dtype=np.uint64))
    return splitmix64(np.asarray(ids, dtype=np.int64).astype(np.uint64) ^ key)


def uniforms(seed: int, epoch: int, stream: int, ids: np.ndarray, salt: int = 0) -> np.ndarray:
    """``U[0, 1)`` per id from :func:`row_hash` (its top 53 bits)."""
    return (row_hash(seed, epoch, stream, ids, salt) >> np.uint64(11)).astype(np.float64) * 2.0**-53
