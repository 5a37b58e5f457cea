"""DGS: explanation-guided sampling of remote rows and of input feature columns, for full-graph training.

Paper: DGS (IEEE 2022), "locality- and explanation-guided node and feature-level sampling". Every ``every``
epochs each rank learns, on its own partition and the boundary rows it already holds, two soft masks with a
GNNExplainer-style objective (:class:`Explainer`), turns them into sampling probabilities, and samples
remote rows and first-layer feature columns with them until the next explanation.

The objective (per rank, the model's weights frozen, no dropout): with ``sigma(m_j)`` scaling the rows of
remote node ``j`` in every layer's aggregation and ``sigma(f_k)`` scaling input column ``k`` of every row,

    L(m, f) = mean_i CE(Phi_{m,f}(i), yhat_i) + lam_node mean_j sigma(m_j) + lam_feature mean_k sigma(f_k)
              + lam_entropy (mean_j H(sigma(m_j)) + mean_k H(sigma(f_k)))

where ``i`` runs over the rank's own rows, ``yhat_i`` is the unmasked model's prediction, and ``H`` the
binary entropy (it pushes masks towards 0 or 1). "Keep the local predictions, penalise mask mass": DGS's
explanation of its pooled local subgraph node, written over all local rows. ``E`` Adam steps (learning
rate 0.1) from ``m = f = 1`` (``sigma = 0.73``). Remote rows come from the rows that last arrived (with
sampling, a row arrives only when sampled: its last value; never: zero); layer 0 read from a halo uses the
halo's rows. The explanation's wall time is booked as ``explain`` in the epoch breakdown.

Probabilities: node ``j`` is kept with ``r_j``, the water-filling of :func:`algorithms.water_fill.water_fill`
over the importances ``sigma(m_j)`` with budget ``nodes * |remote rows|`` (so ``r_j`` is proportional to the
mask, capped at 1, and at least a small floor: every row stays possible, the estimator unbiased); column
``k`` with ``s_k``, the same over the ranks' MEAN ``sigma(f_k)`` (one allreduce of ``F_0`` floats per
explanation, phase ``sample``: every rank uses the same columns) with budget ``features * F_0``. Until the
first explanation, ``r = nodes`` and ``s = features`` everywhere (uniform sampling).

Per epoch ``e``: remote row ``j`` is kept iff ``u_j < r_j`` (``u_j = U(seed, e, receiver group, j)``, the same
on owner and receiver, who agree ``r`` once per explanation in the strategy's alltoallv; no second
exchange), its entries scaled by ``1 / r_j``; local rows are never sampled. Column ``k`` is kept iff
``v_k < s_k`` (``v_k = U(seed, e, 2^62, k)``, the same on every rank), scaled by ``1 / s_k``: layer 0's input
is ``X * c_e`` with ``c_e[k] = [v_k < s_k] / s_k`` (unbiased for ``X`` per entry). On the wire, the node
sampling saves bytes in every exchanging layer; the feature sampling changes what layer 0 multiplies
but not what travels here (``X``'s rows travel once in a halo, or as ``X W``), unlike DGS's per-batch
feature fetch.

``nodes = features = 1`` is the exact path. ``p2p`` at ``c = 1``, owner-side dropout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from algorithms.hashing import uniforms
from algorithms.water_fill import water_fill
from sparse_dist.exchange import ExchangeContext
from sparse_dist.importance import EdgeProblem

_SALT = 0x444753  # "DGS": its uniforms apart from the other policies' hashes of the same rows
FEATURE_STREAM = 1 << 62  # the stream of the feature columns' uniforms: the same on every rank (no row group has it)


@dataclass
class DgsSampler:
    """``dgs:nodes=R,features=Q[,every=T][,steps=E]`` (see the module docstring). Holds the probabilities of
    the last explanation (``node_p`` per exact receive row, ``feature_p`` per input column)."""

    nodes: float
    features: float = 1.0
    every: int = 10
    steps: int = 20
    seed: int = 0
    name: str = "dgs"
    side: str = "receiver"
    per_edge: bool = True
    keeps_rows: bool = True  # the strategy keeps the latest received rows: the explainer reads them
    explains: bool = True
    node_p: np.ndarray | None = field(default=None, repr=False)
    feature_p: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for key in ("nodes", "features"):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise ValueError(f"dgs: {key} must lie in (0, 1], got {getattr(self, key)}")
        if self.every < 1 or self.steps < 1:
            raise ValueError(f"dgs: every and steps must be >= 1, got {self.every} and {self.steps}")

    @property
    def budget(self) -> float:
        return self.nodes

    @property
    def p(self) -> float:
        return self.nodes

    def recomputes(self, epoch: int) -> bool:
        return epoch > 0 and epoch % self.every == 0

    def probabilities(self, problem: EdgeProblem) -> np.ndarray:
        """Local entries 1; a remote entry its column's ``r`` (``nodes`` before the first explanation)."""
        p = np.ones(problem.values.size)
        remote = ~problem.inner
        p[remote] = self.nodes if self.node_p is None else self.node_p[problem.columns[remote] - problem.own_columns]
        return p

    def uniforms(self, epoch: int, stream: int, global_columns: np.ndarray) -> np.ndarray:
        return uniforms(self.seed, epoch, stream, global_columns, salt=_SALT)

    def feature_scale(self, epoch: int, width: int) -> np.ndarray:
        """``c_e``: per input column ``1 / s_k`` where kept in ``epoch``, else 0 (the same on every rank)."""
        s = self.feature_p if self.feature_p is not None else np.full(width, self.features)
        kept = self.uniforms(epoch, FEATURE_STREAM, np.arange(width)) < s
        return np.where(kept, 1.0 / s, 0.0)


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

    def __init__(self, sampler: DgsSampler, forward: Callable[..., torch.Tensor], local_block: torch.Tensor | None,
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
        optimizer = torch.optim.Adam([node_logit, feature_logit], lr=self.LEARNING_RATE)
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
