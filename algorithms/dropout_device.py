"""The dropout rule's keep masks made on a torch device, with the host rule's bits (:mod:`algorithms.dropout`).

Lane ``g`` (``row * width + column``) of a layer is bits ``16 (g mod 4) ...`` of word ``g // 4`` of the layer's
SplitMix64 stream, word ``w = splitmix64(key + w * GOLDEN)``; it is kept when ``u ^ 0x8000 < T``. Two forms:

* on CUDA with CuPy importable, one elementwise kernel: a thread a lane, makes its word and decides (one pass
  over the mask, nothing else stored);
* anywhere else (CUDA without CuPy, or its kernel failing to build: said once in the log), torch's integer ops
  on the device (:func:`algorithms.hashing.splitmix64_torch_`): the words of the rows' lanes, then the lanes
  picked from them; about a dozen passes over the words, slower but the same bits.

No host round trip beyond the rows' ids. Pure (no communication).
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from algorithms.hashing import as_int64, splitmix64_torch_
from sparse_dist.splitmix import GOLDEN, MIX1, MIX2

__all__ = ["keep_range", "keep_rows", "keep_signed_lanes"]

_log = logging.getLogger(__name__)
_GOLDEN_INT64 = as_int64(int(GOLDEN))
_SIGNED_LANE = 1 << 15
_ALL_KEPT = 1 << 16

_KERNEL_SOURCE = """
unsigned long long g;
if (contiguous) {
    g = first + (unsigned long long)i;  /* the range's lanes follow one another: no division */
} else {
    unsigned long long k = (unsigned long long)i / width;
    g = (unsigned long long)rows[k] * width + ((unsigned long long)i - k * width);
}
unsigned long long z = key + ((g >> 2) + 1ULL) * GOLDEN_ULL;
z = (z ^ (z >> 30)) * MIX1_ULL;
z = (z ^ (z >> 27)) * MIX2_ULL;
z ^= z >> 31;
unsigned int lane = (unsigned int)((z >> (16 * (g & 3ULL))) & 0xFFFFULL);
keep = (lane ^ 0x8000U) < threshold ? 1 : 0;
""".replace("GOLDEN_ULL", f"{int(GOLDEN):#x}ULL").replace("MIX1_ULL", f"{int(MIX1):#x}ULL").replace(
    "MIX2_ULL", f"{int(MIX2):#x}ULL")  # splitmix64's constants from their one definition (sparse_dist.splitmix)

def keep_range(key: int, first_row: int, out: torch.Tensor, threshold: int, *, form: str = "auto") -> None:
    """Keep decisions of global rows ``first_row ...`` into ``out`` (boolean, ``n_rows x width``, contiguous)."""
    if out.numel() == 0:
        return
    if form == "auto" and _launched(key, first_row * out.shape[1], None, out, threshold):
        return
    n_rows, width = out.shape
    first_lane, end_lane = first_row * width, (first_row + n_rows) * width
    first_word = first_lane // 4
    words = torch.arange(first_word, (end_lane + 3) // 4, dtype=torch.int64, device=out.device)
    lanes = _words_(key, words).view(torch.int16)
    offset = first_lane - 4 * first_word
    keep_signed_lanes(lanes[offset:offset + n_rows * width], threshold, out.view(-1))


def keep_rows(key: int, rows: torch.Tensor, out: torch.Tensor, threshold: int, *, form: str = "auto") -> None:
    """Keep decisions of the global ``rows`` (``int64`` on ``out``'s device, any order) into ``out`` (boolean,
    ``len(rows) x width``, contiguous)."""
    if out.numel() == 0:
        return
    if form == "auto" and _launched(key, 0, rows, out, threshold):
        return
    width = out.shape[1]
    first_lane = rows * width
    span = (width + 3) // 4 + 1  # words a row's lanes can touch
    words = (first_lane // 4).unsqueeze(1) + torch.arange(span, dtype=torch.int64, device=out.device)
    lanes = _words_(key, words).view(torch.int16)  # rows x 4 span
    picks = (first_lane % 4).unsqueeze(1) + torch.arange(width, dtype=torch.int64, device=out.device)
    keep_signed_lanes(lanes.gather(1, picks), threshold, out)


def keep_signed_lanes(lanes: torch.Tensor, threshold: int, out: torch.Tensor) -> None:
    """``out = (lane read unsigned) ^ 0x8000 < threshold`` for ``int16`` lanes (the signed reading of the same bits:
    ``lane < threshold - 2^15``), on their device; ``threshold`` 2^16 keeps every lane, a bound no ``int16``
    comparison holds. The one comparison of the torch forms of every lane rule (dropout, attention dropout)."""
    if threshold >= _ALL_KEPT:
        out.fill_(True)
        return
    torch.lt(lanes, threshold - _SIGNED_LANE, out=out)


def _words_(key: int, words: torch.Tensor) -> torch.Tensor:
    """Word ids -> the stream's words, in place (int64 holding the uint64 bits)."""
    words.mul_(_GOLDEN_INT64).add_(as_int64(key))
    return splitmix64_torch_(words)


