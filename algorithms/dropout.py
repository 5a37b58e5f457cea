"""Dropout masks drawn per GLOBAL row, so training does not depend on the number of ranks.

Entry ``(row, f)`` of the mask of layer ``layer`` in epoch ``epoch`` is decided
by the 64-bit word number ``row * width + f`` of the counter-based Philox4x64
stream with key ``(seed, epoch * 2**16 + layer)``: kept when
``(word >> 11) * 2**-53 < 1 - p``. A rank owning rows ``[first, first + n)``
generates only its own words (Philox jumps to any position in O(1)).
"""

from __future__ import annotations

import math

import numpy as np
import torch

_LAYER_BITS = 16


def keep_mask(seed: int, epoch: int, layer: int, first_row: int, n_rows: int, width: int, p: float) -> torch.Tensor:
    """Boolean ``n_rows x width`` mask of kept entries for rows ``first_row ...``."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must lie in [0, 1), got {p}")
    if layer >= 1 << _LAYER_BITS:
        raise ValueError(f"layer index {layer} too large")
    if p == 0.0:
        return torch.ones(n_rows, width, dtype=torch.bool)
    start = first_row * width
    counter, skip = divmod(start, 4)
    key = np.array([seed, (epoch << _LAYER_BITS) | layer], dtype=np.uint64)
    generator = np.random.Philox(key=key, counter=np.array([counter, 0, 0, 0], dtype=np.uint64))
    words = generator.random_raw(skip + n_rows * width)[skip:]
    # (word >> 11) * 2**-53 < q  <=>  (word >> 11) < ceil(q * 2**53)  <=>  word < ceil(q * 2**53) << 11
    # (q < 1, so the bound fits in 64 bits): the same rule as one integer comparison.
    threshold = np.uint64(math.ceil((1.0 - p) * 2.0**53) << 11)
    return torch.from_numpy((words < threshold).reshape(n_rows, width))


def apply_dropout(h: torch.Tensor, seed: int, epoch: int, layer: int, first_row: int, p: float) -> torch.Tensor:
    """Inverted dropout of ``h`` (rows ``first_row ...``) with the global-row mask."""
    if p == 0.0:
        return h
    mask = keep_mask(seed, epoch, layer, first_row, h.shape[0], h.shape[1], p).to(h.device)
    return h * mask.to(h.dtype) / (1.0 - p)
