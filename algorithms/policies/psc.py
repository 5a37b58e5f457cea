"""PSC-GCN's variance-reduction neighbour sampling (``psc``): per-edge probabilities from the closed form.

Paper: "On Pipelined GCN with Communication-Efficient Sampling and Inclusion-Aware Caching" (PSC-GCN),
section IV. Row ``i`` keeps every neighbour on its own rank (they cost no byte) and each boundary neighbour
``j`` with probability ``p_ij``, scaling the kept entry by ``1 / p_ij``, so ``E[T_i] = sum_j A_ij H_j``
(Eq. 15). The boundary probabilities minimise the rescaled variance of every layer's aggregation (Eq. 17)::

    min  sum_j (1/p_ij - 1) ||y_ij||^2    s.t.  sum_j p_ij = B_i = budget * |boundary N_i|,  0 < p_ij <= 1

over row ``i``'s boundary neighbours, with ``||y_ij|| = |A_ij| c_j``, ``c_j^2 = sum_l ||m_j^(l)||^2`` over the
rows ``m^(l)`` that each exchanging layer multiplies (the latest this rank saw: a boundary row whenever it
arrived; a boundary row never seen counts as the mean of those seen). The KKT solution (Theorem 2) is
water-filling: with ``v_ij = |A_ij| c_j`` sorted descending, the ``m`` largest get ``p = 1`` and the rest
``p_ij = (B_i - m) v_ij / sum_{uncapped} v``, ``m`` the smallest count for which that is at most 1
(:func:`algorithms.water_fill.water_fill`). A row's diagonal entry (its self-loop) is always kept.

Why inner neighbours are not sampled (the paper samples them too, weighted ``a_inner`` above boundary ones,
inside one budget of ``budget * |N_i|``): a dropped inner neighbour saves no byte and adds variance. At
``budget=0.1`` the paper's form plateaued 3 points below exact on Cora and CiteSeer and a point below on a
held-out 22k-node social graph, its training loss 2.7x exact's, without ever falling (variance, not bias: one
epoch's layer-1 output lay 1.69 times exact's norm from exact on Cora at P = 2; bns:keep=0.1: 0.22). Keeping
the inner neighbours whole (this form), the loss after 200 epochs was 0.369 against exact's 0.358, for 29%
more bytes than the paper's form at the same budget (its boundary entries had had less than ``budget``).
Probabilities are recomputed every ``every`` epochs; until the first recomputation every boundary edge has
``budget``
(Algorithm 2's initialisation).

Sampling, with one uniform per column (:meth:`PscSampler.uniforms`): in epoch ``e`` a rank draws
``u_j = U(seed, e, its row group, j)`` for every column ``j`` it uses and keeps entry ``(i, j)`` iff
``u_j < p_ij``. Each entry's marginal is exactly ``p_ij`` (so the estimator is unbiased, as with
independent draws, and each row's variance is the same, since a row holds each column once), and column
``j`` is needed iff ``u_j < q_j = max_i p_ij``: the owner, told ``q_j`` (rounded up to float32) once per
recomputation, sends exactly the needed rows with no per-epoch request. ``q_j`` is also the inclusion
probability of row ``j`` that the feature cache ranks by. The strategy that samples and agrees is
:class:`sparse_dist.importance.ImportanceStrategy`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch

from algorithms.hashing import uniforms
from algorithms.policies.base import (EpochWork, PolicyBase, RunShape, TrainingParts, doubled_share,
                                      per_edge_refusal)
from algorithms.policies.registry import PolicyKind
from algorithms.water_fill import water_fill
from sparse_dist.csr import entry_rows
from sparse_dist.halo import CachedInput
from sparse_dist.importance import EdgeProblem

_SALT = 0x505343  # "PSC": its uniforms apart from BNS's hashes of the same rows


@dataclass(frozen=True)
class PscSampler(PolicyBase):
    """``psc:budget=B[,every=K][,cache=C]`` (see the module docstring).

    ``budget``: the expected share of each row's boundary neighbours kept (``epsilon``; inner ones are all kept); ``cache``: the share of this
    rank's boundary rows whose first-layer features it keeps (-1: no feature cache; layer 0 then follows
    ``--input-exchange`` like any sampler's).
    """

    budget: float
    every: int = 10
    cache: float = -1.0
    seed: int = 0
    name: str = "psc"
    side: str = "receiver"
    per_edge: bool = True
    samples: ClassVar[bool] = True
    per_receiver: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not 0.0 < self.budget <= 1.0:
            raise ValueError(f"psc: budget must lie in (0, 1], got {self.budget}")
        if self.every < 1:
            raise ValueError(f"psc: every must be >= 1 epoch, got {self.every}")
        if not (self.cache == -1.0 or 0.0 <= self.cache <= 1.0):
            raise ValueError(f"psc: cache must lie in [0, 1] (a share of the boundary rows), got {self.cache}")

    @property
    def p(self) -> float:
        """The expected kept share (what byte models and the exact-path test use)."""
        return self.budget

    @property
    def feeds_layer0(self) -> bool:  # type: ignore[override]
        """With a feature cache it gives layer 0 its input (:class:`PscFeatureCache`)."""
        return self.cache >= 0

    def refusal(self, run: RunShape) -> str | None:
        problem = per_edge_refusal(run)
        if problem is None and self.feeds_layer0 and run.input_exchange != "auto":
            problem = (f"feeds layer 0 from its feature cache; --input-exchange {run.input_exchange} contradicts "
                       f"it (leave it at auto)")
        return problem

    def epoch_work(self, parts: TrainingParts) -> EpochWork | None:
        return PscFeatureCache(self, parts) if self.feeds_layer0 else None

    def tightened(self, run: RunShape) -> str | None:
        """Twice the budget (the other parameters kept); from ``budget >= 0.5`` on, every neighbour (exact)."""
        budget = doubled_share(self.budget)
        if budget is None:
            return None
        return f"{self.name}:budget={budget:g},every={self.every},cache={self.cache:g}"

    def resume_drops(self) -> str | None:
        return "psc sampling probabilities (the starting ones until the next recomputation)"

    def recomputes(self, epoch: int) -> bool:
        """Whether probabilities are recomputed at the start of ``epoch`` (never before the first epoch's rows)."""
        return epoch > 0 and epoch % self.every == 0

    def probabilities(self, problem: EdgeProblem) -> np.ndarray:
        """``p`` per entry of this rank's rows (:class:`~sparse_dist.importance.EdgeProblem`): 1 on the diagonal
        and on inner columns; on boundary columns the closed form from ``|A_ij|`` and the column norm ``c_j``,
        ``budget`` everywhere before any norm is known."""
        indptr, whole = problem.indptr, problem.diagonal | problem.inner
        if problem.column_norms is None:
            return np.where(whole, 1.0, self.budget)
        importance = np.abs(problem.values) * problem.column_norms
        sampled = ~whole
        rows = entry_rows(indptr)
        sampled_indptr = np.concatenate(([0], np.cumsum(np.bincount(rows[sampled], minlength=indptr.size - 1))))
        p = np.ones(problem.values.size)
        p[sampled] = water_fill(sampled_indptr, importance[sampled], self.budget * np.diff(sampled_indptr))
        return p

    def uniforms(self, epoch: int, stream: int, global_columns: np.ndarray) -> np.ndarray:
        """``u_j``: one ``U[0, 1)`` per column, the same on the owner and the receiver (:mod:`algorithms.hashing`)."""
        return uniforms(self.seed, epoch, stream, global_columns, salt=_SALT)


class PscFeatureCache(EpochWork):
    """``cache=C``: layer 0 reads the kept boundary rows of ``X`` and fetches the others when sampled
    (:class:`sparse_dist.halo.CachedInput`; built here, collective over the plan's column)."""

    def __init__(self, sampler: PscSampler, parts: TrainingParts) -> None:
        self.sampler = sampler
        self.cached_input = CachedInput(parts.spmm.plan, parts.spmm.lifecycle.sampling, parts.layer_input)

    def input_exchange(self, choice: Any, spec: str, requested: str) -> Any:
        return replace(choice, mode="cache", requested=requested,
                       reason=f"{spec}: the share {self.sampler.cache} of boundary rows of highest inclusion "
                              f"probability kept, the others fetched when sampled")

    def layer_input(self, epoch: int, halo: Any, values: torch.Tensor) -> tuple[Any, torch.Tensor]:
        self.cached_input.load(epoch)  # collective: the rows of X this epoch's sample needs
        return self.cached_input, self.cached_input.values

    def after_epoch(self) -> dict[str, Any]:
        """This rank's boundary rows the epoch's sample needed, and of them cached."""
        return {"feature_cache": {"needed": self.cached_input.needed, "hits": self.cached_input.hits}}

    def memory(self) -> dict[str, int] | None:
        return self.cached_input.memory()


KINDS = (PolicyKind("psc", "sample",
                    {"budget": float, "every": int, "cache": float},
                    lambda seed, **params: PscSampler(seed=seed, **params),
                    "psc:budget=B[,every=10,cache=C] with 0 < B <= 1, 0 <= C <= 1"),)
