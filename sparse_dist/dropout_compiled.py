"""The numba kernels of :mod:`sparse_dist.dropout_kernel`: draw a chunk's SFC64 words and apply their keep
decisions in one pass (imported by its compiling thread only: a run that asks for no large pass never loads numba).

The words are NumPy's ``SFC64`` (Chris Doty-Humphrey's Small Fast Chaotic generator, 64-bit): from the
state ``(a, b, c, counter)`` that ``numpy.random.SFC64(seed_sequence).state`` reports, one step returns
``a + b + counter`` and moves to ``(b ^ (b >> 11), c + (c << 3), rotl(c, 24) + a + b + counter,
counter + 1)``, exactly as NumPy's C code (tested word for word against ``random_raw``). A lane is 16
bits of a word, in little-endian order, unsigned ``u``; it keeps its entry when ``u ^ 0x8000 < T``, which
is ``int16(u) + 2^15 < T``, the rule of :mod:`algorithms.dropout`. Words are drawn in blocks of
:data:`BLOCK_WORDS` into a small buffer (it stays in the first-level cache), and each entry is read once
and written once; what is done to it is one of :mod:`sparse_dist.dropout_modes`.

Drawing is serial within a stream (about 1.5 ns a word on one core of the shared 2-core machine, 0.4 ns
an entry) and bounds a pass; ``nogil`` lets the caller's threads run chunks side by side. ``cache=True``. Pure.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from sparse_dist.dropout_modes import FILL, KEEP, MULTIPLY, RELU_FILL

__all__ = ["BLOCK_WORDS", "apply_mask", "apply_runs"]

BLOCK_WORDS = 256  # words drawn ahead of applying them: 1024 lanes, 2 KiB of buffer

_U11, _U3, _U24, _U40, _ONE = np.uint64(11), np.uint64(3), np.uint64(24), np.uint64(40), np.uint64(1)
_SIGN = np.uint16(0x8000)


@njit(cache=True, nogil=True, inline="always")
def _draw(state, words, count):  # pragma: no cover - compiled
    """The next ``count`` words of the stream into ``words[:count]``; ``state`` (``uint64[4]``) moves on."""
    a, b, c, n = state[0], state[1], state[2], state[3]
    for k in range(count):
        tmp = a + b + n
        n += _ONE
        a = b ^ (b >> _U11)
        b = c + (c << _U3)
        c = ((c << _U24) | (c >> _U40)) + tmp
        words[k] = tmp
    state[0], state[1], state[2], state[3] = a, b, c, n


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
def apply_runs(state, lane, pos, length, src, dst, threshold, mode):  # pragma: no cover - compiled
    """``dst[pos[k] + i] = op(src[pos[k] + i], keep of lane lane[k] + i)`` for each run ``k`` and ``i < length[k]``.

    One chunk's stream: ``state`` its ``uint64[4]`` state ``(a, b, c, counter)`` before its first word (not
    changed). Runs are best given in increasing ``lane`` (one walk down the stream; a run that starts
    before the words in hand draws the stream again from its start). Words between runs are drawn and
    thrown away. ``src``, ``dst``: flat arrays (may be one array; for :data:`KEEP`, ``dst`` is a
    ``uint8`` view of a boolean array and ``src`` is ignored); ``threshold``: ``T`` of the rule.
    """
    at = state.copy()
    words = np.empty(BLOCK_WORDS, np.uint64)
    lanes = words.view(np.uint16)
    first, held, drawn = 0, 0, 0  # the buffer holds words [first, first + held); the stream is at word drawn
    for k in range(lane.size):
        cur, at_out, left = lane[k], pos[k], length[k]
        while left > 0:
            word = cur // 4
            if word < first or word >= first + held:
                if word < drawn:  # behind the stream: start it again
                    at[:] = state
                    drawn = 0
                while drawn < word:  # words before the run: drawn into the buffer and thrown away
                    skipped = min(BLOCK_WORDS, word - drawn)
                    _draw(at, words, skipped)
                    drawn += skipped
                held = min(BLOCK_WORDS, (cur % 4 + left + 3) // 4)
                _draw(at, words, held)
                first, drawn = word, word + held
            off = cur - first * 4
            count = min(held * 4 - off, left)
            _apply_lanes(lanes[off:off + count], src[at_out:at_out + count], dst[at_out:at_out + count],
                         threshold, mode)
            cur += count
            at_out += count
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
