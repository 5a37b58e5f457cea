"""Receiver-side dropout inside the SpMM (DESIGN section 4: what never changes is sent once).

Under receiver-side dropout an exchange carries pre-dropout rows and every rank masks what it
multiplies itself, with the same per-global-row masks
(:class:`~sparse_dist.exchange.RowMasks`, carried by ``ExchangeContext.dropout``): its own rows,
the rows it received (or reuses from a cache), and, in the transpose, the summed gradient of its
own rows (``M_g * sum_i A_ig^T dT_i``: every receiver's mask of a row is the same, so the pieces
travel unmasked). Masking time is booked as ``dropout``. Local only.
"""

from __future__ import annotations

import numpy as np
import torch

from sparse_dist.accounting import ComputeTimer
from sparse_dist.exchange import ExchangeContext


def zero_dropped_(values: torch.Tensor, mask: torch.Tensor) -> None:
    """``values *= mask`` for a boolean ``mask``, in place, without the float copy of the mask an in-place ``mul_``
    makes on the CPU (as large as ``values``: at a layer's peak a transient of its whole output); the inverted mask
    it makes instead is one byte an entry. Equal to the product wherever ``values`` is finite. Local."""
    values.masked_fill_(mask.logical_not(), 0)


class ReceiverDropout:
    """The masks one operator applies to what it multiplies (a no-op for a context without ``dropout``)."""

    def __init__(self, timer: ComputeTimer, device: torch.device, plan_name: str) -> None:
        self.timer, self.device, self.plan_name = timer, device, plan_name

    def own_rows(self, h: torch.Tensor, context: ExchangeContext | None) -> torch.Tensor:
        """What this rank multiplies its own block by: ``h``, masked under receiver-side dropout."""
        if context is None or context.dropout is None:
            return h
        mask = context.dropout.own(h)
        with self.timer.measure("dropout", self.device):
            return h * mask

    def received_rows(self, rows: torch.Tensor, global_rows: np.ndarray | range | None,
                      context: ExchangeContext | None) -> torch.Tensor:
        """Received (or cached) rows as multiplied: masked by the receiver under receiver-side dropout.

        A new tensor: the receive buffer stays pre-dropout, so a cache that keeps it means something
        in the next epoch.
        """
        if context is None or context.dropout is None or rows.shape[0] == 0:
            return rows
        if global_rows is None:
            raise RuntimeError(f"the {self.plan_name} plan was built without row_masks=True, so it cannot apply "
                               f"receiver-side dropout (it does not know the received rows' global ids)")
        mask = context.dropout.of_rows(global_rows, rows)
        with self.timer.measure("dropout", self.device):
            return rows * mask

    def own_gradient_(self, out: torch.Tensor, context: ExchangeContext | None) -> None:
        """Mask the summed gradient of this rank's own rows in place (the transpose's last step)."""
        if context is not None and context.dropout is not None:
            mask = context.dropout.own(out)
            with self.timer.measure("dropout", self.device):
                zero_dropped_(out, mask)
