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
from sparse_dist.codes import halves, levels, pack, packed_width, power_of_two, row_peak, squared_norm, unpacked

FORMATS: tuple[str, ...] = ("fp16", "bf16", "int8", "int4", "int2")
# an integer format's bits a value; its codes lie in [-L, L], L = 2^(bits - 1) - 1 (:func:`levels`)
_INTEGER_BITS = {"int8": 8, "int4": 4, "int2": 2}
ADAPTIVE = "adaptive"
SPEC_FORMS = ("fp16|bf16|int8|int4|int2[:stochastic][,feedback] or "
              "adaptive[:stochastic][,min=2|4|8][,budget=E][,feedback]")
DIRECTIONS: tuple[str, ...] = ("rows", "gradients")
# an adaptive codec's widths, and the format each travels as
WIDTH_FORMATS = {**{bits: name for name, bits in sorted(_INTEGER_BITS.items(), key=lambda item: item[1])},
                 16: "fp16"}
# the rounding step of a width relative to what scales it (an integer format's row peak: 1 / L; fp16's row
# exponent: half's 10 fraction bits): a message's squared error scales with its square
_RELATIVE_STEP = {**{bits: 1.0 / levels(bits) for bits in _INTEGER_BITS.values()}, 16: 2.0**-10}
DEFAULT_FLOOR, DEFAULT_BUDGET = 4, 1.0 / 32
_SCALE_BYTES = 4       # an integer format's float32 scale a row
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
    # where set, each message's squared coding error and squared size, summed per (layer, direction) as a
    # float64 pair on the rows' device (adaptive bit widths read them; no host synchronisation a message)
    errors: dict[tuple[int, str], torch.Tensor] | None = field(default=None, repr=False, compare=False)
    # work buffers reused from block to block and message to message (see :meth:`_buffer`); not state
    _scratch: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"compression format must be one of {FORMATS}, got {self.format!r}")
        if self.stochastic and self.format not in _INTEGER_BITS:
            raise ValueError(f"stochastic rounding is an integer format's option, not {self.format}'s")

    @classmethod
    def parse(cls, text: str, seed: int = 0) -> "Codec | None":
        """``none`` -> None; ``FORMAT[:stochastic][,feedback]`` -> a codec, ``adaptive[:stochastic][,min=B]
        [,budget=E][,feedback]`` -> an :class:`AdaptiveCodec`; empty text is refused (it would silently mean
        none)."""
        spec = text.strip()
        if not spec:
            raise ValueError(f"--compress '': an empty format; write none for no compression, or {SPEC_FORMS}")
        if spec == "none":
            return None
        head, *options = [piece.strip() for piece in spec.split(",")]
        name, _, rounding = head.partition(":")
        settings = dict(option.partition("=")[::2] for option in options if option != "feedback")
        if rounding not in ("", "stochastic") or (settings and name != ADAPTIVE):
            raise ValueError(f"--compress {spec!r}: expected {SPEC_FORMS}")
        try:
            if name == ADAPTIVE:
                return AdaptiveCodec.from_settings(rounding == "stochastic", "feedback" in options, seed, settings)
            return cls(name, rounding == "stochastic", "feedback" in options, seed)
        except ValueError as exc:
            raise ValueError(f"--compress {spec!r}: {exc}") from None

    def __str__(self) -> str:
        return self.format + (":stochastic" if self.stochastic else "") + (",feedback" if self.feedback else "")

    @property
    def adapts(self) -> bool:
        """Whether its bit widths change during training (agreed between steps: :class:`AdaptiveCodec`)."""
        return False

    @property
    def residual_copies(self) -> int:
        """Arrays of (rows an exchanging layer sends) x (its exchanged width) the codec keeps between steps, for the
        memory and disk estimates: error feedback's residual of the rows and of the gradients, else none."""
        return 2 if self.feedback else 0

    def at(self, layer: int, direction: str) -> "Codec":
        """The codec of one layer's messages in one direction (``rows`` or ``gradients``): itself."""
        return self

    def tightened(self) -> str | None:
        """Its text one step closer to exact for the accuracy guard (more bits): int2 -> int4 -> int8 keep
        their options; int8 -> fp16 (no residuals: fp16's error is already 2^-11 of a value); 16-bit -> None
        (uncompressed)."""
        wider = {"int2": "int4", "int4": "int8"}.get(self.format)
        if wider is not None:
            return str(Codec(wider, self.stochastic, self.feedback, self.seed))
        return "fp16" if self.format == "int8" else None

    @property
    def bits(self) -> int:
        """Bits a value travels as (without its row's scale or exponent)."""
        return _INTEGER_BITS.get(self.format, 16)

    def row_bytes(self, width: int) -> int:
        """Bytes one row of ``width`` values travels as."""
        if self.format in _INTEGER_BITS:
            return _SCALE_BYTES + packed_width(width, self.bits)
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
            half = halves(payload[:, _EXPONENT_BYTES:], torch.float16)
            return half.to(dtype).mul_(power_of_two(exponent, dtype))
        # a fresh (r, 4) buffer: .contiguous() keeps a one-row slice's row stride (width + 4 bytes), which a view
        # as float32 refuses when width is not a multiple of 4 (one sampled row of CiteSeer's 6 classes)
        scale = torch.empty(payload.shape[0], _SCALE_BYTES, dtype=payload.dtype, device=payload.device)
        scale = scale.copy_(payload[:, :_SCALE_BYTES]).view(torch.float32)
        if self.bits < 8:
            return unpacked(payload[:, _SCALE_BYTES:], width, self.bits, dtype).mul_(scale.to(dtype))
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
            half = halves(out, torch.bfloat16)
            half.copy_(rows)  # rounded to nearest, as rows.to(bfloat16)
            if decoded is None:
                return None
            return self._buffer("decoded", rows.shape[0], rows.shape[1], decoded, rows.device).copy_(half)
        if self.format == "fp16":
            half, exponent = self._scale_to_half(rows, out)
            if decoded is None:
                return None
            scaled = self._buffer("decoded", rows.shape[0], rows.shape[1], decoded, rows.device).copy_(half)
            return scaled.mul_(power_of_two(exponent, decoded))
        codes, scale = self._quantize(rows, out, noise)
        return None if decoded is None else codes.to(decoded).mul_(scale.to(decoded))

    def _scale_to_half(self, rows: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp16: write ``rows``' exponents and half values into ``out`` (its rows of the payload); returns the
        half values (``r x F``) and the exponents (``r x 1``, int16)."""
        peak = row_peak(rows)
        # peak = m 2^e with m in [0.5, 1): k = e - 1 puts the row in (-2, 2), far inside half's range
        exponent = (torch.frexp(peak.to(torch.float32)).exponent - 1).clamp_(*_EXPONENT_RANGE).to(torch.int16)
        out[:, :_EXPONENT_BYTES] = exponent.view(torch.uint8).reshape(rows.shape[0], _EXPONENT_BYTES)
        half = halves(out[:, _EXPONENT_BYTES:], torch.float16)
        scaled = self._buffer("ratio", rows.shape[0], rows.shape[1], rows.dtype, rows.device)
        torch.mul(rows, power_of_two(exponent.neg(), rows.dtype), out=scaled)  # exact: a power of two
        half.copy_(scaled)  # rounded to nearest
        return half, exponent

    def _quantize(self, rows: torch.Tensor, out: torch.Tensor,
                  noise: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """An integer format: write ``rows``' scales and codes into ``out`` (its rows of the payload); returns the
        rounded codes as float32 (``r x F``, a work buffer) and their scales (``r x 1``)."""
        width, top = rows.shape[1], levels(self.bits)
        scale = (row_peak(rows) / float(top)).to(torch.float32)
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
        ratio.clamp_(-top, top)
        out[:, :_SCALE_BYTES] = scale.view(torch.uint8).reshape(rows.shape[0], _SCALE_BYTES)
        if self.bits < 8:
            pack(ratio, self.bits, out[:, _SCALE_BYTES:])
        else:
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
        are; None: all), adding and updating the error-feedback residual where feedback is on, and adding its
        squared error and size to :attr:`errors` where that is kept."""
        if not self.feedback and self.errors is None:
            return self.encode(rows, seed_key)
        residual = self.residuals.get(key) if self.feedback else None
        if self.feedback and (residual is None or residual.shape != (total, rows.shape[1])):
            residual = self.residuals[key] = rows.new_zeros(total, rows.shape[1])
        index = None if positions is None else torch.from_numpy(np.asarray(positions, dtype=np.int64)).to(rows.device)
        rows = rows.detach()
        out = self.empty(rows.shape[0], rows.shape[1], rows.device)
        noise = self._noise(rows, seed_key)
        sums = None if self.errors is None else torch.zeros(2, dtype=torch.float64, device=rows.device)
        for block in _row_blocks(rows):  # each block's passes stay in cache: a few hundred KiB at a time
            at = None if index is None else index[block]
            target = self._buffer("target", rows[block].shape[0], rows.shape[1], rows.dtype, rows.device)
            if residual is None:
                target.copy_(rows[block])
            elif at is None:
                torch.add(rows[block], residual[block], out=target)
            else:  # the carried residual plus the rows (the same sum either way round)
                torch.index_select(residual, 0, at, out=target).add_(rows[block])
            if sums is not None:
                sums[1] += squared_norm(target)
            # e = (x + e_prev) - decode(encode(x + e_prev)), decoded as the receiver does
            error = target.sub_(self._encode_block(target, out[block], None if noise is None else noise[block],
                                                   decoded=target.dtype))
            if sums is not None:
                sums[0] += squared_norm(error)
            if residual is None:
                continue
            if at is None:
                residual[block] = error
            else:
                residual.index_copy_(0, at, error)
        if sums is not None and self.errors is not None:
            measured = key[:2]
            self.errors[measured] = sums if measured not in self.errors else self.errors[measured].add_(sums)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"residuals": {key: value.cpu() for key, value in self.residuals.items()}}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        residuals = state["residuals"]
        if not isinstance(residuals, dict) or not all(isinstance(key, tuple) for key in residuals):
            raise checks.StateError("the feedback residuals are not a table of messages")
        self.residuals = {key: checks.rows(value, f"the feedback residual {key}").to(device)
                          for key, value in residuals.items()}


