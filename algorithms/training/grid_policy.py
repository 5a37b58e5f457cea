"""What the grid trainer (:mod:`algorithms.training.grid_trainer`) needs for a compressed run: the guard's bias
reading on the grid, and the codec's residuals as per-rank checkpoint state.

On the grid the only policy is compression (``--compress``, :mod:`sparse_dist.grid_links`): sampling and staleness
thin or age a halo the grid does not have. The guard watches a compressed grid run as it watches a 1D one: its
falls rules read the step's loss and every evaluation (exact, whatever the codec), and its bias signal compares
the step's coded forward with an exact forward of the same weight blocks and dropout masks
(:func:`reference_reading`), every few epochs within its budget (:mod:`algorithms.training.bias`). A tightening
replaces the codec (int8 -> fp16 -> none), restores the kept blocks after a collapse and starts Adam afresh.

Collective: :func:`reference_reading` over the whole grid (the exact forward's allreduces, the loss's, the classes',
one allgather of the counts), entered by every rank at the same step.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from algorithms.training import bias
from algorithms.training.alongside import EvaluationShare
from algorithms.training.metrics import counters_since
from algorithms.training.tighten import ActivePolicies
from sparse_dist.compress import Codec
from sparse_dist.grid_gcn import GridCrossEntropy, predicted_classes


@torch.no_grad()
def reference_reading(run: Any, policy_logits: torch.Tensor, policy_loss: float, dropout: Any,
                      share: EvaluationShare) -> bias.SameWeights:
    """The bias signal's reading of the step ``run`` just computed (before its optimiser step): the exact forward
    of the same blocks and masks, its loss and both forwards' validation accuracy, global. Its wall seconds and
    counters go to ``share``, so the step's own figures leave them out. Collective over the grid."""
    before, start = run.comm.stats.snapshot(), time.perf_counter()
    layer = run.config.layers - 1
    exact = run.forward_logits([tuple(block.detach() for block in blocks) for blocks in run.weight_blocks()], dropout)
    exact_loss = GridCrossEntropy.apply(exact, run.labels, run.masks["train"], run.class_lo,
                                        run.global_counts["train"], run.grid, layer)
    mask, truth = run.masks["val"], run.labels[run.masks["val"]]
    classes = [predicted_classes(logits, run.class_lo, run.grid, layer) for logits in (policy_logits, exact)]
    counts = [int((predicted[mask] == truth).sum()) if run.counts_rows else 0 for predicted in classes]
    totals = run.comm.allgather_array(np.array(counts, dtype=np.int64)).sum(axis=0)
    share.add(time.perf_counter() - start, counters_since(run.comm, before))
    size = max(run.global_counts["val"], 1)
    return bias.SameWeights(policy_loss, float(exact_loss), float(totals[0]) / size, float(totals[1]) / size)


def rank_state(run: Any) -> dict[str, Any]:
    """This rank's per-rank state: the codec's error-feedback residuals (keyed by layer, direction, message and
    stage of :func:`sparse_dist.grid_links.coded_allreduce`)."""
    return {"rank": run.comm.rank, "world_size": run.comm.size, "epoch": run.epoch, "plan": run.config.plan,
            "codec": run.codec.state_dict() if run.codec is not None else None}


def load_rank_state(run: Any, state: dict[str, Any]) -> None:
    if run.codec is not None and state.get("codec") is not None:
        run.codec.load_state_dict(state["codec"], run.device)


def rank_state_mismatch(run: Any, state: dict[str, Any]) -> str | None:
    """Why ``state`` is not this rank's at this epoch on this grid, or None."""
    expected = (run.comm.rank, run.comm.size, run.epoch, run.config.plan)
    found = (state.get("rank"), state.get("world_size"), state.get("epoch"), state.get("plan"))
    if found != expected:
        return f"policy state is for (rank, world size, epoch, plan) {found}, this run needs {expected}"
    return None


class GridPolicyState:
    """The guard's and the checkpoint's face of a grid run (the grid trainer mixes it in): what the guard keeps and
    restores (this rank's weight blocks), its tightening (fresh moments, a new codec) and the codec's residuals as
    per-rank state. Expects the trainer's ``_cut``, ``block_optimizer``, ``codec``, ``policies`` and ``config``."""

    _cut: dict[tuple[int, str], torch.Tensor]
    block_optimizer: Any
    codec: Codec | None
    policies: Any
    config: Any

    def _kept_state(self) -> dict[str, Any]:
        """What the guard keeps of the best evaluation: this rank's weight blocks (local; the moments start
        afresh at a tightening)."""
        return {"blocks": {key: block.detach().clone() for key, block in self._cut.items()}}

    def restore_kept(self, kept: dict[str, Any]) -> None:
        """Load the weight blocks the guard kept (local: every holder of a block kept the same values)."""
        with torch.no_grad():
            for key, block in self._cut.items():
                block.copy_(kept["blocks"][key])

    def fresh_moments(self) -> None:
        """Start Adam's moments of the blocks afresh (the guard's tightening)."""
        self.block_optimizer.reset_moments()

    def install_policies(self, policies: ActivePolicies) -> None:
        """Train with ``policies`` (on the grid: a compression or none) from the next step on; the old codec's
        residuals go with it."""
        self.codec = Codec.parse(policies.compress, seed=self.config.seed)
        self.policies = policies

    @property
    def has_policy_state(self) -> bool:
        """Whether this run keeps per-rank state a checkpoint must save: error-feedback residuals."""
        return self.codec is not None and self.codec.feedback

    def policy_state(self) -> dict[str, Any]:
        return rank_state(self)

    def load_policy_state(self, state: dict[str, Any]) -> None:
        load_rank_state(self, state)

    def policy_mismatch(self, state: dict[str, Any]) -> str | None:
        return rank_state_mismatch(self, state)


__all__ = ["GridPolicyState", "load_rank_state", "rank_state", "rank_state_mismatch", "reference_reading"]
