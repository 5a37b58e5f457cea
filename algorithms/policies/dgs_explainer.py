"""DGS's online explanation (:mod:`algorithms.policies.dgs`): the masks learnt on one rank, and the halo view
its layer 0 reads. The objective and the probabilities it sets are described in the dgs module's docstring.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from algorithms.optim import Adam
from algorithms.water_fill import water_fill
from sparse_dist.exchange import ExchangeContext


class MaskedHalo:
    """A static halo (:class:`sparse_dist.halo.StaticHalo`) whose halo rows are scaled by ``node_mask`` (the
    explainer's layer 0: the halo rows are the receive rows, in the same ascending global order)."""

    def __init__(self, halo: Any, node_mask: torch.Tensor) -> None:
        self.halo, self.halo_ids, self.count = halo, halo.halo_ids, halo.count
        self.scale = torch.cat([torch.ones(halo.own_count, dtype=node_mask.dtype, device=node_mask.device),
                                node_mask])[:, None]

    def multiply(self, h: torch.Tensor, context: ExchangeContext) -> torch.Tensor:
        return self.halo.multiply(h * self.scale, context)


def binary_entropy(p: torch.Tensor) -> torch.Tensor:
    q = p.clamp(1e-6, 1 - 1e-6)
    return -(q * q.log() + (1 - q) * (1 - q).log())


class Explainer:
    """DGS's online explanation on one rank (see the module docstring for the objective).

    ``forward(x, spmm, halo)`` is the model's forward in evaluation mode (no dropout) over this rank's input
    ``x`` (own rows, or own then halo rows) with a given SpMM; ``local_block`` is ``A_gg``, ``remote_block`` the
    rank's rows of ``A`` over the exact receive buffer (both torch CSR, columns as the rows they multiply);
    ``last_rows[layer]`` the latest rows that arrived for each exchanging layer. :meth:`explain` is collective
    over ``comm`` (one allreduce of the feature masks).
    """

    LAMBDA_NODE = 0.5
    LAMBDA_FEATURE = 0.5
    LAMBDA_ENTROPY = 0.1
    LEARNING_RATE = 0.1

    def __init__(self, sampler: Any, forward: Callable[..., torch.Tensor], local_block: torch.Tensor | None,
                 remote_block: torch.Tensor, last_rows: dict[int, torch.Tensor], remote_count: int, comm: Any) -> None:
        self.sampler, self._forward = sampler, forward
        self.local_block, self.remote_block, self.last_rows = local_block, remote_block, last_rows
        self.remote_count, self.comm = remote_count, comm

    def _spmm(self, node_mask: torch.Tensor) -> Callable[[torch.Tensor, ExchangeContext], torch.Tensor]:
        def spmm(h: torch.Tensor, context: ExchangeContext) -> torch.Tensor:
            out = torch.sparse.mm(self.local_block, h) if self.local_block is not None else torch.zeros_like(h)
            rows = self.last_rows.get(context.layer)
            if rows is not None and self.remote_count:
                if rows.shape[1] != h.shape[1]:
                    raise RuntimeError(f"dgs: layer {context.layer} exchanged {rows.shape[1]} columns in training "
                                       f"but multiplies {h.shape[1]} when explaining")
                out = out + torch.sparse.mm(self.remote_block, rows * node_mask[:, None])
            return out
        return spmm

    def explain(self, width: int) -> dict[str, float]:
        """Learn the masks, set the sampler's probabilities; returns the final loss and mask means (collective)."""
        sampler, device = self.sampler, self.remote_block.device
        logits_of = lambda nodes, features: self._forward(features, self._spmm(nodes), nodes)  # noqa: E731
        with torch.no_grad():
            target = logits_of(torch.ones(self.remote_count, device=device),
                               torch.ones(width, device=device)).argmax(dim=1)
        node_logit = torch.ones(self.remote_count, device=device, dtype=torch.float64, requires_grad=True)
        feature_logit = torch.ones(width, device=device, dtype=torch.float64, requires_grad=True)
        optimizer = Adam([{"params": [node_logit, feature_logit]}], lr=self.LEARNING_RATE)  # no torch._dynamo
        loss = torch.zeros(())
        for _ in range(sampler.steps):
            nodes, features = torch.sigmoid(node_logit), torch.sigmoid(feature_logit)
            logits = logits_of(nodes.to(self.remote_block.dtype), features.to(self.remote_block.dtype))
            fit = F.cross_entropy(logits, target) if logits.shape[0] else logits.sum() * 0
            mass = self.LAMBDA_NODE * nodes.mean() if self.remote_count else 0.0
            spread = binary_entropy(nodes).mean() if self.remote_count else 0.0
            loss = (fit + mass + self.LAMBDA_FEATURE * features.mean()
                    + self.LAMBDA_ENTROPY * (spread + binary_entropy(features).mean()))
            node_logit.grad, feature_logit.grad = torch.autograd.grad(loss, [node_logit, feature_logit],
                                                                      allow_unused=True)
            if node_logit.grad is None:
                node_logit.grad = torch.zeros_like(node_logit)
            optimizer.step()
        nodes = torch.sigmoid(node_logit).detach().cpu().numpy()
        features = torch.sigmoid(feature_logit).detach().double().cpu()
        self.comm.allreduce_(features, "sample")  # every rank samples the same columns: the mean mask
        features = features.numpy() / self.comm.size
        sampler.node_p = (water_fill(np.array([0, nodes.size]), nodes, np.array([sampler.nodes * nodes.size]))
                          if nodes.size else nodes)
        sampler.feature_p = water_fill(np.array([0, width]), features, np.array([sampler.features * width]))
        return {"loss": float(loss.detach()), "node_mask": float(nodes.mean()) if nodes.size else math.nan,
                "feature_mask": float(features.mean())}
