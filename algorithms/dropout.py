"""Dropout masks decided per GLOBAL row and made on the tensor's own device.

Why per global row: the mask of entry ``(row, f)`` must not depend on which
rank owns ``row``, so that P ranks train exactly like one process.
Why on the device: drawing masks on the host and copying them over cost
99% of a GPU epoch.

The rule (layer ``layer`` of epoch ``epoch``, a matrix of width ``width``):

* Global rows are cut into fixed chunks of ``R = max(1, LANES_PER_CHUNK //
  width)`` rows; chunk ``c`` holds rows ``[c R, (c + 1) R)``, whatever P is.
* Each chunk has its own random stream of 64-bit words, seeded from
  ``SeedSequence((seed, epoch, layer, c))``. Each word gives four 16-bit
  lanes (little-endian memory order, read as signed ``int16`` ``s``); entry
  ``(row, f)`` takes lane ``(row - c R) * width + f`` of its chunk.
* The entry is kept when ``s + 32768 < T`` with ``T = round((1 - p) 2^16)``
  (at least 1), and a kept value is scaled by ``2^16 / T``, so the expected
  value is exactly the input. The keep probability is ``1 - p`` rounded to
  a multiple of ``2^-16`` (exact for p = 0.5; 0.6 keeps 0.399994).

A rank owning rows ``[first, first + n)`` draws only the chunks those rows
touch. The stream's generator depends on the device type:

* CPU: NumPy's ``SFC64`` bit generator, chunks drawn in parallel threads
  (NumPy releases the GIL), each only up to the last word the rank needs.
* CUDA: torch's CUDA Philox generator, ``manual_seed`` with the chunk's
  seed word, one ``random_`` over the whole chunk (at most 2^20 words,
  below the size where torch's launch shape depends on the GPU model).

So masks are identical for every P on one device type; CPU and CUDA masks
differ (same rule, different generators).
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from sparse_dist.accounting import ComputeTimer

LANES_PER_CHUNK = 1 << 22   # 16-bit lanes per chunk (2^20 64-bit words)
LANES_PER_WORD = 4
_LANE_SPAN = 1 << 16


@dataclass(frozen=True)
class KeepRule:
    """Threshold and scale of one dropout probability ``p`` (see the module docstring)."""

    p: float
    threshold: int   # T: kept when the unsigned lane value is below T
    scale: float     # 2^16 / T: kept values are multiplied by this

    @classmethod
    def of(cls, p: float) -> "KeepRule":
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must lie in [0, 1), got {p}")
        threshold = min(_LANE_SPAN, max(1, round((1.0 - p) * _LANE_SPAN)))
        return cls(p, threshold, _LANE_SPAN / threshold)

    @property
    def signed_bound(self) -> int:
        """Kept when the lane read as ``int16`` is below this (``T - 2^15``)."""
        return self.threshold - _LANE_SPAN // 2


def chunk_seed(seed: int, epoch: int, layer: int, chunk: int) -> np.random.SeedSequence:
    """The seed sequence of one chunk's stream (non-negative integers)."""
    if min(seed, epoch, layer, chunk) < 0:
        raise ValueError(f"dropout seed, epoch, layer and chunk must be >= 0, got {(seed, epoch, layer, chunk)}")
    return np.random.SeedSequence((seed, epoch, layer, chunk))


def rows_per_chunk(width: int, lanes_per_chunk: int = LANES_PER_CHUNK) -> int:
    return max(1, lanes_per_chunk // max(width, 1))


@lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1)), thread_name_prefix="dropout-mask")


def _chunk_spans(first_row: int, n_rows: int, width: int, rows: int) -> list[tuple[int, int, int]]:
    """``(chunk, first lane in the chunk, first lane in the output)`` of each chunk rows ``first_row...`` touch."""
    spans = []
    row = first_row
    end = first_row + n_rows
    while row < end:
        chunk = row // rows
        stop = min(end, (chunk + 1) * rows)
        spans.append((chunk, (row - chunk * rows) * width, (row - first_row) * width))
        row = stop
    return spans


def keep_mask(seed: int, epoch: int, layer: int, first_row: int, n_rows: int, width: int, p: float,
              device: str | torch.device = "cpu", *, lanes_per_chunk: int = LANES_PER_CHUNK,
              generator: str = "auto") -> torch.Tensor:
    """Boolean ``n_rows x width`` mask of kept entries of global rows ``first_row ...``, made on ``device``.

    ``generator``: ``auto`` uses the host rule on CPU and the device rule elsewhere; ``device`` forces
    torch's generator of ``device`` (how tests run the CUDA rule's chunk logic on a CPU).
    """
    if generator not in ("auto", "device"):
        raise ValueError(f"generator must be 'auto' or 'device', got {generator!r}")
    rule = KeepRule.of(p)
    device = torch.device(device)
    if p == 0.0 or n_rows == 0 or width == 0:
        return torch.ones(n_rows, width, dtype=torch.bool, device=device)
    rows = rows_per_chunk(width, lanes_per_chunk)
    spans = _chunk_spans(first_row, n_rows, width, rows)
    total = n_rows * width
    mask = torch.empty(total, dtype=torch.bool, device=device)
    if device.type == "cpu" and generator == "auto":
        _fill_on_host(mask.numpy(), spans, rows * width, total, seed, epoch, layer, rule)
    else:
        _fill_on_device(mask, spans, rows * width, total, seed, epoch, layer, rule)
    return mask.view(n_rows, width)


