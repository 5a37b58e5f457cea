"""splitmix64 on NumPy ``uint64``: the one counter-based mixer every random decision of the project uses.

A leaf of the library, so that :mod:`sparse_dist.sampling` (mini-batch neighbour draws) and
:mod:`algorithms.hashing` (the policies' and attention dropout's decisions, and the torch form with the
same bits) share one definition.
"""

from __future__ import annotations

import numpy as np

__all__ = ["GOLDEN", "MIX1", "MIX2", "UNIT", "splitmix64", "stream_words", "unit_floats"]

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
UNIT = 2.0**-53
"""A word's top 53 bits times this are uniform on ``[0, 1)``, exactly (:func:`unit_floats`)."""


def splitmix64(values: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, vectorised over uint64 (wrapping arithmetic)."""
    z = np.asarray(values, dtype=np.uint64) + GOLDEN
    z = (z ^ (z >> np.uint64(30))) * MIX1
    z = (z ^ (z >> np.uint64(27))) * MIX2
    return z ^ (z >> np.uint64(31))


def unit_floats(words: np.ndarray) -> np.ndarray:
    """uint64 words as float64 uniform on ``[0, 1)``: their top 53 bits times 2^-53 (exact, no rounding)."""
    return (np.asarray(words, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * UNIT


def stream_words(key: int, indices: np.ndarray) -> np.ndarray:
    """Words ``indices`` (non-negative) of the SplitMix64 stream seeded with ``key``: word ``w`` is
    ``splitmix64(key + w * GOLDEN)``, the ``w``-th output of Steele, Lea and Flood's generator from that seed, so
    any word can be made without the ones before it (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        return splitmix64(np.uint64(key) + np.asarray(indices, dtype=np.uint64) * GOLDEN)
