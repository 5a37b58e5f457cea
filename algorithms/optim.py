"""Adam with ``torch.optim.Adam``'s arithmetic and state format, without importing ``torch._dynamo``.

``torch.optim.Adam.step`` (torch 2.13) imports ``torch._dynamo`` on every call, compiled or not: about
1 s of CPU and some 2,000 modules per process, paid by every rank at start-up (an import storm on a
parallel file system at scale, and most of a short run's start-up). The trainer never compiles its
optimiser, so this class does the same update without it:

* the single-tensor path of ``torch.optim.Adam`` (``foreach=False``, not fused, not capturable, no
  amsgrad, not maximising), op for op, so a CPU run is bitwise what ``torch.optim.Adam`` gives (on CUDA
  torch would choose its foreach path, whose rounding may differ in the last bit);
* L2 weight decay added to the gradient per parameter group (``weight_decay``), as ``Adam`` does;
* ``state_dict()`` / ``load_state_dict()`` in ``torch.optim.Adam``'s format (``step`` a float32 scalar
  tensor, ``exp_avg``, ``exp_avg_sq``; parameters numbered across the groups in order), so checkpoints
  written before this class existed still load, and the other way round.

Not collective: every rank steps its replicated weights alike after the gradient allreduce.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["Adam"]

_GROUP_DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False, "maximize": False,
                   "foreach": None, "capturable": False, "differentiable": False, "fused": None,
                   "decoupled_weight_decay": False}


class Adam:
    """``torch.optim.Adam(groups, lr=lr)`` for plain (non-amsgrad) training; see the module docstring."""

    def __init__(self, groups: list[dict[str, Any]], lr: float) -> None:
        self.param_groups: list[dict[str, Any]] = []
        for group in groups:
            params = list(group["params"])
            if not params:
                raise ValueError("an Adam parameter group needs at least one parameter")
            self.param_groups.append({**_GROUP_DEFAULTS, "lr": lr, **group, "params": params})
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def _parameters(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero (or drop) every parameter's gradient, as ``Optimizer.zero_grad``."""
        for p in self._parameters():
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One Adam update of every parameter that has a gradient."""
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state.get(param)
                if state is None:
                    state = self.state[param] = {
                        "step": torch.tensor(0.0, dtype=torch.float32),
                        "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format)}
                grad = param.grad
                step_t, exp_avg, exp_avg_sq = state["step"], state["exp_avg"], state["exp_avg_sq"]
                step_t += 1
                if weight_decay != 0:
                    grad = grad.add(param, alpha=weight_decay)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                step = step_t.item()
                bias_correction1 = 1 - beta1**step
                bias_correction2 = 1 - beta2**step
                step_size = lr / bias_correction1
                bias_correction2_sqrt = bias_correction2**0.5
                denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
                param.addcdiv_(exp_avg, denom, value=-step_size)

    def reset_moments(self) -> None:
        """Forget every parameter's moments and step count: the next step is a fresh Adam's first."""
        self.state = {}

    def state_dict(self) -> dict[str, Any]:
        """``torch.optim.Adam.state_dict()``'s layout: parameters numbered in group order."""
        index = {p: i for i, p in enumerate(self._parameters())}
        groups, first = [], 0
        for group in self.param_groups:
            count = len(group["params"])
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": list(range(first, first + count))})
            first += count
        state = {index[p]: dict(values) for p, values in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take a state written by :meth:`state_dict` or by ``torch.optim.Adam`` (the same groups)."""
        saved = state_dict["param_groups"]
        if [len(g["params"]) for g in saved] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError("the optimizer state has other parameter groups than this model")
        parameters = self._parameters()
        ids = [i for group in saved for i in group["params"]]
        self.state = {}
        for position, saved_id in enumerate(ids):
            values = state_dict["state"].get(saved_id)
            if values is None:
                continue
            param = parameters[position]
            self.state[param] = {"step": values["step"].detach().to(torch.float32).cpu().clone(),
                                 "exp_avg": values["exp_avg"].detach().to(param.device, param.dtype).clone(),
                                 "exp_avg_sq": values["exp_avg_sq"].detach().to(param.device, param.dtype).clone()}
        for group, old in zip(self.param_groups, saved):
            group.update({k: v for k, v in old.items() if k != "params"})
