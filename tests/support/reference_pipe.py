"""Single-process simulation of pipelined stale exchange (PipeGCN / PSC-GCN), for the exactness tests.

Written from the documented rule, on dense matrices, on top of the plain-torch reference
(tests/support/reference_gcn.py; neither imports the project). Nodes are split into row groups; for each
layer that exchanges, ``A = A_in + A_out`` where ``A_in`` holds the entries whose row and column
lie in the same group. The layer's message ``M`` (what an owner sends: ``dropout(H) W`` when the
layer shrinks the width, else ``dropout(H)``; under receiver-side dropout the pre-dropout ``H``,
masked by the multiplying side with the epoch's masks ``K_t``) is used as:

* forward in epoch ``t``: ``Y = A_in (K_t M_t) + A_out (K_t S_t)`` where ``S_t = M_t`` for
  ``t < tau`` and otherwise the message of epoch ``t - tau`` (smoothed: ``S <- g S + (1 - g) M_{t-tau}``,
  started with the first stale message);
* backward: ``dM_t = K_t (A_in^T dY_t + R_t)`` with ``G_t = A_out^T dY_t`` and ``R_t = G_t`` for
  ``t < tau``, else ``G_{t - tau}`` (smoothed alike).

``K`` is all ones under owner-side dropout (the message is already masked). Layer 0 reading a halo
fetched once exchanges nothing, so it is exact.
"""

from __future__ import annotations

import numpy as np
import torch

from reference_gcn import Reference, dropout_keep


class _History:
    """One layer's messages and remote gradients by epoch, and their moving averages."""

    def __init__(self) -> None:
        self.messages: dict[int, torch.Tensor] = {}
        self.gradients: dict[int, torch.Tensor] = {}
        self.message_average: torch.Tensor | None = None
        self.gradient_average: torch.Tensor | None = None


def _stale(table: dict[int, torch.Tensor], epoch: int, tau: int, gamma: float, current: torch.Tensor,
           average: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    if epoch < tau:
        return current, average
    old = table.pop(epoch - tau)
    if gamma == 0:
        return old, average
    average = old.clone() if average is None else gamma * average + (1 - gamma) * old
    return average, average


class _StaleProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, m: torch.Tensor, ref: "PipelinedReference", layer: int,  # type: ignore[override]
                keep: torch.Tensor | None) -> torch.Tensor:
        history = ref.history.setdefault(layer, _History())
        t = ref.epoch
        history.messages[t] = m.detach().clone()
        used, history.message_average = _stale(history.messages, t, ref.tau, ref.gamma, m.detach(),
                                               history.message_average)
        if keep is not None:
            m, used = m * keep, used * keep
        ctx.ref, ctx.layer, ctx.keep = ref, layer, keep
        return ref.a_in @ m + ref.a_out @ used

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        ref, history, t = ctx.ref, ctx.ref.history[ctx.layer], ctx.ref.epoch
        g = ref.a_out.T @ dy
        history.gradients[t] = g.clone()
        used, history.gradient_average = _stale(history.gradients, t, ref.tau, ref.gamma, g,
                                                history.gradient_average)
        dm = ref.a_in.T @ dy + used
        return (dm * ctx.keep if ctx.keep is not None else dm), None, None, None


class PipelinedReference(Reference):
    """:class:`Reference` whose layers exchange ``tau``-stale boundary rows and gradients (see the module).

    ``groups[v]``: the row group owning node ``v``; ``input_once``: layer 0 reads a halo (exact);
    ``receiver``: exchanges carry pre-dropout rows, masked where multiplied.
    """

    def __init__(self, *args, groups: np.ndarray, tau: int, gamma: float = 0.0, input_once: bool = False,
                 receiver: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        same = torch.from_numpy(groups[:, None] == groups[None, :])
        self.a_in = torch.where(same, self.a, torch.zeros_like(self.a))
        self.a_out = self.a - self.a_in
        self.tau, self.gamma, self.input_once, self.receiver = tau, gamma, input_once, receiver
        self.history: dict[int, _History] = {}

    def forward(self, training: bool) -> torch.Tensor:
        if not training:
            return super().forward(training)
        h = self.x
        for index, layer in enumerate(self.params):
            keep, scale = dropout_keep(self.seed, self.epoch, index, h.shape[0], h.shape[1], self.dropout)
            keep = keep.float()
            exchanged = not (index == 0 and self.input_once)
            if not exchanged:
                aggregated = self._propagate(h * keep * scale, layer[-2])
                self_term = (h * keep * scale) @ layer[0] if self.model == "sage" else None
            elif self.receiver:  # pre-dropout rows travel; every product masks with this epoch's masks
                aggregated = (_StaleProduct.apply(h, self, index, keep) * scale) @ layer[-2]
                self_term = (h * keep * scale) @ layer[0] if self.model == "sage" else None
            else:
                dropped = h * keep * scale
                weight = layer[-2]
                if weight.shape[1] < weight.shape[0]:
                    aggregated = _StaleProduct.apply(dropped @ weight, self, index, None)
                else:
                    aggregated = _StaleProduct.apply(dropped, self, index, None) @ weight
                self_term = dropped @ layer[0] if self.model == "sage" else None
            h = aggregated + layer[-1] if self_term is None else self_term + aggregated + layer[-1]
            if index < len(self.params) - 1:
                h = torch.relu(h)
        return h
