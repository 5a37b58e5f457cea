"""A run's checkpoint state: the replicated part (weights, Adam, epoch, RNG, fingerprint, the policies' shared
state) written once, and the per-rank part (strategy caches, codec residuals, the policies' own) per rank.

The replicated part is the same on every rank and at any ``P`` (weights and Adam state are replicated, dropout
masks and sampling decisions are counter-based per global row), so it resumes at any world size, replication
and plan; the per-rank part only at the layout that wrote it (:func:`written_at`).
"""

from __future__ import annotations

from typing import Any

import torch

from algorithms.checkpoint import checkpoint_mismatch
from algorithms.training.assembly import TrainingRun
from algorithms.training.tighten import ActivePolicies, install


def written_at(run: TrainingRun) -> dict[str, Any]:
    """What per-rank policy state depends on: world size, replication and plan."""
    return {"world_size": run.comm.size, "replication": run.config.replication, "plan": run.config.plan}


def graph_identity(run: TrainingRun) -> dict[str, Any]:
    return {"name": run.graph.name, "nodes": run.graph.layout.n_rows}


def replicated_state(run: TrainingRun) -> dict[str, Any]:
    """Everything needed to continue exactly, the same on every rank: weights, optimiser, epoch, RNG,
    fingerprint, where it was written, and each policy work's shared state (e.g. dgs' ``feature_p``)."""
    state = {"model": run.model.state_dict(), "optimizer": run.optimizer.state_dict(), "epoch": run.epoch,
             "torch_rng": torch.get_rng_state(), "config": run.config.fingerprint(), "graph": graph_identity(run),
             "written_at": written_at(run)}
    for work in run.work:
        state.update(work.state())
    state.update(run.guard.state_dict())
    return state


def load_replicated_state(run: TrainingRun, state: dict[str, Any]) -> None:
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.epoch = int(state["epoch"])
    torch.set_rng_state(state["torch_rng"])
    run.guard.load_state_dict(state)
    if run.guard.state.policies is not None:  # the guard had tightened: train on with what it chose
        install(run, ActivePolicies.from_record(run.guard.state.policies))
    for work in run.work:
        work.load_state(state)


def keeps_rank_state(run: TrainingRun) -> bool:
    """Whether this run keeps per-rank exchange state (caches) that a checkpoint must save; decided by the
    configuration alone, so it is the same on every rank."""
    return run.spmm.lifecycle.keeps_state or (run.codec is not None and run.codec.feedback)


def rank_state(run: TrainingRun) -> dict[str, Any]:
    """This rank's policy state (strategy caches and versions, codec residuals, each work's own)."""
    state = {"rank": run.comm.rank, "world_size": run.comm.size, "epoch": run.epoch,
             "strategy": run.spmm.lifecycle.state_dict(),
             "codec": run.codec.state_dict() if run.codec is not None else None}
    for work in run.work:
        state.update(work.rank_state())
    return state


def load_rank_state(run: TrainingRun, state: dict[str, Any]) -> None:
    run.spmm.lifecycle.load_state_dict(state["strategy"])
    if run.codec is not None and state.get("codec") is not None:
        run.codec.load_state_dict(state["codec"], run.device)
    for work in run.work:
        work.load_rank_state(state, run.device)


def rank_state_mismatch(run: TrainingRun, state: dict[str, Any]) -> str | None:
    expected = (run.comm.rank, run.comm.size, run.epoch)
    found = (state.get("rank"), state.get("world_size"), state.get("epoch"))
    if found != expected:
        return f"policy state is for (rank, world size, epoch) {found}, this run needs {expected}"
    return None


def state_mismatch(run: TrainingRun, state: dict[str, Any]) -> str | None:
    """Why a checkpoint does not belong to this run (the differing fields, both values), or None."""
    return checkpoint_mismatch(state, run.config.fingerprint(), graph_identity(run))
