"""Dropout masks decided per GLOBAL row and made on the tensor's own device.

Why per global row: the mask of entry ``(row, f)`` must not depend on which
rank owns ``row``, so that P ranks train exactly like one process.
Why on the device: drawing masks on the host and copying them over cost
99% of a GPU epoch.

The rule (layer ``layer`` of epoch ``epoch``, a matrix of width ``width``):

* Global rows are cut into fixed chunks of ``R = max(1, L // width)`` rows,
  ``L`` lanes a chunk (2^22 on the CPU, 2^24 on CUDA, where fewer and
  larger launches pay); chunk ``c`` holds rows ``[c R, (c + 1) R)``,
  whatever P is.
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
  seed word, one ``random_`` over the whole chunk (a rank draws whole
  chunks: at most two partly wasted, which costs microseconds on a GPU).

So masks are identical for every P on one device type (on CUDA: on one GPU
model, since torch's launch shape for a 2^22-word draw can depend on the
number of multiprocessors); CPU and CUDA masks differ (same rule, different
generators).
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
from sparse_dist.receiver_dropout import zero_dropped_

LANES_PER_CHUNK = 1 << 22          # 16-bit lanes per chunk on the CPU (2^20 64-bit words)
DEVICE_LANES_PER_CHUNK = 1 << 24   # on CUDA (2^22 words: 32 MiB drawn per launch)
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


def rows_per_chunk(width: int, lanes_per_chunk: int) -> int:
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
              device: str | torch.device = "cpu", *, lanes_per_chunk: int | None = None,
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
    host_rule = device.type == "cpu" and generator == "auto"
    if lanes_per_chunk is None:
        lanes_per_chunk = LANES_PER_CHUNK if host_rule else DEVICE_LANES_PER_CHUNK
    rows = rows_per_chunk(width, lanes_per_chunk)
    spans = _chunk_spans(first_row, n_rows, width, rows)
    total = n_rows * width
    mask = torch.empty(total, dtype=torch.bool, device=device)
    if host_rule:
        _fill_on_host(mask.numpy(), spans, rows * width, total, seed, epoch, layer, rule)
    else:
        _fill_on_device(mask, spans, rows * width, total, seed, epoch, layer, rule)
    return mask.view(n_rows, width)


def keep_mask_rows(seed: int, epoch: int, layer: int, global_rows: np.ndarray, width: int, p: float,
                   device: str | torch.device = "cpu", *, lanes_per_chunk: int | None = None,
                   generator: str = "auto") -> torch.Tensor:
    """Boolean ``len(global_rows) x width`` mask of the given global rows (any order, repeats allowed).

    Row ``k`` of the result equals row ``global_rows[k] - first`` of :func:`keep_mask` over any range
    holding it: the rule is the same, only the rows differ. Used by receivers, which mask rows owned
    by other ranks (a static input's halo rows, received boundary rows) without asking their owners.
    """
    if generator not in ("auto", "device"):
        raise ValueError(f"generator must be 'auto' or 'device', got {generator!r}")
    rule = KeepRule.of(p)
    device = torch.device(device)
    rows = np.asarray(global_rows, dtype=np.int64).reshape(-1)
    if p == 0.0 or rows.size == 0 or width == 0:
        return torch.ones(rows.size, width, dtype=torch.bool, device=device)
    if rows.min() < 0:
        raise ValueError(f"global rows must be >= 0, got {int(rows.min())}")
    host_rule = device.type == "cpu" and generator == "auto"
    if lanes_per_chunk is None:
        lanes_per_chunk = LANES_PER_CHUNK if host_rule else DEVICE_LANES_PER_CHUNK
    per_chunk = rows_per_chunk(width, lanes_per_chunk)
    chunks = rows // per_chunk
    order = np.argsort(chunks, kind="stable")
    bounds = np.flatnonzero(np.diff(chunks[order])) + 1
    groups = np.split(order, bounds)
    mask = torch.empty(rows.size, width, dtype=torch.bool, device=device)
    if host_rule:
        bound = np.int16(rule.signed_bound) if rule.signed_bound < _LANE_SPAN // 2 else None
        out = mask.numpy()

        def fill(positions: np.ndarray) -> None:
            chunk = int(chunks[positions[0]])
            local = rows[positions] - chunk * per_chunk
            span = int(local.max()) + 1
            raw = np.random.SFC64(chunk_seed(seed, epoch, layer, chunk)).random_raw(-(-span * width // LANES_PER_WORD))
            lanes = raw.view(np.int16)[:span * width].reshape(span, width)
            if bound is None:
                out[positions] = True
                return
            # A leading run of consecutive rows landing in consecutive outputs (a rank's own rows before
            # its halo) is compared in place; only the rest is gathered.
            steps = (np.diff(local) == 1) & (np.diff(positions) == 1)
            run = local.size if steps.all() else int(np.argmin(steps)) + 1
            first, at = int(local[0]), int(positions[0])
            np.less(lanes[first:first + run], bound, out=out[at:at + run])
            if run < local.size:
                out[positions[run:]] = lanes[local[run:]] < bound

        if len(groups) == 1:
            fill(groups[0])
        else:
            for future in [_pool().submit(fill, positions) for positions in groups]:
                future.result()
        return mask
    chunk_words = -(-per_chunk * width // LANES_PER_WORD)
    words = torch.empty(chunk_words, dtype=torch.int64, device=device)
    lanes = words.view(torch.int16)[:per_chunk * width].view(per_chunk, width)
    torch_generator = torch.Generator(device=device)
    for positions in groups:
        chunk = int(chunks[positions[0]])
        state = chunk_seed(seed, epoch, layer, chunk).generate_state(1, dtype=np.uint64)[0]
        torch_generator.manual_seed(int(state))
        words.random_(-(1 << 63), None, generator=torch_generator)
        local = torch.from_numpy(rows[positions] - chunk * per_chunk).to(device)
        target = torch.from_numpy(positions).to(device)
        mask.index_copy_(0, target, lanes.index_select(0, local) < rule.signed_bound)
    return mask


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


class _Masked(torch.autograd.Function):
    """``h * mask``; keeps the boolean mask (1 byte an entry) for the backward only if ``h`` needs one."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: torch.Tensor, mask: torch.Tensor,  # type: ignore[override]
                timer: ComputeTimer | None) -> torch.Tensor:
        if ctx.needs_input_grad[0]:  # type: ignore[attr-defined]
            ctx.save_for_backward(mask)
        ctx.timer = timer  # type: ignore[attr-defined]
        return torch.mul(h, mask)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,  # type: ignore[override]
                 grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (mask,) = ctx.saved_tensors  # type: ignore[attr-defined]
        with _timed(ctx.timer, grad.device):  # type: ignore[attr-defined]
            return torch.mul(grad, mask), None, None


