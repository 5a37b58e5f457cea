"""Receiver-side dropout inside the SpMM (DESIGN section 4: what never changes is sent once).

Under receiver-side dropout an exchange carries pre-dropout rows and every rank masks what it
multiplies itself, with the same per-global-row masks
(:class:`~sparse_dist.exchange.RowMasks`, carried by ``ExchangeContext.dropout``): its own rows,
the rows it received (or reuses from a cache), and, in the transpose, the summed gradient of its
own rows (``M_g * sum_i A_ig^T dT_i``: every receiver's mask of a row is the same, so the pieces
travel unmasked). Masking time is booked as ``dropout``. On the CPU a mask is applied in one compiled pass
over torch's threads (:mod:`sparse_dist.dropout_kernel`), bitwise torch's ``mul`` or ``masked_fill_``. Local only.
"""

from __future__ import annotations

import numpy as np
import torch

from sparse_dist import dropout_kernel as kernel
from sparse_dist.accounting import ComputeTimer
from sparse_dist.exchange import ExchangeContext

COMPILED_DTYPES = (torch.float32, torch.float64)  # what the compiled dropout passes take


def zero_dropped_(values: torch.Tensor, mask: torch.Tensor) -> None:
    """``values *= mask`` for a boolean ``mask``, in place, with no copy of the mask (an in-place ``mul_`` makes a
    float one on the CPU, as large as ``values``): dropped entries become ``+0``, so it equals the product wherever
    ``values`` is finite. On the CPU one compiled pass over torch's threads; elsewhere ``masked_fill_`` on the
    inverted mask (one byte an entry). Local."""
    if _compiled_pass(values, mask):
        flat = values.view(-1).numpy()
        kernel.apply_mask_threaded(flat, mask.reshape(-1).numpy(), flat, kernel.FILL, torch.get_num_threads())
        return
    values.masked_fill_(mask.logical_not(), 0)


def masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values * mask`` for a boolean ``mask`` (a new tensor, bitwise ``torch.mul``'s): on the CPU one compiled pass
    over torch's threads, without the float copy of the mask. Autograd-aware (``torch.mul``) where ``values``
    needs a gradient. Local."""
    if not _compiled_pass(values, mask):
        return values * mask
    out = torch.empty_like(values)
    kernel.apply_mask_threaded(values.view(-1).numpy(), mask.reshape(-1).numpy(), out.view(-1).numpy(),
                               kernel.MULTIPLY, torch.get_num_threads())
    return out


def _compiled_pass(values: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether the compiled passes take ``values`` and ``mask``: CPU, float32/64, contiguous, one shape, no autograd,
    large enough (:func:`sparse_dist.dropout_kernel.worth`)."""
    return (values.device.type == "cpu" and mask.device.type == "cpu" and values.dtype in COMPILED_DTYPES
            and mask.dtype == torch.bool and values.shape == mask.shape and values.is_contiguous()
            and mask.is_contiguous() and not (values.requires_grad and torch.is_grad_enabled())
            and kernel.worth(values.numel()))


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
            return masked(h, mask)

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
            return masked(rows, mask)

    def own_gradient_(self, out: torch.Tensor, context: ExchangeContext | None) -> None:
        """Mask the summed gradient of this rank's own rows in place (the transpose's last step)."""
        if context is not None and context.dropout is not None:
            mask = context.dropout.own(out)
            with self.timer.measure("dropout", self.device):
                zero_dropped_(out, mask)
