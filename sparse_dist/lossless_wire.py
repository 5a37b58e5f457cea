"""Static rows sent in the narrowest dtype that holds them bit for bit (layer 0's halo of ``X``).

Many graphs' features are counts or flags (bag-of-words: Cora, CiteSeer, the planted synthetic graphs) or were
stored in half precision; their float32 rows then carry 2 or 3 bytes of nothing per value. Where every rank's
rows survive a round trip through a narrower dtype *bitwise*, the rows travel in it and are widened on arrival,
so the receiver holds exactly the values the owner has: nothing about training changes, only the bytes (on the
planted 200k synthetic graph, whose features are small counts, ``uint8``: a quarter of float32's).

The candidates, narrowest first (:data:`CANDIDATES`): ``uint8``, ``int8``, then ``int16``, ``float16``,
``bfloat16``; the first that holds every rank's rows wins, else the rows' own dtype. The test is the round trip
itself (cast down, cast back, compare the bits): NaN fails every candidate (its payload bits need not survive),
infinities and ``-0.0`` fail the integer ones and pass the half-precision ones, out-of-range or fractional values
fail the integers. Half-precision dtypes travel as their 16-bit patterns (MPI has no half type).

Which rows: the *loaded* features, before ``--feature-norm`` scales them, since a scaled row (each value divided
by the row's sum) is rarely narrow; the receiver scales the rows it receives with the same function, row by row,
which gives the owner's values bitwise (tested). :func:`agree_wire_dtype` is collective over the communicator it
is given, so every rank prices and sends alike. Its local test reads every row once per candidate still in the
running: 0.16 s for a rank's 97,082 x 128 count features, 0.09 s for as many random floats (which fail in the
first chunk), on one core of the 2-core machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from sparse_dist.comm import Communicator

CANDIDATES: tuple[torch.dtype, ...] = (torch.uint8, torch.int8, torch.int16, torch.float16, torch.bfloat16)
"""Narrow dtypes tried, narrowest first (ties in width: integers before floats)."""
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_CHUNK_ROWS = 1 << 16
"""Rows tested at a time: the round trip's copies stay a few MB whatever the graph."""


@dataclass(frozen=True)
class WireRows:
    """A rank's own rows as they travel (``sent``: ``n_own x F`` in a narrow dtype, on the product's device) and
    the way back (``decode``: received rows in that dtype -> the rows the product uses, its dtype and device)."""

    sent: torch.Tensor
    decode: Callable[[torch.Tensor], torch.Tensor]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    bits = _BITS[a.element_size()]
    return torch.equal(a.view(bits), b.view(bits))


def narrow_mask(rows: np.ndarray) -> int:
    """Bit ``k`` set where every value of ``rows`` (``n x F``, floating, any ``n`` including 0) survives a round
    trip through ``CANDIDATES[k]`` bitwise. Local; reads the rows in chunks."""
    if not np.issubdtype(rows.dtype, np.floating):
        return 0
    mask = (1 << len(CANDIDATES)) - 1
    flat = rows.reshape(rows.shape[0], int(np.prod(rows.shape[1:]))) if rows.ndim > 1 else rows.reshape(-1, 1)
    for start in range(0, flat.shape[0], _CHUNK_ROWS):
        chunk = torch.from_numpy(np.ascontiguousarray(flat[start:start + _CHUNK_ROWS]))
        for index, dtype in enumerate(CANDIDATES):
            if mask >> index & 1 and not _same_bits(chunk.to(dtype).to(chunk.dtype), chunk):
                mask &= ~(1 << index)
        if not mask:
            break
    return mask


def choose_wire_dtype(mask: int, itemsize: int) -> torch.dtype | None:
    """The first candidate in ``mask`` narrower than ``itemsize`` bytes, or None (send the rows as they are)."""
    for index, dtype in enumerate(CANDIDATES):
        if mask >> index & 1 and dtype.itemsize < itemsize:
            return dtype
    return None


def agree_wire_dtype(comm: Communicator, rows: np.ndarray) -> torch.dtype | None:
    """The narrow dtype that holds every rank's ``rows`` bitwise, or None. Collective over ``comm`` (one
    allgather of one int64, phase ``other``); every rank returns the same."""
    masks = comm.allgather_array(np.array([narrow_mask(rows)], dtype=np.int64))
    agreed = int(np.bitwise_and.reduce(masks.reshape(-1))) if masks.size else 0
    return choose_wire_dtype(agreed, rows.dtype.itemsize)


def to_wire(rows: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``rows`` cast to ``dtype`` (which holds them bitwise, :func:`agree_wire_dtype`), in a dtype MPI can send:
    half precision as its 16-bit patterns."""
    narrow = torch.from_numpy(np.ascontiguousarray(rows)).to(dtype)
    return narrow.view(torch.int16) if dtype.is_floating_point else narrow


def from_wire(received: torch.Tensor, dtype: torch.dtype, original: np.dtype) -> np.ndarray:
    """Rows received from :func:`to_wire` with ``dtype``, widened back to the loaded rows' dtype ``original``:
    the owner's values bitwise."""
    narrow = received.cpu()
    if dtype.is_floating_point:
        narrow = narrow.view(dtype)
    return narrow.to(torch.from_numpy(np.zeros(0, dtype=original)).dtype).numpy()