class _ReluMasked(torch.autograd.Function):
    """``relu(z) * mask`` in one node: the backward is ReLU's own, read from the masked output.

    ``d out / d z = [z > 0] mask = [out > 0]``, so nothing but the output is kept and the mask
    costs no backward pass at all.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, z: torch.Tensor, mask: torch.Tensor,  # type: ignore[override]
                timer: ComputeTimer | None) -> torch.Tensor:
        out = torch.relu(z)
        with _timed(timer, out.device):
            zero_dropped_(out, mask)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,  # type: ignore[override]
                 grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (out,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return torch.ops.aten.threshold_backward(grad, out, 0), None, None


def _timed(timer: ComputeTimer | None, device: torch.device,
           name: str = "dropout") -> contextlib.AbstractContextManager[None]:
    return timer.measure(name, device) if timer is not None else contextlib.nullcontext()


class GlobalRowDropout:
    """The dropout of one forward pass: masks of global rows ``first_row ...`` per layer.

    Inverted dropout multiplies kept entries by ``scale``; this class leaves that factor out of
    the masked tensors (``h * mask``) so the caller can fold it into the next linear map
    (``(h m) (scale W) = (h m scale) W``, exact for p = 0.5 where the scale is 2), which saves a
    full pass over the activations in the forward and in the backward. ``timer`` books making the
    masks under ``masks`` and applying them (forward and backward) under ``dropout``.
    """

    def __init__(self, p: float, seed: int, epoch: int, first_row: int, timer: ComputeTimer | None = None) -> None:
        self.rule = KeepRule.of(p)
        self.seed, self.epoch, self.first_row, self.timer = seed, epoch, first_row, timer

    @property
    def scale(self) -> float:
        return self.rule.scale

    def mask(self, layer: int, like: torch.Tensor, extra_rows: np.ndarray | None = None) -> torch.Tensor:
        """Boolean keep mask of layer ``layer``'s input, shaped and placed like ``like`` (booked as ``masks``).

        ``like`` holds this rank's rows, followed by the global rows ``extra_rows`` when given (a
        static input's halo rows, whose masks the receiver draws itself).
        """
        extra = 0 if extra_rows is None else len(extra_rows)
        with _timed(self.timer, like.device, "masks"):
            own = like.shape[0] - extra
            if not extra:
                return keep_mask(self.seed, self.epoch, layer, self.first_row, own, like.shape[1], self.rule.p,
                                 like.device)
            # One call: each chunk's stream is drawn once for the own rows and the extra rows together.
            rows = np.concatenate([np.arange(self.first_row, self.first_row + own, dtype=np.int64),
                                   np.asarray(extra_rows, dtype=np.int64)])
            return keep_mask_rows(self.seed, self.epoch, layer, rows, like.shape[1], self.rule.p, like.device)

    def rows_mask(self, layer: int, global_rows: np.ndarray | range, like: torch.Tensor) -> torch.Tensor:
        """Boolean keep mask of layer ``layer``'s input rows ``global_rows`` (any owner's), ``len x like.shape[1]``."""
        with _timed(self.timer, like.device, "masks"):
            if isinstance(global_rows, range):
                return keep_mask(self.seed, self.epoch, layer, global_rows.start, len(global_rows), like.shape[1],
                                 self.rule.p, like.device)
            return keep_mask_rows(self.seed, self.epoch, layer, global_rows, like.shape[1], self.rule.p, like.device)

    def drop(self, h: torch.Tensor, layer: int, extra_rows: np.ndarray | None = None) -> torch.Tensor:
        """``h * mask`` (unscaled) of layer ``layer``'s input (own rows, then ``extra_rows`` if given)."""
        mask = self.mask(layer, h, extra_rows)
        with _timed(self.timer, h.device):
            return _Masked.apply(h, mask, self.timer)

    def masks(self, layer: int) -> "LayerMasks":
        """Layer ``layer``'s masks for receiver-side dropout (handed to the SpMM in the exchange context)."""
        return LayerMasks(self, layer)

    def relu_drop(self, z: torch.Tensor, layer: int) -> torch.Tensor:
        """``relu(z) * mask`` (unscaled): ReLU of one layer fused with the dropout of the next's input."""
        return _ReluMasked.apply(z, self.mask(layer, z), self.timer)


class LayerMasks:
    """One layer's receiver-side dropout masks (:class:`sparse_dist.exchange.RowMasks`).

    The input travels pre-dropout; the SpMM masks this rank's rows (:meth:`own`, made once per
    forward and kept for the backward) and every row it received (:meth:`of_rows`), from the same
    global-row rule, so the product equals the owner-side one.
    """

    def __init__(self, dropout: GlobalRowDropout, layer: int) -> None:
        self.dropout, self.layer = dropout, layer
        self._own: torch.Tensor | None = None

    def own(self, like: torch.Tensor) -> torch.Tensor:
        if self._own is None or self._own.shape != like.shape or self._own.device != like.device:
            self._own = self.dropout.mask(self.layer, like)
        return self._own

    def of_rows(self, global_rows: np.ndarray | range, like: torch.Tensor) -> torch.Tensor:
        return self.dropout.rows_mask(self.layer, global_rows, like)
