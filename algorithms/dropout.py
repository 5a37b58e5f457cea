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

* CPU: NumPy's ``SFC64`` bit generator, each chunk drawn only up to the last
  word the rank needs. Applying dropout draws the words and applies them in
  one compiled pass (:mod:`sparse_dist.dropout_kernel`: no mask is stored, and
  a backward that needs the mask draws it again), chunks spread over torch's
  threads; for matrices under one chunk, and until the kernels are ready
  (compiled in the background: seconds the first time on a machine, then
  loaded from numba's cache), NumPy draws the masks and torch applies them,
  with the same values.
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
from dataclasses import dataclass

import numpy as np
import torch

from sparse_dist import dropout_kernel as kernel
from sparse_dist.accounting import ComputeTimer
from sparse_dist.receiver_dropout import COMPILED_DTYPES, zero_dropped_

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
    rule, device, host_rule, lanes_per_chunk = _resolve(p, device, generator, lanes_per_chunk)
    if p == 0.0 or n_rows == 0 or width == 0:
        return torch.ones(n_rows, width, dtype=torch.bool, device=device)
    mask = torch.empty(n_rows, width, dtype=torch.bool, device=device)
    if host_rule:
        _keep_on_host(mask, host_runs(seed, epoch, layer, width, first_row, n_rows, None, lanes_per_chunk), rule)
        return mask
    rows = rows_per_chunk(width, lanes_per_chunk)
    spans = _chunk_spans(first_row, n_rows, width, rows)
    _fill_on_device(mask.view(-1), spans, rows * width, n_rows * width, seed, epoch, layer, rule)
    return mask


def keep_mask_rows(seed: int, epoch: int, layer: int, global_rows: np.ndarray, width: int, p: float,
                   device: str | torch.device = "cpu", *, lanes_per_chunk: int | None = None,
                   generator: str = "auto") -> torch.Tensor:
    """Boolean ``len(global_rows) x width`` mask of the given global rows (any order, repeats allowed).

    Row ``k`` of the result equals row ``global_rows[k] - first`` of :func:`keep_mask` over any range
    holding it: the rule is the same, only the rows differ. Used by receivers, which mask rows owned
    by other ranks (a static input's halo rows, received boundary rows) without asking their owners.
    """
    rule, device, host_rule, lanes_per_chunk = _resolve(p, device, generator, lanes_per_chunk)
    rows = np.asarray(global_rows, dtype=np.int64).reshape(-1)
    if p == 0.0 or rows.size == 0 or width == 0:
        return torch.ones(rows.size, width, dtype=torch.bool, device=device)
    if rows.min() < 0:
        raise ValueError(f"global rows must be >= 0, got {int(rows.min())}")
    mask = torch.empty(rows.size, width, dtype=torch.bool, device=device)
    if host_rule:
        _keep_on_host(mask, host_runs(seed, epoch, layer, width, 0, 0, rows, lanes_per_chunk), rule)
        return mask
    per_chunk = rows_per_chunk(width, lanes_per_chunk)
    chunks = rows // per_chunk
    order = np.argsort(chunks, kind="stable")
    groups = np.split(order, np.flatnonzero(np.diff(chunks[order])) + 1)
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


def _resolve(p: float, device: str | torch.device, generator: str,
             lanes_per_chunk: int | None) -> tuple[KeepRule, torch.device, bool, int]:
    """The rule of ``p``, the device, whether the host rule applies, and the lanes a chunk."""
    if generator not in ("auto", "device"):
        raise ValueError(f"generator must be 'auto' or 'device', got {generator!r}")
    rule = KeepRule.of(p)
    device = torch.device(device)
    host_rule = device.type == "cpu" and generator == "auto"
    if lanes_per_chunk is None:
        lanes_per_chunk = LANES_PER_CHUNK if host_rule else DEVICE_LANES_PER_CHUNK
    return rule, device, host_rule, lanes_per_chunk


def host_runs(seed: int, epoch: int, layer: int, width: int, first_row: int, n_rows: int,
              extra_rows: np.ndarray | None, lanes_per_chunk: int = LANES_PER_CHUNK) -> list[kernel.ChunkRuns]:
    """Where the host rule's lanes go: global rows ``first_row ...`` (``n_rows``, output rows ``0 ...``), then
    ``extra_rows`` (any global rows, any order, output rows ``n_rows ...``), as runs of each chunk's stream.

    A chunk's runs are sorted by lane (one walk down its stream for own and extra rows together);
    consecutive rows landing in consecutive output rows make one run.
    """
    per_chunk = rows_per_chunk(width, lanes_per_chunk)
    runs: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    spans = _chunk_spans(first_row, n_rows, width, per_chunk)
    for (chunk, start, out_start), length in zip(spans, _span_lengths(spans, per_chunk * width, n_rows * width)):
        runs.setdefault(chunk, []).append((np.array([start]), np.array([out_start]), np.array([length])))
    if extra_rows is not None and len(extra_rows):
        rows = np.asarray(extra_rows, dtype=np.int64).reshape(-1)
        order = np.argsort(rows, kind="stable")
        ordered, chunks = rows[order], rows[order] // per_chunk
        breaks = np.flatnonzero((np.diff(ordered) != 1) | (np.diff(order) != 1) | (np.diff(chunks) != 0)) + 1
        starts = np.concatenate([[0], breaks])
        lengths = np.diff(np.concatenate([starts, [rows.size]]))
        lane = (ordered[starts] - chunks[starts] * per_chunk) * width
        pos = (n_rows + order[starts]) * width
        for chunk, group in _groups(chunks[starts]):
            runs.setdefault(chunk, []).append((lane[group], pos[group], lengths[group] * width))
    out = []
    for chunk, pieces in runs.items():
        lane, pos, length = (np.concatenate(column).astype(np.int64) for column in zip(*pieces))
        order = np.argsort(lane, kind="stable")
        state = np.random.SFC64(chunk_seed(seed, epoch, layer, chunk)).state["state"]["state"]
        out.append(kernel.ChunkRuns(np.asarray(state, dtype=np.uint64), lane[order], pos[order], length[order]))
    return out


def load_compiled_passes(largest_pass: int, device: torch.device, dtype: torch.dtype) -> float | None:
    """Load the compiled passes now (set-up, one rank's own: not collective) where a pass over ``largest_pass``
    entries of ``dtype`` on ``device`` would use them; the seconds it took, or None where none was loaded here
    (small passes, CUDA, numba unavailable). Loaded lazily instead, the load would run in the background
    beside the first epochs and slow them (:mod:`sparse_dist.dropout_kernel`)."""
    if device.type != "cpu" or dtype not in COMPILED_DTYPES or largest_pass < kernel.MIN_ENTRIES:
        return None
    return kernel.load_now()


def _groups(keys: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``(key, positions)`` of each run of equal values in the sorted ``keys``."""
    bounds = np.flatnonzero(np.diff(keys)) + 1
    return [(int(keys[group[0]]), group) for group in np.split(np.arange(keys.size), bounds)]


def _keep_on_host(mask: torch.Tensor, runs: list[kernel.ChunkRuns], rule: KeepRule) -> None:
    """Host rule into a boolean tensor: SFC64 per chunk, compiled, chunks over torch's threads."""
    flat = mask.view(-1).numpy()
    if not kernel.worth(flat.size):
        kernel.keep_runs_numpy(runs, flat, rule.threshold)
        return
    flat = flat.view(np.uint8)
    kernel.apply_chunks(runs, flat, flat, rule.threshold, kernel.KEEP, torch.get_num_threads())


def _span_lengths(spans: list[tuple[int, int, int]], chunk_lanes: int, total: int) -> list[int]:
    """Lanes each span contributes to the output."""
    return [min(chunk_lanes - start, total - out_start) for _, start, out_start in spans]


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


@dataclass(frozen=True)
class _MaskOf:
    """Applies a boolean mask made beforehand (CUDA, or a dtype the compiled passes do not take)."""

    mask: torch.Tensor

    def multiply(self, src: torch.Tensor) -> torch.Tensor:
        return torch.mul(src, self.mask)

    def relu_fill(self, src: torch.Tensor, timer: ComputeTimer | None) -> torch.Tensor:
        out = torch.relu(src)
        with _timed(timer, out.device):
            zero_dropped_(out, self.mask)
        return out


@dataclass(frozen=True)
class _StreamOf:
    """Draws the host rule's words and applies them in one compiled pass (:mod:`sparse_dist.dropout_kernel`):
    no mask is stored, and the backward draws the same words again (cheaper than keeping them)."""

    runs: list[kernel.ChunkRuns]
    threshold: int

    def _apply(self, src: torch.Tensor, mode: int) -> torch.Tensor:
        src = src.detach().contiguous()
        out = torch.empty_like(src, memory_format=torch.contiguous_format)
        kernel.apply_chunks(self.runs, src.view(-1).numpy(), out.view(-1).numpy(), self.threshold, mode,
                            torch.get_num_threads())
        return out

    def multiply(self, src: torch.Tensor) -> torch.Tensor:
        return self._apply(src, kernel.MULTIPLY)

    def relu_fill(self, src: torch.Tensor, timer: ComputeTimer | None) -> torch.Tensor:
        with _timed(timer, src.device):
            return self._apply(src, kernel.RELU_FILL)


class _Masked(torch.autograd.Function):
    """``h * mask``; keeps how to mask (the boolean mask, or the streams to draw again) only if ``h`` needs a
    gradient."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: torch.Tensor,  # type: ignore[override]
                masking: _MaskOf | _StreamOf, timer: ComputeTimer | None) -> torch.Tensor:
        ctx.masking = masking if ctx.needs_input_grad[0] else None  # type: ignore[attr-defined]
        ctx.timer = timer  # type: ignore[attr-defined]
        return masking.multiply(h)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,  # type: ignore[override]
                 grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        with _timed(ctx.timer, grad.device):  # type: ignore[attr-defined]
            return ctx.masking.multiply(grad), None, None  # type: ignore[attr-defined]


class _ReluMasked(torch.autograd.Function):
    """``relu(z) * mask`` in one node: the backward is ReLU's own, read from the masked output.

    ``d out / d z = [z > 0] mask = [out > 0]``, so nothing but the output is kept and the mask
    costs no backward pass at all.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, z: torch.Tensor,  # type: ignore[override]
                masking: _MaskOf | _StreamOf, timer: ComputeTimer | None) -> torch.Tensor:
        out = masking.relu_fill(z, timer)
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
    masks under ``masks`` and applying them (forward and backward) under ``dropout``; on the CPU's
    compiled path drawing and applying are one pass, booked under ``dropout`` (with the ReLU it
    fuses), and ``masks`` books only the streams' seeding.
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
        masking = self._masking(layer, h, extra_rows)
        with _timed(self.timer, h.device):
            return _Masked.apply(h, masking, self.timer)

    def masks(self, layer: int) -> "LayerMasks":
        """Layer ``layer``'s masks for receiver-side dropout (handed to the SpMM in the exchange context)."""
        return LayerMasks(self, layer)

    def relu_drop(self, z: torch.Tensor, layer: int) -> torch.Tensor:
        """``relu(z) * mask`` (unscaled): ReLU of one layer fused with the dropout of the next's input."""
        return _ReluMasked.apply(z, self._masking(layer, z), self.timer)

    def _masking(self, layer: int, like: torch.Tensor, extra_rows: np.ndarray | None = None) -> _MaskOf | _StreamOf:
        """How to mask layer ``layer``'s input ``like`` (own rows, then ``extra_rows``): on the CPU the compiled
        one-pass rule (its streams' states booked as ``masks``), elsewhere (or for a small ``like``, or until
        compiled: :func:`sparse_dist.dropout_kernel.worth`) a boolean mask."""
        if like.device.type != "cpu" or like.dtype not in COMPILED_DTYPES or not kernel.worth(like.numel()):
            return _MaskOf(self.mask(layer, like, extra_rows))
        with _timed(self.timer, like.device, "masks"):
            own = like.shape[0] - (0 if extra_rows is None else len(extra_rows))
            runs = host_runs(self.seed, self.epoch, layer, like.shape[1], self.first_row, own, extra_rows)
            return _StreamOf(runs, self.rule.threshold)


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
