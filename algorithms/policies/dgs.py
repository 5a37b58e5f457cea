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

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from algorithms.hashing import uniforms
from algorithms.layers import layer_type
from algorithms.policies.base import (EpochWork, PolicyBase, RunShape, TrainingParts, doubled_share,
                                      per_edge_refusal)
from algorithms.policies.dgs_explainer import Explainer, MaskedHalo
from algorithms.policies.registry import PolicyKind
from sparse_dist import state_checks as checks
from sparse_dist.importance import EdgeProblem

_SALT = 0x444753  # "DGS": its uniforms apart from the other policies' hashes of the same rows
FEATURE_STREAM = 1 << 62  # the stream of the feature columns' uniforms: the same on every rank (no row group has it)


@dataclass
class DgsSampler(PolicyBase):
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
    samples: ClassVar[bool] = True
    per_receiver: ClassVar[bool] = True
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

    def refusal(self, run: RunShape) -> str | None:
        problem = per_edge_refusal(run)
        if problem is not None:
            return problem
        if run.dropout_side == "receiver":
            return ("explains with the rows its layers exchanged, which must be the rows it multiplies when "
                    "explaining: use --dropout-side owner or auto")
        if layer_type(run.model).takes_operator:  # attention exchanges [Z | s], not the rows A multiplies
            return f"explains GCN and SAGE layers (their exchange is A H), not --layer-kind {run.model}"
        return None

    def epoch_work(self, parts: TrainingParts) -> EpochWork | None:
        return DgsExplanations(self, parts)

    def tightened(self, run: RunShape) -> str | None:
        """Twice the node share (features too, where sampled); from ``nodes >= 0.5`` on, exact."""
        nodes = doubled_share(self.nodes)
        if nodes is None:
            return None
        features = min(1.0, 2.0 * self.features)
        return f"{self.name}:nodes={nodes:g},features={features:g},every={self.every},steps={self.steps}"

    def resume_drops(self) -> str | None:
        return ("dgs node probabilities and last received rows (the starting ones until the next explanation; "
                "its feature probabilities are kept)")


class DgsExplanations(EpochWork):
    """DGS in training: an explanation every ``every`` epochs (booked as ``explain``; collective: one allreduce
    of the feature masks), and this epoch's feature columns on layer 0's input. The feature probabilities
    are the same on every rank (replicated state, kept at any ``P``); the node probabilities and the rows
    the explanations read are per rank."""

    booked = ("explain",)

    def __init__(self, sampler: DgsSampler, parts: TrainingParts) -> None:
        self.sampler, self.parts = sampler, parts
        plan = parts.spmm.plan
        self.last_rows = parts.spmm.lifecycle.sampling.last_rows
        self.explainer = Explainer(sampler, self._masked_forward, plan.local_block, plan.exact_pairs.remote_block,
                                   self.last_rows, int(sum(plan.exact_pairs.recv_rows)), parts.col_comm)

    def _masked_forward(self, features: torch.Tensor, spmm: Any, nodes: torch.Tensor) -> torch.Tensor:
        """The model in evaluation mode with its remote rows and input columns masked, layer 0 from the halo
        where there is one."""
        parts = self.parts
        halo = MaskedHalo(parts.halo, nodes) if parts.halo is not None else None
        return parts.model(parts.layer_input * features, spmm, first_row=parts.first_row, epoch=parts.epoch,
                           training=False, halo=halo)

    def before_epoch(self, epoch: int) -> dict[str, Any]:
        if not self.sampler.recomputes(epoch):
            return {}
        parts = self.parts
        with parts.spmm.timer.measure("explain", parts.device):  # collective: one allreduce of feature masks
            return {"explanation": self.explainer.explain(parts.layer_input.shape[1])}

    def layer_input(self, epoch: int, halo: Any, values: torch.Tensor) -> tuple[Any, torch.Tensor]:
        scale = self.sampler.feature_scale(epoch, values.shape[1])
        return halo, values * torch.from_numpy(scale).to(values.dtype).to(values.device)

    def state(self) -> dict[str, Any]:
        feature_p = self.sampler.feature_p
        return {"feature_p": None if feature_p is None else torch.from_numpy(np.array(feature_p, copy=True))}

    def load_state(self, state: dict[str, Any]) -> None:
        if state.get("feature_p") is not None:
            self.sampler.feature_p = state["feature_p"].numpy().copy()

    def rank_state(self) -> dict[str, Any]:
        node_p = self.sampler.node_p
        return {"explanation": {"node_p": None if node_p is None else torch.from_numpy(np.array(node_p, copy=True)),
                                "last_rows": {layer: values.cpu() for layer, values in self.last_rows.items()}}}

    def load_rank_state(self, state: dict[str, Any], device: torch.device) -> None:
        explanation = state.get("explanation")
        if explanation is None:
            return
        node_p = explanation["node_p"]
        if node_p is not None:
            node_p = checks.tensor(node_p, "dgs' node probabilities", dims=1, floating=True)
            if node_p.numel() and (float(node_p.min()) < 0.0 or float(node_p.max()) > 1.0):
                raise checks.StateError("dgs' node probabilities lie outside [0, 1]")
        last_rows = {checks.count(layer, "a dgs layer"): checks.rows(values, f"dgs' last rows of layer {layer}")
                     for layer, values in explanation["last_rows"].items()}
        self.sampler.node_p = None if node_p is None else node_p.numpy().copy()
        self.last_rows.clear()  # the strategy's dict, which the explainer holds too
        self.last_rows.update({layer: values.to(device) for layer, values in last_rows.items()})


KINDS = (PolicyKind("dgs", "sample", {"nodes": float, "features": float, "every": int, "steps": int},
                    lambda seed, **params: DgsSampler(seed=seed, **params),
                    "dgs:nodes=R[,features=Q,every=10,steps=20] with 0 < R, Q <= 1"),)
