"""Compressed boundary messages (DESIGN section 4: the compression axis), with optional error feedback.

``--compress fp16|bf16|int8[:stochastic][,feedback]`` applies to the rows the SpMM exchanges send
(forward rows, backward gradient pieces), in every plan; never to the weight-gradient allreduce nor the
1.5D replica allreduce and broadcast, which stay in the training dtype. A message of ``r`` rows of width
``F`` travels as ``r x row_bytes(F)`` bytes (``uint8``), so every collective moves plain bytes:

* ``bf16``: each value rounded to nearest in bfloat16 (float32's range, 8 bits of precision); ``2 F`` bytes a row.
* ``fp16``: per row a power of two ``2^k`` near the row's largest magnitude (``k`` an int16: 2 bytes), then each
  value of the row divided by it (exact: a power of two) and rounded to nearest in IEEE half (``F`` values of 2
  bytes). In half's normal range that is the same rounding as a plain cast (``2^-11`` of a value); what the
  exponent adds is range: a plain cast flushes values below ``2^-24`` to zero and loses precision below
  ``2^-14``, and the backward's gradient rows on a 200k-node graph are that small (loss averaged over 10^5
  nodes): on the 200k synthetic cut into 4 random parts, a plain cast stalled for 20 epochs and ended 2.8
  points below exact (bf16, with float32's range, tracked exact). ``2 F + 2`` bytes a row.
* ``int8``: per row a float32 scale ``s = max_k |x_k| / 127`` (4 bytes, then ``F`` int8 codes
  ``round(x / s)``); ``:stochastic`` rounds ``x / s`` down or up with probability equal to the fraction
  (unbiased: ``E[decode] = x``), from a generator seeded by (seed, epoch, layer, direction, sender) so a
  run is reproducible (the draws depend on ``P``, like a receiver-side sample's). ``F + 4`` bytes a row.

The broadcast plans sum their backward pieces at the owner; MPI cannot sum these codes, so a compressed
backward gathers the pieces to the owner (one non-blocking gatherv per owner, counted like the reduce
it replaces: every other rank sends its piece, the owner receives them all) and the owner decodes and
sums them.

Error feedback (``,feedback``): the sender keeps, per layer, direction and message, the error its
receivers see, ``e = (x + e_prev) - decode(encode(x + e_prev))``, and adds it to the next message before
encoding, so the error does not accumulate over epochs. The residual is indexed by the rows of the exact
message (a sampled message updates the rows it sent; a row not sent keeps its residual); a message that is
not sent (a SANCUS skip) leaves it alone. Residuals are per-rank state that checkpoints keep.
"""

from __future__ import annotations

import argparse
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from sparse_dist import state_checks as checks

FORMATS: tuple[str, ...] = ("fp16", "bf16", "int8")
_SCALE_BYTES = 4       # int8's float32 scale a row
_EXPONENT_BYTES = 2    # fp16's int16 exponent a row (2 bytes keep the half values aligned)
# fp16's row exponent k: 2^k and 2^-k are both normal float32, so scaling by them is exact both ways
_EXPONENT_RANGE = (-126, 127)
# The codec works through a message a block of rows at a time, so that int8's five or six passes over a block
# (scale, divide, round, clamp, cast, and feedback's decode and subtract) read cache, not memory: 256 Ki values are
# 1 MiB of float32 (this machine's L2 a core; a block's operations cost a few microseconds each)
_BLOCK_VALUES = 1 << 18


