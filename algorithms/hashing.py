"""Counter-based hashes that every rank evaluates alike: the random decisions of the sampling policies
and of attention dropout.

A decision about one global row (or column) in one epoch is a pure function of (seed, epoch, stream,
id), so an owner and a receiver reach the same decision without talking, and it does not depend on
``P`` where the stream does not. One splitmix64 for the project, in two forms with the same bits:
:func:`splitmix64` on NumPy ``uint64`` (host) and :func:`splitmix64_torch` on ``int64`` tensors (on
their device; torch has no ``uint64`` arithmetic, so the words are held as the ``int64`` with the
same bits, see :func:`as_int64`).
"""

from __future__ import annotations

import numpy as np
import torch

from sparse_dist.splitmix import GOLDEN, MIX1, MIX2, splitmix64, unit_floats


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
    return unit_floats(row_hash(seed, epoch, stream, ids, salt))


def as_int64(value: int) -> int:
    """A uint64 value as the int64 with the same bits (how torch holds a 64-bit word)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN_INT64 = as_int64(int(GOLDEN))
_MIX_SHIFTS_INT64 = ((30, as_int64(int(MIX1))), (27, as_int64(int(MIX2))), (31, None))


def splitmix64_torch_(z: torch.Tensor) -> torch.Tensor:
    """:func:`splitmix64` of int64 ``z`` in place, on its device (wrapping arithmetic; logical shifts made
    from torch's arithmetic ones)."""
    z.add_(_GOLDEN_INT64)
    shifted = torch.empty_like(z)
    for bits, factor in _MIX_SHIFTS_INT64:
        torch.bitwise_right_shift(z, bits, out=shifted)
        z.bitwise_xor_(shifted.bitwise_and_((1 << (64 - bits)) - 1))
        if factor is not None:
            z.mul_(factor)
    return z


def splitmix64_torch(z: torch.Tensor) -> torch.Tensor:
    """:func:`splitmix64` of an int64 tensor (the same bits as the uint64 words), on its device."""
    return splitmix64_torch_(z.clone())


def chained_key(*words: int) -> int:
    """The key of one random stream, as int64: ``k = words[0]``, then ``k = sm(sm(k) ^ word)`` for each next
    word (``sm``: :func:`splitmix64`)."""
    key = np.array([words[0]], dtype=np.uint64)
    for word in words[1:]:
        key = splitmix64(splitmix64(key) ^ np.array([word], dtype=np.uint64))
    return as_int64(int(key[0]))