@dataclass
class AdaptiveCodec(Codec):
    """Bit widths per layer and direction, chosen from each message's measured error (``--compress adaptive``).

    A message of layer ``l`` in direction ``d`` (``rows`` forward, ``gradients`` backward) travels at the width
    ``bits[(l, d)]`` (2, 4 or 8: integer codes with a float32 row scale; 16: fp16 with a row exponent), first
    8. Each message adds its squared coding error and squared size to :attr:`errors`; between two steps every
    rank sums them over the job and :meth:`choose` gives each (layer, direction) the fewest bits, not below
    ``floor``, whose predicted relative squared error ``|e|^2 / |x|^2`` stays within ``budget``. The prediction
    scales the measured error by the squared ratio of the widths' rounding steps (a row's error is at most half
    a step a value; int4's step is 127 / 7 times int8's). The link's cost enters as the order of preference:
    at equal error the fewer bytes win on any link slow enough to compress at all (whether to compress is the
    link's question, the user's or ``--policy auto``'s). Why ``1/32``: a row's rounding error is about
    ``step^2 / 12`` a value, so a Gaussian-like row of 128 values (peak about 2.8 standard deviations) loses
    about 0.013 of its squared size at int4 and 0.00004 at int8; the hidden layers' rows and gradients of the
    200k synthetic measured 0.012-0.013 at int4, R-MAT SCALE 18's 0.005-0.026. The 200k synthetic's output
    gradients measured 0.045 at int4: under a budget of 1/16 they went at int4 and the run reached 0.69
    validation accuracy 3 epochs after int8 with feedback (19 against 16, P = 4); at 0.02 they stayed at int8
    and it reached it at the same epoch with 40% fewer bytes. Rows whose one large value makes int4's step
    coarse for the others exceed the budget and stay at int8. The guard tightens by raising the floor
    (4 -> 8 -> fp16 everywhere). The widths are the same on every rank (the replicated checkpoint state
    keeps them); the sums start afresh every step.
    """

    floor: int = DEFAULT_FLOOR
    budget: float = DEFAULT_BUDGET
    widths: dict[tuple[int, str], int] = field(default_factory=dict)
    _children: dict[int, Codec] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.floor not in (2, 4, 8):
            raise ValueError(f"min must be 2, 4 or 8 bits, got {self.floor}")
        if not (0.0 < self.budget < 1.0):
            raise ValueError(f"budget must be a relative squared error in (0, 1), got {self.budget}")
        if self.errors is None:
            self.errors = {}

    @classmethod
    def from_settings(cls, stochastic: bool, feedback: bool, seed: int, settings: dict[str, str]) -> "AdaptiveCodec":
        """From ``adaptive``'s options (``min=B``, ``budget=E``); anything else is refused."""
        unknown = sorted(set(settings) - {"min", "budget"})
        if unknown:
            raise ValueError(f"adaptive takes min=B and budget=E, not {', '.join(unknown)}")
        try:
            floor = int(settings.get("min", DEFAULT_FLOOR))
            budget = float(settings.get("budget", DEFAULT_BUDGET))
        except ValueError:
            raise ValueError("min is a bit width (2, 4 or 8), budget a number") from None
        return cls(ADAPTIVE, stochastic, feedback, seed, floor=floor, budget=budget)

    def __str__(self) -> str:
        floor = f",min={self.floor}" if self.floor != DEFAULT_FLOOR else ""
        budget = f",budget={self.budget:g}" if self.budget != DEFAULT_BUDGET else ""
        return (ADAPTIVE + (":stochastic" if self.stochastic else "") + floor + budget
                + (",feedback" if self.feedback else ""))

    @property
    def adapts(self) -> bool:
        return True

    @property
    def start(self) -> int:
        """The width of a message before its first measurement."""
        return max(8, self.floor)

    def at(self, layer: int, direction: str) -> Codec:
        """The fixed-width codec of layer ``layer``'s messages in ``direction`` now (sharing the residuals and
        the error sums): capture it when a message is posted, so that a pipelined flight decodes as it was
        coded."""
        width = self.widths.get((layer, direction), self.start)
        child = self._children.get(width)
        if child is None:
            name = WIDTH_FORMATS[width]
            child = self._children[width] = Codec(name, self.stochastic and name in _INTEGER_BITS, self.feedback,
                                                  self.seed, self.residuals, self.errors)
        return child

    def tightened(self) -> str | None:
        """More bits: the floor raised one width (2 -> 4 -> 8), then fp16 everywhere."""
        if self.floor == 8:
            return "fp16"
        return str(AdaptiveCodec(ADAPTIVE, self.stochastic, self.feedback, self.seed, floor=2 * self.floor,
                                 budget=self.budget))

    def row_bytes(self, width: int) -> int:
        """For a plan made outside the exchanges (the cost model, ``--policy auto``): the mean row over the widths
        in use, or before any is chosen over the floor's and int8's (the 200k synthetic's hidden rows went at
        int4 and its output gradients at int8: 0.60x int8's bytes with feedback, P = 4). A message's own bytes
        are its width's (:meth:`at`)."""
        widths = list(self.widths.values()) or sorted({self.floor, 8})
        return round(sum(Codec(WIDTH_FORMATS[bits]).row_bytes(width) for bits in widths) / len(widths))

    def send(self, rows: torch.Tensor, key: tuple[int, str, int], total: int, positions: np.ndarray | None,
             seed_key: tuple[int, ...] = ()) -> torch.Tensor:
        return self.at(key[0], key[1]).send(rows, key, total, positions, seed_key)

    def encode(self, rows: torch.Tensor, seed_key: tuple[int, ...] = ()) -> torch.Tensor:
        raise TypeError("an adaptive codec codes a message at its layer's width: use at(layer, direction)")

    def decode(self, payload: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
        raise TypeError("an adaptive codec decodes a message at its layer's width: use at(layer, direction)")

    # ---------------------------------------------------------- choosing
    def local_sums(self, keys: list[tuple[int, str]]) -> np.ndarray:
        """This rank's ``(squared error, squared size)`` per key since the last :meth:`choose` (``len(keys) x
        2``, float64; zeros where it sent nothing). Synchronises with the device."""
        assert self.errors is not None
        out = np.zeros((len(keys), 2), dtype=np.float64)
        sent = [row for row, key in enumerate(keys) if key in self.errors]
        if sent:  # one copy from the device for every key
            out[sent] = torch.stack([self.errors[keys[row]] for row in sent]).cpu().numpy()
        return out

    def choose(self, keys: list[tuple[int, str]], totals: np.ndarray) -> dict[tuple[int, str], float]:
        """New widths from the job's sums (``totals``: :meth:`local_sums` summed over every rank); returns the
        measured relative squared error per key that sent anything. The sums start afresh."""
        assert self.errors is not None
        self.errors.clear()
        measured: dict[tuple[int, str], float] = {}
        for key, (error, size) in zip(keys, totals):
            if size <= 0.0:
                continue  # nothing sent: the width stays
            current = self.widths.get(key, self.start)
            relative = measured[key] = float(error / size)
            fitting = [bits for bits in sorted(WIDTH_FORMATS) if bits >= self.floor
                       and relative * (_RELATIVE_STEP[bits] / _RELATIVE_STEP[current]) ** 2 <= self.budget]
            self.widths[key] = fitting[0] if fitting else 16
        return measured


def width_key(text: str) -> tuple[int, str]:
    """``"layer/direction"`` -> ``(layer, direction)``; anything else is refused (ValueError)."""
    layer, _, direction = text.partition("/")
    if not layer.isdigit() or direction not in DIRECTIONS:
        raise ValueError(f"{text!r} is not a layer/direction key")
    return int(layer), direction


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
