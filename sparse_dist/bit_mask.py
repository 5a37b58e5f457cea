"""Boolean masks kept for a backward at one bit an entry instead of torch's byte.

The grid's layers keep, per ReLU and per dropped input, a mask as large as an activation block
(:mod:`sparse_dist.grid_gcn`, :mod:`algorithms.grid_dropout`); as ``torch.bool`` each costs a quarter of the
float32 block, packed an eighth of that. Packing is exact (the same bits come back) and pure (no communication).
On the CPU it is numpy's ``packbits``/``unpackbits`` on the tensor's own memory; on other devices torch's shifts
(the same little-endian layout: entry ``8 k + j`` is bit ``j`` of byte ``k``).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

_SHIFTS = tuple(range(8))


@dataclass(frozen=True)
class PackedMask:
    """A boolean tensor of ``shape`` held as ``ceil(numel / 8)`` bytes (``bits``, uint8, on the mask's device)."""

    bits: torch.Tensor
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @classmethod
    def of(cls, mask: torch.Tensor) -> "PackedMask":
        """Pack the boolean ``mask`` (any shape, contiguous or not)."""
        if mask.dtype != torch.bool:
            raise TypeError(f"a packed mask is made of a boolean tensor, got {mask.dtype}")
        flat = mask.reshape(-1)
        if flat.device.type == "cpu":
            bits = torch.from_numpy(np.packbits(flat.numpy(), bitorder="little"))
        else:
            bits = pack_with_shifts(flat)
        return cls(bits, tuple(mask.shape))

    def unpack(self) -> torch.Tensor:
        """The boolean mask again (a new tensor of :attr:`shape`)."""
        return _unpacked(self.bits, self.numel).view(self.shape)

    def multiply_(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (contiguous, of :attr:`shape`, on the mask's device) times the mask, in place: the bits of
        :data:`PIECE` entries unpacked at a time, so no whole boolean mask stands beside ``values`` (the same
        values as ``values * unpack()``). Returns ``values``."""
        if tuple(values.shape) != self.shape or not values.is_contiguous():
            raise ValueError(f"a mask of shape {self.shape} multiplies a contiguous tensor of its shape, "
                             f"got {tuple(values.shape)}")
        flat = values.view(-1)
        for lo in range(0, self.numel, PIECE):
            hi = min(lo + PIECE, self.numel)
            flat[lo:hi].mul_(_unpacked(self.bits[lo // 8:(hi + 7) // 8], hi - lo))
        return values


_FRESH: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


def fresh_gradient(grad: torch.Tensor) -> torch.Tensor:
    """Mark ``grad``, an input gradient a grid backward has just made and hands to autograd, as one that nothing
    else reads: :func:`masked_gradient` may mask it in place. Returns ``grad``."""
    _FRESH[id(grad)] = grad
    return grad


def masked_gradient(mask: PackedMask, grad: torch.Tensor) -> torch.Tensor:
    """An autograd backward's ``grad * mask``: in place where ``grad`` is a :func:`fresh_gradient` (contiguous,
    outside any graph), so that no second block stands beside it at the backward's peak; on a copy otherwise (a
    gradient a caller handed to ``backward()`` is never changed)."""
    if _FRESH.get(id(grad)) is not grad or not grad.is_contiguous() or grad.requires_grad:
        grad = grad.contiguous().clone()
    return fresh_gradient(mask.multiply_(grad))


PIECE = 1 << 20
"""Entries :meth:`PackedMask.multiply_` unpacks at a time (a multiple of 8: a piece starts on a byte)."""


def _unpacked(bits: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` entries of ``bits`` as a 1-D boolean tensor: numpy's on the CPU, torch's shifts
    elsewhere."""
    if bits.device.type == "cpu":
        return torch.from_numpy(np.unpackbits(bits.numpy(), count=count, bitorder="little").view(np.bool_))
    return unpack_with_shifts(bits, count)


def pack_with_shifts(flat: torch.Tensor) -> torch.Tensor:
    """``flat`` (1-D boolean) packed with torch's shifts, little-endian within a byte (any device)."""
    pad = (-flat.numel()) % 8
    lanes = flat.view(torch.uint8)
    if pad:
        lanes = torch.cat([lanes, lanes.new_zeros(pad)])
    lanes = lanes.view(-1, 8)
    bits = lanes[:, 0].clone()
    for shift in _SHIFTS[1:]:
        bits |= lanes[:, shift] << shift
    return bits


def unpack_with_shifts(bits: torch.Tensor, numel: int) -> torch.Tensor:
    """The first ``numel`` entries of :func:`pack_with_shifts`'s ``bits``, as a 1-D boolean tensor."""
    shifts = torch.tensor(_SHIFTS, dtype=torch.uint8, device=bits.device)
    return ((bits[:, None] >> shifts) & 1).view(-1)[:numel].bool()


__all__ = ["PIECE", "PackedMask", "fresh_gradient", "masked_gradient", "pack_with_shifts", "unpack_with_shifts"]
