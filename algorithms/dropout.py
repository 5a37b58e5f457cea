"""Dropout masks decided per GLOBAL row and made on the tensor's own device.

Why per global row: the mask of entry ``(row, f)`` must not depend on which
rank owns ``row``, so that P ranks train exactly like one process.
Why on the device: drawing masks on the host and copying them over cost
99% of a GPU epoch.

The rule (layer ``layer`` of epoch ``epoch``, a matrix of width ``width``), one for every device:

* The layer has one stream of 64-bit words, counter-based: word ``w`` is
  ``splitmix64(key + w * GOLDEN)`` (the ``w``-th output of the SplitMix64
  generator seeded with ``key``; :func:`sparse_dist.splitmix.stream_words`),
  ``key`` the splitmix64 chain of ``(seed, epoch, layer, 0x44524F50)``
  (:func:`stream_key`).
* Entry ``(row, f)`` is lane ``g = row * width + f``: bits
  ``16 (g mod 4) ... 16 (g mod 4) + 15`` of word ``g // 4`` (the word's
  little-endian 16-bit lanes), read unsigned ``u``.
* The entry is kept when ``u ^ 0x8000 < T`` with ``T = round((1 - p) 2^16)``
  (at least 1), and a kept value is scaled by ``2^16 / T``, so the expected
  value is exactly the input. The keep probability is ``1 - p`` rounded to
  a multiple of ``2^-16`` (exact for p = 0.5; 0.6 keeps 0.399994).

Any lane is made on its own, so a rank makes exactly the lanes of its rows, and
any piece of a pass can go to any thread. So masks are identical for every P
and on every device: a CUDA run draws the CPU run's masks.

* CPU: the words are made and applied in one compiled pass
  (:mod:`sparse_dist.dropout_kernel`: no mask is stored, and a backward that
  needs the mask makes it again), cut into equal shares over torch's threads;
  for matrices under :data:`sparse_dist.dropout_kernel.MIN_ENTRIES` entries in a
  run too short to load the kernels at set-up, and until the kernels are ready
  (compiled in the background: seconds the first time on a machine, then loaded
  from numba's cache), NumPy makes the masks and torch applies them, with the
  same values.
* Other devices: :mod:`algorithms.dropout_device` (on CUDA one CuPy kernel a
  mask, else torch's integer ops with the same bits), the mask stored as a
  boolean tensor for the backward.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from algorithms import dropout_device
from algorithms.hashing import chained_key
from sparse_dist import dropout_kernel as kernel
from sparse_dist.accounting import ComputeTimer
from sparse_dist.receiver_dropout import COMPILED_DTYPES, zero_dropped_

_LANE_SPAN = 1 << 16
_WORD_BITS = (1 << 64) - 1
_STREAM_TAG = 0x44524F50  # "DROP": keeps the masks' streams apart from every other splitmix64 chain's


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


def stream_key(seed: int, epoch: int, layer: int) -> int:
    """The key (``uint64``, as a Python int) of one layer's stream: :func:`algorithms.hashing.chained_key` of
    ``(seed, epoch, layer, tag)`` (``k = seed``, then ``k = sm(sm(k) ^ word)``). Non-negative arguments."""
    if min(seed, epoch, layer) < 0:
        raise ValueError(f"dropout seed, epoch and layer must be >= 0, got {(seed, epoch, layer)}")
    return chained_key(seed, epoch, layer, _STREAM_TAG) & _WORD_BITS


def keep_mask(seed: int, epoch: int, layer: int, first_row: int, n_rows: int, width: int, p: float,
              device: str | torch.device = "cpu", *, form: str = "auto",
              columns: tuple[int, int] | None = None) -> torch.Tensor:
    """Boolean ``n_rows x width`` mask of kept entries of global rows ``first_row ...``, made on ``device``.

    ``columns``: ``(c0, c1)`` gives only those columns of a ``width``-wide layer (``n_rows x (c1 - c0)``; a process
    grid rank's block): on the CPU only their lanes are made, elsewhere the rows' whole width and then the cut.
    ``form``: ``auto``; ``torch`` makes it with torch's integer ops on any device (the CUDA fallback's form, which
    tests run on the CPU).
    """
    rule, device = _resolve(p, device, form)
    c0, c1 = (0, width) if columns is None else columns
    if not 0 <= c0 <= c1 <= width:
        raise ValueError(f"columns must satisfy 0 <= c0 <= c1 <= width = {width}, got {columns}")
    if p == 0.0 or n_rows == 0 or c1 == c0:
        return torch.ones(n_rows, c1 - c0, dtype=torch.bool, device=device)
    if first_row < 0:
        raise ValueError(f"global rows must be >= 0, got {first_row}")
    key = stream_key(seed, epoch, layer)
    if device.type == "cpu" and form == "auto":
        mask = torch.empty(n_rows, c1 - c0, dtype=torch.bool)
        _keep_on_host(mask, key, _block_runs(width, first_row, n_rows, c0, c1), rule)
        return mask
    mask = torch.empty(n_rows, width, dtype=torch.bool, device=device)
    dropout_device.keep_range(key, first_row, mask, rule.threshold, form=form)
    return mask if (c0, c1) == (0, width) else mask[:, c0:c1].contiguous()


def keep_mask_rows(seed: int, epoch: int, layer: int, global_rows: np.ndarray, width: int, p: float,
                   device: str | torch.device = "cpu", *, form: str = "auto") -> torch.Tensor:
    """Boolean ``len(global_rows) x width`` mask of the given global rows (any order, repeats allowed).

    Row ``k`` of the result equals row ``global_rows[k] - first`` of :func:`keep_mask` over any range
    holding it: the rule is the same, only the rows differ. Used by receivers, which mask rows owned
    by other ranks (a static input's halo rows, received boundary rows) without asking their owners.
    """
    return keep_mask_range_and_rows(seed, epoch, layer, 0, 0, global_rows, width, p, device, form=form)


def keep_mask_range_and_rows(seed: int, epoch: int, layer: int, first_row: int, n_rows: int,
                             global_rows: np.ndarray, width: int, p: float, device: str | torch.device = "cpu", *,
                             form: str = "auto") -> torch.Tensor:
    """Boolean ``(n_rows + len(global_rows)) x width`` mask: global rows ``first_row ...`` (a rank's own), then the
    given ``global_rows`` (any order: a static input's halo rows). One pass on the CPU; on a device the range is
    made from its first row alone (no row ids travel for it) and only ``global_rows`` go to the device."""
    rule, device = _resolve(p, device, form)
    rows = np.asarray(global_rows, dtype=np.int64).reshape(-1)
    if p == 0.0 or n_rows + rows.size == 0 or width == 0:
        return torch.ones(n_rows + rows.size, width, dtype=torch.bool, device=device)
    if first_row < 0 or (rows.size and rows.min() < 0):
        raise ValueError(f"global rows must be >= 0, got {min(first_row, int(rows.min()) if rows.size else 0)}")
    mask = torch.empty(n_rows + rows.size, width, dtype=torch.bool, device=device)
    key = stream_key(seed, epoch, layer)
    if device.type == "cpu" and form == "auto":
        _keep_on_host(mask, key, row_runs(width, first_row, n_rows, rows), rule)
        return mask
    if n_rows:
        dropout_device.keep_range(key, first_row, mask[:n_rows], rule.threshold, form=form)
    if rows.size:
        dropout_device.keep_rows(key, torch.from_numpy(rows).to(device), mask[n_rows:], rule.threshold, form=form)
    return mask


def _resolve(p: float, device: str | torch.device, form: str) -> tuple[KeepRule, torch.device]:
    """The rule of ``p`` and the device (``form`` checked)."""
    if form not in ("auto", "torch"):
        raise ValueError(f"form must be 'auto' or 'torch', got {form!r}")
    return KeepRule.of(p), torch.device(device)


def row_runs(width: int, first_row: int, n_rows: int, extra_rows: np.ndarray | None) -> kernel.LaneRuns:
    """Where a pass's lanes go: global rows ``first_row ...`` (``n_rows``, output rows ``0 ...``), then ``extra_rows``
    (any global rows, any order, output rows ``n_rows ...``); consecutive rows landing in consecutive output rows
    make one run."""
    lane, pos, length = [np.array([first_row * width])], [np.array([0])], [np.array([n_rows * width])]
    if extra_rows is not None and len(extra_rows):
        rows = np.asarray(extra_rows, dtype=np.int64).reshape(-1)
        starts = np.concatenate([[0], np.flatnonzero(np.diff(rows) != 1) + 1])
        lane.append(rows[starts] * width)
        pos.append((n_rows + starts) * width)
        length.append(np.diff(np.concatenate([starts, [rows.size]])) * width)
    lane, pos, length = (np.concatenate(column).astype(np.int64) for column in (lane, pos, length))
    keep = length > 0
    return kernel.LaneRuns(lane[keep], pos[keep], length[keep])


def load_compiled_passes(largest_pass: int, device: torch.device, dtype: torch.dtype, epochs: int = 1) -> float | None:
    """Load the compiled passes now (set-up, one rank's own: not collective) where a pass over ``largest_pass``
    entries of ``dtype`` on ``device`` would use them, or where ``epochs`` of such passes would cost NumPy's words
    more than the load (:func:`sparse_dist.dropout_kernel.loads_at_set_up`); the seconds it took, or None where
    none was loaded here (short runs of small passes, CUDA, numba unavailable). Loaded lazily instead, the load
    would run in the background beside the first epochs and slow them (:mod:`sparse_dist.dropout_kernel`)."""
    if device.type != "cpu" or dtype not in COMPILED_DTYPES or not kernel.loads_at_set_up(largest_pass, epochs):
        return None
    return kernel.load_now()


def _block_runs(width: int, first_row: int, n_rows: int, c0: int, c1: int) -> kernel.LaneRuns:
    """Columns ``c0 ... c1 - 1`` of global rows ``first_row ...`` of a ``width``-wide layer, row after row: one run
    where they are whole rows, else a run a row."""
    if (c0, c1) == (0, width):
        return row_runs(width, first_row, n_rows, None)
    rows = np.arange(n_rows, dtype=np.int64)
    return kernel.LaneRuns((first_row + rows) * width + c0, rows * (c1 - c0), np.full(n_rows, c1 - c0, np.int64))


def _keep_on_host(mask: torch.Tensor, key: int, runs: kernel.LaneRuns, rule: KeepRule) -> None:
    """Host rule into a boolean tensor: compiled over torch's threads, or NumPy for small masks."""
    flat = mask.view(-1).numpy()
    if not kernel.worth(flat.size):
        kernel.keep_runs_numpy(key, runs, flat, rule.threshold)
        return
    flat = flat.view(np.uint8)
    kernel.apply_runs(key, runs, flat, flat, rule.threshold, kernel.KEEP, torch.get_num_threads())


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
    """Makes the rule's words and applies them in one compiled pass (:mod:`sparse_dist.dropout_kernel`):
    no mask is stored, and the backward makes the same words again (cheaper than keeping them)."""

    key: int
    runs: kernel.LaneRuns
    threshold: int

    def _apply(self, src: torch.Tensor, mode: int) -> torch.Tensor:
        src = src.detach().contiguous()
        out = torch.empty_like(src, memory_format=torch.contiguous_format)
        kernel.apply_runs(self.key, self.runs, src.view(-1).numpy(), out.view(-1).numpy(), self.threshold, mode,
                          torch.get_num_threads())
        return out

    def multiply(self, src: torch.Tensor) -> torch.Tensor:
        return self._apply(src, kernel.MULTIPLY)

    def relu_fill(self, src: torch.Tensor, timer: ComputeTimer | None) -> torch.Tensor:
        with _timed(timer, src.device):
            return self._apply(src, kernel.RELU_FILL)


class _Masked(torch.autograd.Function):
    """``h * mask``; keeps how to mask (the boolean mask, or the key and runs to make it again) only if ``h`` needs a
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
    compiled path making and applying are one pass, booked under ``dropout`` (with the ReLU it
    fuses), and ``masks`` books only the key and the runs.
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
            return keep_mask_range_and_rows(self.seed, self.epoch, layer, self.first_row, own, extra_rows,
                                            like.shape[1], self.rule.p, like.device)

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
        one-pass rule (its key and runs booked as ``masks``), elsewhere (or for a small ``like``, or until
        compiled: :func:`sparse_dist.dropout_kernel.worth`) a boolean mask."""
        if like.device.type != "cpu" or like.dtype not in COMPILED_DTYPES or not kernel.worth(like.numel()):
            return _MaskOf(self.mask(layer, like, extra_rows))
        with _timed(self.timer, like.device, "masks"):
            own = like.shape[0] - (0 if extra_rows is None else len(extra_rows))
            runs = row_runs(like.shape[1], self.first_row, own, extra_rows)
            return _StreamOf(stream_key(self.seed, self.epoch, layer), runs, self.rule.threshold)


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
