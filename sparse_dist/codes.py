"""How a compressed message's values become bytes and back (the helpers of :mod:`sparse_dist.compress`): a
row's peak, packing integer codes of fewer than 8 bits, viewing 16-bit halves, powers of two, squared norms."""

from __future__ import annotations

import torch



def row_peak(rows: torch.Tensor) -> torch.Tensor:
    """Each row's largest magnitude (``r x 1``; 0 for a zero-width row)."""
    if not rows.shape[1]:
        return rows.new_zeros(rows.shape[0], 1)
    # max |x| as |max(max x, -min x)|: no |rows|-sized temporary (torch.aminmax along a dimension is an order of
    # magnitude slower on CPU than the two reductions); the outer abs makes a zero row's peak +0.0, not -0.0
    return torch.maximum(rows.amax(dim=1, keepdim=True), rows.amin(dim=1, keepdim=True).neg()).abs_()


def squared_norm(values: torch.Tensor) -> torch.Tensor:
    """``sum(values^2)`` in float64 (no temporary of ``values``' size: a work buffer is contiguous)."""
    flat = values.reshape(-1)
    return torch.dot(flat, flat).to(torch.float64)


def levels(bits: int) -> int:
    """The largest code magnitude of a signed integer format of ``bits`` bits: ``2^(bits - 1) - 1``."""
    return (1 << (bits - 1)) - 1


def packed_width(width: int, bits: int) -> int:
    """Bytes ``width`` codes of ``bits`` bits fill (the last byte padded)."""
    return -(-width * bits // 8)


def pack(codes: torch.Tensor, bits: int, out: torch.Tensor) -> None:
    """Write integral ``codes`` (``r x F`` floats in ``[-L, L]``, ``L = levels(bits)``) into ``out`` (``r x
    packed_width(F, bits)`` bytes), ``8 / bits`` codes a byte, the first in the lowest bits, each as ``code + L``."""
    per = 8 // bits
    rows, width = codes.shape
    if not out.shape[1]:
        return
    shifted = torch.zeros(rows, out.shape[1] * per, dtype=torch.uint8, device=codes.device)
    shifted[:, :width] = codes + levels(bits)  # in [0, 2 L]: integral, so the cast is exact
    grouped = shifted.view(rows, out.shape[1], per)
    packed = grouped[:, :, 0].clone()
    for slot in range(1, per):
        packed.bitwise_or_(grouped[:, :, slot].bitwise_left_shift(bits * slot))
    out.copy_(packed)


def unpacked(packed: torch.Tensor, width: int, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """The codes :func:`pack` wrote (``r x width``, ``dtype``, in ``[-L, L]``)."""
    per, top = 8 // bits, levels(bits)
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    slots = packed.unsqueeze(-1).bitwise_right_shift(shifts).bitwise_and_((1 << bits) - 1)
    return slots.reshape(packed.shape[0], -1)[:, :width].to(dtype).sub_(top)


def halves(part: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``part`` (``r x 2F`` payload bytes) seen as ``r x F`` 16-bit values of ``dtype``, without a copy; a
    zero-width part has no bytes to view, so a zero-width tensor stands in."""
    if part.shape[1]:
        return part.view(dtype)
    return part.new_empty(part.shape[0], 0, dtype=dtype)


def power_of_two(exponent: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``2^exponent`` in ``dtype`` (exact for the row exponents fp16 uses, which keep both 2^k and 2^-k normal)."""
    return torch.ldexp(torch.ones(exponent.shape, dtype=dtype, device=exponent.device), exponent.to(torch.int32))
