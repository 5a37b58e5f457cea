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


__all__ = ["load_rank_state", "rank_state", "rank_state_mismatch", "reference_reading"]