def _launched(key: int, first_lane: int, rows: torch.Tensor | None, out: torch.Tensor, threshold: int) -> bool:
    """Whether CuPy's kernel made ``out`` (False: not CUDA, or CuPy unavailable or failing, said once in the log;
    the caller then uses torch's form)."""
    kernel = _cupy_kernel(out.device)
    if kernel is None:
        return False
    try:
        _launch(kernel, key, first_lane, rows, out, threshold)
    except Exception:  # a runtime that built the kernel but cannot run it here: torch's form, the same bits
        _failed.add(out.device.index)
        _log.warning("dropout masks on CUDA use torch's integer ops (CuPy's kernel failed)", exc_info=True)
        return False
    return True


def _launch(kernel: Any, key: int, first_lane: int, rows: torch.Tensor | None, out: torch.Tensor,
            threshold: int) -> None:
    """The CuPy kernel over ``out`` on torch's current stream of its device: lanes ``first_lane ...`` where ``rows``
    is None, else the lanes of ``rows``."""
    import cupy

    ids = cupy.asarray(rows) if rows is not None else cupy.zeros(1, dtype=cupy.int64)
    with cupy.cuda.Device(out.device.index), cupy.cuda.ExternalStream(torch.cuda.current_stream(out.device).cuda_stream):
        kernel(ids, np.int64(first_lane), np.uint64(out.shape[1]), np.bool_(rows is None), np.uint64(key),
               np.uint32(threshold), cupy.asarray(out.view(torch.uint8)))


_failed: set[int] = set()


def _cupy_kernel(device: torch.device) -> Any | None:
    """The compiled elementwise kernel for a CUDA ``device``, or None (not CUDA, CuPy missing or failing)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index in _failed:
        return None
    try:
        return _build(index)
    except Exception:  # CuPy missing, or its compiler unusable here: torch's ops give the same bits
        _failed.add(index)
        _log.warning("dropout masks on CUDA use torch's integer ops (CuPy's kernel is unavailable)", exc_info=True)
        return None


@lru_cache(maxsize=None)
def _build(index: int) -> Any:
    import cupy

    with cupy.cuda.Device(index):
        kernel = cupy.ElementwiseKernel(
            "raw int64 rows, int64 first, uint64 width, bool contiguous, uint64 key, uint32 threshold",
            "uint8 keep", _KERNEL_SOURCE, "sparse_dist_dropout_keep")
        probe = cupy.zeros(8, dtype=cupy.uint8)
        kernel(cupy.zeros(1, dtype=cupy.int64), np.int64(0), np.uint64(4), np.bool_(True), np.uint64(0),
               np.uint32(1), probe)  # compiles now, so that a failure falls back here
        cupy.cuda.Device(index).synchronize()
    return kernel
