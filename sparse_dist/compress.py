"""Compressed boundary messages (DESIGN section 4: the compression axis), with optional error feedback.

``--compress fp16|bf16|int8[:stochastic][,feedback]`` applies to the rows the SpMM exchanges send
(forward rows, backward gradient pieces), in every plan; never to the weight-gradient allreduce nor the
1.5D replica allreduce and broadcast, which stay in the training dtype. A message of ``r`` rows of width
``F`` travels as ``r x row_bytes(F)`` bytes (``uint8``), so every collective moves plain bytes:

* ``fp16`` / ``bf16``: each value rounded to nearest in the 16-bit format; ``2 F`` bytes a row.
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

FORMATS: tuple[str, ...] = ("fp16", "bf16", "int8")
_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
_SCALE_BYTES = 4


@dataclass
class Codec:
    """One run's compression of exchanged rows (see the module docstring); holds the feedback residuals."""

    format: str
    stochastic: bool = False
    feedback: bool = False
    seed: int = 0
    residuals: dict[tuple[int, str, int], torch.Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"compression format must be one of {FORMATS}, got {self.format!r}")
        if self.stochastic and self.format != "int8":
            raise ValueError(f"stochastic rounding is an int8 option, not {self.format}'s")

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> "Codec | None":
        """``none`` -> None; ``FORMAT[:stochastic][,feedback]`` -> a codec."""
        spec = text.strip()
        if spec in ("", "none"):
            return None
        head, *options = [piece.strip() for piece in spec.split(",")]
        name, _, rounding = head.partition(":")
        if rounding not in ("", "stochastic") or any(option != "feedback" for option in options):
            raise ValueError(f"--compress {spec!r}: expected fp16|bf16|int8[:stochastic][,feedback]")
        return cls(name, rounding == "stochastic", bool(options), seed)

    def __str__(self) -> str:
        return self.format + (":stochastic" if self.stochastic else "") + (",feedback" if self.feedback else "")

    def row_bytes(self, width: int) -> int:
        """Bytes one row of ``width`` values travels as."""
        return width + _SCALE_BYTES if self.format == "int8" else 2 * width

    # ------------------------------------------------------------ coding
    def encode(self, rows: torch.Tensor, seed_key: tuple[int, ...] = ()) -> torch.Tensor:
        """``rows`` (``r x F``, float) as ``r x row_bytes(F)`` bytes (uint8, contiguous)."""
        rows = rows.detach()
        if rows.shape[0] == 0:
            return self.empty(0, rows.shape[1], rows.device)
        if self.format in _HALF:
            return rows.to(_HALF[self.format]).contiguous().view(torch.uint8).reshape(rows.shape[0], -1)
        width = rows.shape[1]
        # max |x| per row as |max(max x, -min x)|: two reductions, no |rows|-sized temporary (the same value;
        # the outer abs turns a zero row's -0.0 into the 0.0 the scale has always been sent as)
        peak = (torch.maximum(rows.amax(dim=1, keepdim=True), rows.amin(dim=1, keepdim=True).neg()).abs_()
                if width else rows.new_zeros(rows.shape[0], 1))
        scale = (peak / 127.0).to(torch.float32)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        ratio = rows.to(torch.float32) / safe  # the one float temporary; rounded in place below
        if self.stochastic:
            generator = torch.Generator(device=rows.device).manual_seed(self._stream(seed_key))
            ratio.add_(torch.rand(ratio.shape, generator=generator, device=rows.device, dtype=ratio.dtype)).floor_()
        else:
            ratio.round_()
        codes = ratio.clamp_(-127, 127).to(torch.int8)
        out = torch.empty(rows.shape[0], width + _SCALE_BYTES, dtype=torch.uint8, device=rows.device)
        out[:, :_SCALE_BYTES] = scale.contiguous().view(torch.uint8).reshape(rows.shape[0], _SCALE_BYTES)
        out[:, _SCALE_BYTES:] = codes.view(torch.uint8)
        return out

    def decode(self, payload: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
        """The rows a payload of :meth:`encode` stands for (``r x width``, ``dtype``)."""
        if payload.shape[0] == 0:
            return torch.empty(0, width, dtype=dtype, device=payload.device)
        if self.format in _HALF:
            return payload.contiguous().view(_HALF[self.format]).reshape(payload.shape[0], width).to(dtype)
        scale = payload[:, :_SCALE_BYTES].contiguous().view(torch.float32)
        codes = payload[:, _SCALE_BYTES:].contiguous().view(torch.int8)
        return codes.to(dtype).mul_(scale.to(dtype))

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
        carried = residual if index is None else residual.index_select(0, index)
        target = rows.detach() + carried
        payload = self.encode(target, seed_key)
        error = target.sub_(self.decode(payload, rows.shape[1], rows.dtype))  # target is not needed after encode
        if index is None:
            residual.copy_(error)
        else:
            residual.index_copy_(0, index, error)
        return payload

    def state_dict(self) -> dict[str, Any]:
        return {"residuals": {key: value.cpu() for key, value in self.residuals.items()}}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.residuals = {tuple(key): value.to(device) for key, value in state["residuals"].items()}


def compress_arg(text: str) -> Codec | None:
    """argparse ``type=`` of ``--compress`` (a bad spec is refused while the command line is parsed)."""
    try:
        return Codec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
