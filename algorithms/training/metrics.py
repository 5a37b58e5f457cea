"""What a training step and an evaluation report: byte and time counters, the loss, accuracy and micro-F1.

The loss is summed over the rank's local training rows (the caller divides by the GLOBAL number of training
rows, so that the gradients summed over ranks equal the single-process gradient). Evaluation counts are
summed over the replica column (the ``G`` ranks holding distinct rows): collective over ``col_comm``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from sparse_dist.comm import Communicator

SPLITS = ("train", "val", "test")
TIMED_PARTS = ("local_spmm", "masks", "dropout", "optimizer")  # a step's compute parts (policies add theirs)


def bytes_by_phase(counters: dict[str, dict[str, float]]) -> dict[str, dict[str, int]]:
    """Bytes per phase (``sent``, ``recv``) from :meth:`CommStats.snapshot` counters (or their difference)."""
    return {phase: {"sent": int(d["bytes_sent"]), "recv": int(d["bytes_recv"])} for phase, d in counters.items()}


def counters_since(comm: Communicator, before: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """This rank's communication counters (bytes, seconds, calls per phase) since they read ``before``."""
    after = comm.stats.snapshot()
    return {phase: {key: after[phase][key] - before[phase][key] for key in after[phase]} for phase in after}


def moved_since(comm: Communicator, before: dict[str, dict[str, float]]) -> dict[str, dict[str, int]]:
    """Bytes per phase this rank moved since the counters read ``before``."""
    return bytes_by_phase(counters_since(comm, before))


def own_and_wait(counters: dict[str, dict[str, float]], phases: tuple[str, ...]) -> tuple[float, float]:
    """Seconds in MPI over ``phases`` split into the rank's own (posting, copies, the transfer) and its wait for
    late partners (``wait_seconds``, see "Waits" in :mod:`sparse_dist.comm`); the two add up to the total."""
    waited = sum(counters[phase]["wait_seconds"] for phase in phases)
    return sum(counters[phase]["seconds"] for phase in phases) - waited, waited


def step_breakdown(comm: Communicator, before: dict[str, dict[str, float]], wall: float,
                   computed: dict[str, float], booked: tuple[str, ...]) -> dict[str, Any]:
    """A step's ``time`` and ``bytes`` per phase. ``time``: ``total`` (wall), the ``booked`` compute parts,
    ``exchange`` (this rank's own seconds in the SpMM exchanges, forward and backward: posting, copies and the
    transfer once its partners had posted), ``exchange_wait`` (its seconds in them waiting for partners that had
    not posted yet: imbalance), ``allreduce`` and ``allreduce_wait`` the same for the gradient allreduce, and
    ``dense`` the rest; the parts add up to ``total``."""
    delta = counters_since(comm, before)
    parts = {key: computed.get(key, 0.0) for key in booked}
    parts["exchange"], parts["exchange_wait"] = own_and_wait(delta, ("forward", "backward"))
    parts["allreduce"], parts["allreduce_wait"] = own_and_wait(delta, ("grad_allreduce",))
    return {"time": {"total": wall, **parts, "dense": max(wall - sum(parts.values()), 0.0)},
            "bytes": bytes_by_phase(delta)}


def local_loss_sum(logits: torch.Tensor, rows: torch.Tensor, labels: torch.Tensor, multilabel: bool,
                   num_classes: int) -> torch.Tensor:
    """Cross-entropy (BCE per class for multi-label) summed over this rank's training ``rows``."""
    picked = logits.index_select(0, rows)  # fixed rows: no mask-to-index search per epoch
    if multilabel:
        return F.binary_cross_entropy_with_logits(picked, labels, reduction="sum") / num_classes
    return F.cross_entropy(picked, labels, reduction="sum")


def split_metrics(logits: torch.Tensor, labels: torch.Tensor, masks: dict[str, torch.Tensor], multilabel: bool,
                  global_counts: dict[str, int], col_comm: Communicator) -> dict[str, float]:
    """Accuracy per split (micro-F1 for multi-label), global: counts summed over ``col_comm`` (collective)."""
    if multilabel:
        predicted = logits > 0
        truth = labels > 0.5
        counts = []
        for split in SPLITS:
            mask = masks[split]
            p, t = predicted[mask], truth[mask]
            counts += [int((p & t).sum()), int((p & ~t).sum()), int((~p & t).sum())]
        totals = col_comm.allgather_array(np.array(counts, dtype=np.int64)).sum(axis=0)
        result = {}
        for k, split in enumerate(SPLITS):
            tp, fp, fn = totals[3 * k:3 * k + 3]
            result[f"{split}_f1"] = float(2 * tp / max(2 * tp + fp + fn, 1))
        return result
    correct = logits.argmax(dim=1) == labels
    counts_array = np.array([int(correct[masks[s]].sum()) for s in SPLITS], dtype=np.int64)
    totals = col_comm.allgather_array(counts_array).sum(axis=0)
    return {f"{split}_acc": float(totals[k] / max(global_counts[split], 1)) for k, split in enumerate(SPLITS)}
