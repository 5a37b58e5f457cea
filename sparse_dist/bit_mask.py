"""Boolean masks kept for a backward at one bit an entry instead of torch's byte.

The grid's layers keep, per ReLU and per dropped input, a mask as large as an activation block
(:mod:`sparse_dist.grid_gcn`, :mod:`algorithms.grid_dropout`); as ``torch.bool`` each costs a quarter of the
float32 block, packed an eighth of that. Packing is exact (the same bits come back) and pure (no communication).
On the CPU it is numpy's ``packbits``/``unpackbits`` on the tensor's own memory; on other devices torch's shifts
(the same little-endian layout: entry ``8 k + j`` is bit ``j`` of byte ``k``).
"""

from __future__ import annotations

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
        if self.bits.device.type == "cpu":
            flat = np.unpackbits(self.bits.numpy(), count=self.numel, bitorder="little").view(np.bool_)
            return torch.from_numpy(flat).view(self.shape)
        return unpack_with_shifts(self.bits, self.numel).view(self.shape)


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


__all__ = ["PackedMask", "pack_with_shifts", "unpack_with_shifts"]
