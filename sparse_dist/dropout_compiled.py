"""The numba kernels of :mod:`sparse_dist.dropout_kernel`: make a layer's SplitMix64 words and apply their keep
decisions in one pass (imported by its compiling thread only: a run that asks for no large pass never loads numba).

Word ``w`` of a layer's stream is ``splitmix64(key + w * GOLDEN)`` (:func:`sparse_dist.splitmix.stream_words`:
counter-based, so any lane range is made on its own, by any thread). A lane is 16 bits of a word, in
little-endian order, unsigned ``u``; it keeps its entry when ``u ^ 0x8000 < T``, the rule of
:mod:`algorithms.dropout`. Words are made in blocks of :data:`BLOCK_WORDS` into a small buffer (it stays in the
first-level cache), and each entry is read once and written once; what is done to it is one of
:mod:`sparse_dist.dropout_modes`. ``nogil`` lets the caller's threads run pieces of one pass side by side.
``cache=True``. Pure.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sparse_dist.dropout_modes import FILL, KEEP, MULTIPLY, RELU_FILL
from sparse_dist.splitmix import GOLDEN, MIX1, MIX2

__all__ = ["BLOCK_WORDS", "apply_mask", "apply_runs"]

BLOCK_WORDS = 256  # words made ahead of applying them: 1024 lanes, 2 KiB of buffer

_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)
_SIGN = np.uint16(0x8000)


@njit(cache=True, nogil=True, inline="always")
def _make_words(key, first, words, count):  # pragma: no cover - compiled
    """Words ``first ... first + count - 1`` of the stream of ``key`` into ``words[:count]`` (all ``uint64``)."""
    z = key + first * GOLDEN
    for k in range(count):
        z += GOLDEN
        m = (z ^ (z >> _U30)) * MIX1
        m = (m ^ (m >> _U27)) * MIX2
        words[k] = m ^ (m >> _U31)


@njit(cache=True, nogil=True)
def _apply_lanes(lanes, src, dst, threshold, mode):  # pragma: no cover - compiled
    """``dst[i] = op(src[i], keep of lanes[i])``: one block, loops the compiler can vectorise."""
    zero = src.dtype.type(0)
    one = src.dtype.type(1)
    if mode == MULTIPLY:
        for i in range(dst.size):
            dst[i] = src[i] * (one if (lanes[i] ^ _SIGN) < threshold else zero)
    elif mode == FILL:
        for i in range(dst.size):
            v = src[i]  # loaded whatever the lane says: a select, not a branch that mispredicts half the time
            dst[i] = v if (lanes[i] ^ _SIGN) < threshold else zero
    elif mode == RELU_FILL:
        for i in range(dst.size):
            v = src[i]
            dst[i] = (zero if v < zero else v) if (lanes[i] ^ _SIGN) < threshold else zero
    elif mode == KEEP:
        for i in range(dst.size):
            dst[i] = (lanes[i] ^ _SIGN) < threshold


@njit(cache=True, nogil=True)
def apply_runs(key, lane, pos, length, src, dst, threshold, mode):  # pragma: no cover - compiled
    """``dst[pos[k] + i] = op(src[pos[k] + i], keep of lane lane[k] + i)`` for each run ``k`` and ``i < length[k]``.

    ``key``: the layer's stream key (``uint64``); ``lane``: global lanes (``row * width + column``), any order;
    ``src``, ``dst``: flat arrays (may be one array; for :data:`KEEP`, ``dst`` is a ``uint8`` view of a boolean
    array and ``src`` is ignored); ``threshold``: ``T`` of the rule.
    """
    words = np.empty(BLOCK_WORDS, np.uint64)
    lanes = words.view(np.uint16)
    for k in range(lane.size):
        cur, at, left = lane[k], pos[k], length[k]
        while left > 0:
            first = cur // 4
            off = cur - first * 4
            held = min(BLOCK_WORDS, (off + left + 3) // 4)
            _make_words(key, np.uint64(first), words, held)
            count = min(held * 4 - off, left)
            _apply_lanes(lanes[off:off + count], src[at:at + count], dst[at:at + count], threshold, mode)
            cur += count
            at += count
            left -= count


@njit(cache=True, nogil=True)
def apply_mask(src, mask, dst, mode):  # pragma: no cover - compiled
    """``dst[i] = op(src[i], mask[i])`` for a boolean ``mask``, flat arrays of one size (``dst`` may be ``src``)."""
    zero = src.dtype.type(0)
    one = src.dtype.type(1)
    if mode == MULTIPLY:
        for i in range(dst.size):
            dst[i] = src[i] * (one if mask[i] else zero)
    elif mode == FILL:
        for i in range(dst.size):
            v = src[i]
            dst[i] = v if mask[i] else zero
    else:
        for i in range(dst.size):
            v = src[i]
            dst[i] = (zero if v < zero else v) if mask[i] else zero