@dataclass
class Codec:
    """One run's compression of exchanged rows (see the module docstring); holds the feedback residuals."""

    format: str
    stochastic: bool = False
    feedback: bool = False
    seed: int = 0
    residuals: dict[tuple[int, str, int], torch.Tensor] = field(default_factory=dict, repr=False)
    # work buffers reused from block to block and message to message (see :meth:`_buffer`); not state
    _scratch: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"compression format must be one of {FORMATS}, got {self.format!r}")
        if self.stochastic and self.format != "int8":
            raise ValueError(f"stochastic rounding is an int8 option, not {self.format}'s")

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> "Codec | None":
        """``none`` -> None; ``FORMAT[:stochastic][,feedback]`` -> a codec; empty text is refused (it would
        silently mean none)."""
        spec = text.strip()
        if not spec:
            raise ValueError("--compress '': an empty format; write none for no compression, or "
                             "fp16|bf16|int8[:stochastic][,feedback]")
        if spec == "none":
            return None
        head, *options = [piece.strip() for piece in spec.split(",")]
        name, _, rounding = head.partition(":")
        if rounding not in ("", "stochastic") or any(option != "feedback" for option in options):
            raise ValueError(f"--compress {spec!r}: expected fp16|bf16|int8[:stochastic][,feedback]")
        try:
            return cls(name, rounding == "stochastic", bool(options), seed)
        except ValueError as exc:
            raise ValueError(f"--compress {spec!r}: {exc}") from None

    def __str__(self) -> str:
        return self.format + (":stochastic" if self.stochastic else "") + (",feedback" if self.feedback else "")

    def tightened(self) -> str | None:
        """Its text one step closer to exact for the accuracy guard: int8 -> fp16 (no residuals: fp16's error
        is already 2^-11 of a value), 16-bit -> None (uncompressed)."""
        return "fp16" if self.format == "int8" else None

    def row_bytes(self, width: int) -> int:
        """Bytes one row of ``width`` values travels as."""
        if self.format == "int8":
            return width + _SCALE_BYTES
        return 2 * width + (_EXPONENT_BYTES if self.format == "fp16" else 0)

    # ------------------------------------------------------------ coding
    def encode(self, rows: torch.Tensor, seed_key: tuple[int, ...] = ()) -> torch.Tensor:
        """``rows`` (``r x F``, float) as ``r x row_bytes(F)`` bytes (uint8, contiguous)."""
        rows = rows.detach()
        if rows.shape[0] == 0:
            return self.empty(0, rows.shape[1], rows.device)
        out = self.empty(rows.shape[0], rows.shape[1], rows.device)
        noise = self._noise(rows, seed_key)
        for block in _row_blocks(rows):
            self._encode_block(rows[block], out[block], None if noise is None else noise[block])
        return out

    def decode(self, payload: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
        """The rows a payload of :meth:`encode` stands for (``r x width``, ``dtype``)."""
        if payload.shape[0] == 0:
            return torch.empty(0, width, dtype=dtype, device=payload.device)
        if self.format == "bf16":
            return payload.contiguous().view(torch.bfloat16).reshape(payload.shape[0], width).to(dtype)
        if self.format == "fp16":
            exponent = torch.empty(payload.shape[0], _EXPONENT_BYTES, dtype=payload.dtype, device=payload.device)
            exponent = exponent.copy_(payload[:, :_EXPONENT_BYTES]).view(torch.int16)
            half = _halves(payload[:, _EXPONENT_BYTES:], torch.float16)
            return half.to(dtype).mul_(_power_of_two(exponent, dtype))
        # a fresh (r, 4) buffer: .contiguous() keeps a one-row slice's row stride (width + 4 bytes), which a view
        # as float32 refuses when width is not a multiple of 4 (one sampled row of CiteSeer's 6 classes)
        scale = torch.empty(payload.shape[0], _SCALE_BYTES, dtype=payload.dtype, device=payload.device)
        scale = scale.copy_(payload[:, :_SCALE_BYTES]).view(torch.float32)
        # the codes are read through a strided view of the payload (no contiguous copy); a promoting
        # torch.mul(int8, float, out=) measured 10-20x slower on CPU than this cast and in-place product
        return payload[:, _SCALE_BYTES:].view(torch.int8).to(dtype).mul_(scale.to(dtype))

    def _noise(self, rows: torch.Tensor, seed_key: tuple[int, ...]) -> torch.Tensor | None:
        """Stochastic rounding's uniform draws for the whole message (one stream, whatever the blocking)."""
        if not self.stochastic:
            return None
        generator = torch.Generator(device=rows.device).manual_seed(self._stream(seed_key))
        return torch.rand(rows.shape, generator=generator, device=rows.device, dtype=torch.float32)

    def _encode_block(self, rows: torch.Tensor, out: torch.Tensor, noise: torch.Tensor | None,
                      decoded: torch.dtype | None = None) -> torch.Tensor | None:
        """Write the code of ``rows`` (a block of a message) into ``out`` (its rows of the payload). With
        ``decoded``, also return what the receiver will decode, in that dtype, in a work buffer (error feedback
        needs it; int8 computes it from the codes at hand, not from the payload)."""
        if self.format == "bf16":
            half = _halves(out, torch.bfloat16)
            half.copy_(rows)  # rounded to nearest, as rows.to(bfloat16)
            if decoded is None:
                return None
            return self._buffer("decoded", rows.shape[0], rows.shape[1], decoded, rows.device).copy_(half)
        if self.format == "fp16":
            half, exponent = self._scale_to_half(rows, out)
            if decoded is None:
                return None
            scaled = self._buffer("decoded", rows.shape[0], rows.shape[1], decoded, rows.device).copy_(half)
            return scaled.mul_(_power_of_two(exponent, decoded))
        codes, scale = self._quantize(rows, out, noise)
        return None if decoded is None else codes.to(decoded).mul_(scale.to(decoded))

    def _scale_to_half(self, rows: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp16: write ``rows``' exponents and half values into ``out`` (its rows of the payload); returns the
        half values (``r x F``) and the exponents (``r x 1``, int16)."""
        peak = _row_peak(rows)
        # peak = m 2^e with m in [0.5, 1): k = e - 1 puts the row in (-2, 2), far inside half's range
        exponent = (torch.frexp(peak.to(torch.float32)).exponent - 1).clamp_(*_EXPONENT_RANGE).to(torch.int16)
        out[:, :_EXPONENT_BYTES] = exponent.view(torch.uint8).reshape(rows.shape[0], _EXPONENT_BYTES)
        half = _halves(out[:, _EXPONENT_BYTES:], torch.float16)
        scaled = self._buffer("ratio", rows.shape[0], rows.shape[1], rows.dtype, rows.device)
        torch.mul(rows, _power_of_two(exponent.neg(), rows.dtype), out=scaled)  # exact: a power of two
        half.copy_(scaled)  # rounded to nearest
        return half, exponent

    def _quantize(self, rows: torch.Tensor, out: torch.Tensor,
                  noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """int8: write ``rows``' scales and codes into ``out`` (its rows of the payload); returns the rounded
        codes as float32 (``r x F``, a work buffer) and their scales (``r x 1``)."""
        width = rows.shape[1]
        scale = (_row_peak(rows) / 127.0).to(torch.float32)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        ratio = self._buffer("ratio", rows.shape[0], width, torch.float32, rows.device)  # rounded in place below
        if rows.dtype == torch.float32:
            torch.div(rows, safe, out=ratio)
        else:  # as rows.to(float32) / safe
            ratio.copy_(rows).div_(safe)
        if noise is not None:
            ratio.add_(noise).floor_()
        else:
            ratio.round_()
        ratio.clamp_(-127, 127)
        out[:, :_SCALE_BYTES] = scale.view(torch.uint8).reshape(rows.shape[0], _SCALE_BYTES)
        out[:, _SCALE_BYTES:].view(torch.int8).copy_(ratio)  # integral values: the cast is exact
        return ratio, scale

    def _buffer(self, name: str, rows: int, width: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A ``rows x width`` work buffer kept between blocks and messages. Allocating and freeing a fresh
        megabyte temporary per block made the allocator hand pages back and fault them in again: without
        emulation, P = 2 on the 200k graph, int8 with feedback took 0.815 s an epoch with fresh temporaries
        and 0.742 s with glibc told to keep freed memory, against exact's 0.655-0.685 s."""
        flat = self._scratch.get(name)
        if flat is None or flat.numel() < rows * width or flat.dtype != dtype or flat.device != device:
            flat = self._scratch[name] = torch.empty(rows * width, dtype=dtype, device=device)
        return flat[: rows * width].view(rows, width)

    def empty(self, rows: int, width: int, device: torch.device) -> torch.Tensor:
        """A receive buffer for ``rows`` coded rows of ``width``."""
        return torch.empty(rows, self.row_bytes(width), dtype=torch.uint8, device=device)

    def _stream(self, key: tuple[int, ...]) -> int:
        return zlib.crc32(np.array((self.seed, *key), dtype=np.int64).tobytes()) & 0x7FFFFFFF

    # ---------------------------------------------------------- feedback
    def send(self, rows: torch.Tensor, key: tuple[int, str, int], total: int, positions: np.ndarray | None,
             seed_key: tuple[int, ...] = ()) -> torch.Tensor:
        """Encode the rows of one message (``positions``: which rows of the exact message, of ``total``, they
        are; None: all), adding and updating the error-feedback residual where feedback is on."""
        if not self.feedback:
            return self.encode(rows, seed_key)
        residual = self.residuals.get(key)
        if residual is None or residual.shape != (total, rows.shape[1]):
            residual = self.residuals[key] = rows.new_zeros(total, rows.shape[1])
        index = None if positions is None else torch.from_numpy(np.asarray(positions, dtype=np.int64)).to(rows.device)
        rows = rows.detach()
        out = self.empty(rows.shape[0], rows.shape[1], rows.device)
        noise = self._noise(rows, seed_key)
        for block in _row_blocks(rows):  # each block's passes stay in cache: a few hundred KiB at a time
            at = None if index is None else index[block]
            target = self._buffer("target", rows[block].shape[0], rows.shape[1], rows.dtype, rows.device)
            if at is None:
                torch.add(rows[block], residual[block], out=target)
            else:  # the carried residual plus the rows (the same sum either way round)
                torch.index_select(residual, 0, at, out=target).add_(rows[block])
            # e = (x + e_prev) - decode(encode(x + e_prev)), decoded as the receiver does
            error = target.sub_(self._encode_block(target, out[block], None if noise is None else noise[block],
                                                   decoded=target.dtype))
            if at is None:
                residual[block] = error
            else:
                residual.index_copy_(0, at, error)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"residuals": {key: value.cpu() for key, value in self.residuals.items()}}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        residuals = state["residuals"]
        if not isinstance(residuals, dict) or not all(isinstance(key, tuple) for key in residuals):
            raise checks.StateError("the feedback residuals are not a table of messages")
        self.residuals = {key: checks.rows(value, f"the feedback residual {key}").to(device)
                          for key, value in residuals.items()}


def _row_peak(rows: torch.Tensor) -> torch.Tensor:
    """Each row's largest magnitude (``r x 1``; 0 for a zero-width row)."""
    if not rows.shape[1]:
        return rows.new_zeros(rows.shape[0], 1)
    # max |x| as |max(max x, -min x)|: no |rows|-sized temporary (torch.aminmax along a dimension is an order of
    # magnitude slower on CPU than the two reductions); the outer abs makes a zero row's peak +0.0, not -0.0
    return torch.maximum(rows.amax(dim=1, keepdim=True), rows.amin(dim=1, keepdim=True).neg()).abs_()


def _halves(part: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``part`` (``r x 2F`` payload bytes) seen as ``r x F`` 16-bit values of ``dtype``, without a copy; a
    zero-width part has no bytes to view, so a zero-width tensor stands in."""
    if part.shape[1]:
        return part.view(dtype)
    return part.new_empty(part.shape[0], 0, dtype=dtype)


def _power_of_two(exponent: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``2^exponent`` in ``dtype`` (exact for fp16's exponents, :data:`_EXPONENT_RANGE`)."""
    return torch.ldexp(torch.ones(exponent.shape, dtype=dtype, device=exponent.device), exponent.to(torch.int32))


def _row_blocks(rows: torch.Tensor) -> list[slice]:
    """Slices of ``rows`` holding about :data:`_BLOCK_VALUES` values each (at least one row)."""
    step = max(1, _BLOCK_VALUES // max(1, rows.shape[1]))
    return [slice(start, start + step) for start in range(0, rows.shape[0], step)]


def compress_arg(text: str) -> Codec | None:
    """argparse ``type=`` of ``--compress`` (a bad spec is refused while the command line is parsed)."""
    try:
        return Codec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