def _span_lengths(spans: list[tuple[int, int, int]], chunk_lanes: int, total: int) -> list[int]:
    """Lanes each span contributes to the output."""
    return [min(chunk_lanes - start, total - out_start) for _, start, out_start in spans]


def _fill_on_host(out: np.ndarray, spans: list[tuple[int, int, int]], chunk_lanes: int, total: int,
                  seed: int, epoch: int, layer: int, rule: KeepRule) -> None:
    """CPU rule: SFC64 per chunk, drawn up to the last word needed; chunks in parallel threads."""
    bound = np.int16(rule.signed_bound) if rule.signed_bound < _LANE_SPAN // 2 else None

    def fill(span: tuple[int, int, int], length: int) -> None:
        chunk, start, out_start = span
        words = -(-(start + length) // LANES_PER_WORD)
        raw = np.random.SFC64(chunk_seed(seed, epoch, layer, chunk)).random_raw(words)
        lanes = raw.view(np.int16)[start:start + length]
        target = out[out_start:out_start + length]
        if bound is None:  # T = 2^16: keep everything
            target[:] = True
        else:
            np.less(lanes, bound, out=target)

    lengths = _span_lengths(spans, chunk_lanes, total)
    if len(spans) == 1:
        fill(spans[0], lengths[0])
        return
    for future in [_pool().submit(fill, span, length) for span, length in zip(spans, lengths)]:
        future.result()


def _fill_on_device(out: torch.Tensor, spans: list[tuple[int, int, int]], chunk_lanes: int, total: int,
                    seed: int, epoch: int, layer: int, rule: KeepRule) -> None:
    """Device rule: torch's generator of that device per chunk, whole chunks, compared on the device."""
    generator = torch.Generator(device=out.device)
    chunk_words = -(-chunk_lanes // LANES_PER_WORD)
    words = torch.empty(chunk_words, dtype=torch.int64, device=out.device)
    lanes = words.view(torch.int16)
    for span, length in zip(spans, _span_lengths(spans, chunk_lanes, total)):
        chunk, start, out_start = span
        state = chunk_seed(seed, epoch, layer, chunk).generate_state(1, dtype=np.uint64)[0]
        generator.manual_seed(int(state))
        words.random_(-(1 << 63), None, generator=generator)  # from INT64_MIN to None: the full 64-bit range
        torch.lt(lanes[start:start + length], rule.signed_bound, out=out[out_start:out_start + length])


class _MaskedScale(torch.autograd.Function):
    """``h * mask * scale`` that keeps only the boolean mask (1 byte an entry) for its backward."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: torch.Tensor, mask: torch.Tensor,  # type: ignore[override]
                scale: float, timer: ComputeTimer | None) -> torch.Tensor:
        ctx.save_for_backward(mask)
        ctx.scale, ctx.timer = scale, timer  # type: ignore[attr-defined]
        return torch.mul(h, mask).mul_(scale)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,  # type: ignore[override]
                 grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (mask,) = ctx.saved_tensors  # type: ignore[attr-defined]
        with _timed(ctx.timer, grad.device):  # type: ignore[attr-defined]
            return torch.mul(grad, mask).mul_(ctx.scale), None, None, None  # type: ignore[attr-defined]


def _timed(timer: ComputeTimer | None, device: torch.device) -> contextlib.AbstractContextManager[None]:
    return timer.measure("dropout", device) if timer is not None else contextlib.nullcontext()


def apply_dropout(h: torch.Tensor, seed: int, epoch: int, layer: int, first_row: int, p: float,
                  timer: ComputeTimer | None = None) -> torch.Tensor:
    """Inverted dropout of ``h`` (rows ``first_row ...`` of a global matrix) with the global-row mask.

    The mask is made on ``h.device``; autograd keeps it as booleans. With a ``timer``, the mask, its
    application and its backward are booked under ``dropout``.
    """
    if p == 0.0:
        return h
    with _timed(timer, h.device):
        mask = keep_mask(seed, epoch, layer, first_row, h.shape[0], h.shape[1], p, h.device)
        return _MaskedScale.apply(h, mask, KeepRule.of(p).scale, timer)
