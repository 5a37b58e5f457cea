"""Adam for the single-process references, as Kingma & Ba write it (Algorithm 1), with L2 weight decay added
to the gradient per parameter group, as ``torch.optim.Adam`` does.

Written from the paper, not from the project nor from torch's optimiser: ``torch.optim.Adam.step`` imports
``torch._dynamo`` (about a second of CPU in every process that builds a reference). The project's own Adam is
held bitwise to ``torch.optim.Adam`` in ``tests/unit/algorithms/test_optim.py``; here the two agree to rounding.
"""

from __future__ import annotations

from typing import Any

import torch


class TextbookAdam:
    """``groups``: ``[{"params": [...], "weight_decay": w}, ...]``; ``zero_grad`` sets gradients to None."""

    def __init__(self, groups: list[dict[str, Any]], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8) -> None:
        self.groups = [(list(group["params"]), float(group.get("weight_decay", 0.0))) for group in groups]
        self.lr, (self.beta1, self.beta2), self.eps = lr, betas, eps
        self.steps = 0
        self.moments = {id(p): (torch.zeros_like(p), torch.zeros_like(p)) for params, _ in self.groups for p in params}

    def zero_grad(self) -> None:
        for params, _ in self.groups:
            for p in params:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        for params, decay in self.groups:
            for p in params:
                if p.grad is None:
                    continue
                g = p.grad + decay * p if decay else p.grad
                m, v = self.moments[id(p)]
                m.mul_(self.beta1).add_(g, alpha=1 - self.beta1)
                v.mul_(self.beta2).addcmul_(g, g, value=1 - self.beta2)
                m_hat = m / (1 - self.beta1 ** self.steps)
                v_hat = v / (1 - self.beta2 ** self.steps)
                p.sub_(self.lr * m_hat / (v_hat.sqrt() + self.eps))
