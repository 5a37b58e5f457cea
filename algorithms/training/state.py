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
from algorithms.training.bit_widths import STATE_KEY as BIT_WIDTHS, state_problem as bit_widths_state_problem
from algorithms.training.steering import state_problem as steering_state_problem
from algorithms.training.tighten import ActivePolicies


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
    if run.steering is not None:  # when exact evaluations are due: a resumed run decides as the uninterrupted one
        state["steering"] = run.steering.state_dict()
    return state


def _tensors_problem(found: Any, template: dict[str, torch.Tensor], what: str) -> str | None:
    """Why ``found`` is not a mapping of exactly ``template``'s names to finite tensors of the same shapes and
    dtypes, or None (one clause naming the first tensor that differs)."""
    if not isinstance(found, dict) or set(found) != set(template):
        names = sorted(map(str, found)) if isinstance(found, dict) else type(found).__name__
        return f"{what} holds {_shown_names(names)}, this model has {_shown_names(sorted(template))}"
    for name, mine in template.items():
        theirs = found[name]
        if not isinstance(theirs, torch.Tensor) or theirs.shape != mine.shape or theirs.dtype != mine.dtype:
            shape = (f"{tuple(theirs.shape)} {theirs.dtype}" if isinstance(theirs, torch.Tensor)
                     else type(theirs).__name__)
            return f"{what} {name!r} is {shape}, this model's is {tuple(mine.shape)} {mine.dtype}"
        if theirs.is_floating_point() and not bool(torch.isfinite(theirs).all()):
            return f"{what} {name!r} holds non-finite values"
    return None


def _shown_names(names: Any) -> str:
    text = repr(names)
    return text if len(text) <= 80 else text[:77] + "..."


def replicated_state_problem(run: TrainingRun, state: dict[str, Any]) -> str | None:
    """Why a checkpoint's replicated state (checksum passed, fingerprint matched) cannot be loaded into this run,
    or None: weights and Adam's moments of other names, shapes or dtypes than this model's, an epoch that is
    not a count, a random-number state of another size, kept guard weights that are not this model's, a
    steering state that is not numbers, bit widths that are not widths.
    A checksum stops damage, not an author who rewrites it; this stops what would otherwise reach
    ``load_state_dict`` as a traceback."""
    template = run.model.state_dict()
    problem = _tensors_problem(state.get("model"), template, "weight")
    if problem:
        return problem
    epoch = state.get("epoch")
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        return f"epoch {epoch!r}, expected an integer >= 0"
    rng, mine = state.get("torch_rng"), torch.get_rng_state()
    if not isinstance(rng, torch.Tensor) or rng.dtype != mine.dtype or rng.shape != mine.shape:
        return "random-number state of another shape or type than torch's"
    for key, check in (("steering", steering_state_problem), (BIT_WIDTHS, bit_widths_state_problem)):
        if state.get(key) is not None:
            problem = check(state[key])
            if problem:
                return problem
    kept = state.get("guard_kept")
    if isinstance(kept, dict) and "model" in kept:
        problem = _tensors_problem(kept["model"], template, "kept guard weight")
        if problem:
            return problem
    optimizer = state.get("optimizer")
    parameters = [p for group in run.optimizer.param_groups for p in group["params"]]
    if not isinstance(optimizer, dict) or not isinstance(optimizer.get("state"), dict):
        return "Adam state missing"
    for key, values in optimizer["state"].items():
        if not isinstance(key, int) or not 0 <= key < len(parameters) or not isinstance(values, dict):
            return f"Adam state for parameter {key!r}, this model has {len(parameters)}"
        moments = {name: values.get(name) for name in ("exp_avg", "exp_avg_sq")}
        shape = parameters[key].detach()
        problem = _tensors_problem(moments, {"exp_avg": shape, "exp_avg_sq": shape}, f"Adam moment of parameter {key}")
        step = values.get("step")
        if problem or not isinstance(step, torch.Tensor) or step.numel() != 1:
            return problem or f"Adam step of parameter {key} is not a scalar tensor"
    return None


def load_replicated_state(run: TrainingRun, state: dict[str, Any]) -> None:
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.epoch = int(state["epoch"])
    torch.set_rng_state(state["torch_rng"])
    run.guard.load_state_dict(state)
    if run.steering is not None and state.get("steering") is not None:  # none: the next step evaluates first
        run.steering.load_state_dict(state["steering"])
    if run.guard.state.policies is not None:  # the guard had tightened: train on with what it chose
        run.install_policies(ActivePolicies.from_record(run.guard.state.policies))
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


class CheckpointState:
    """The checkpoint face of a :class:`TrainingRun` (the trainer mixes it in): each method is this module's
    function of the run."""

    def state(self) -> dict[str, Any]:
        """The replicated state, the same on every rank and at any ``P``."""
        return replicated_state(self)

    def written_at(self) -> dict[str, Any]:
        return written_at(self)

    def load_state(self, state: dict[str, Any]) -> None:
        load_replicated_state(self, state)

    @property
    def has_policy_state(self) -> bool:
        """Whether this run keeps per-rank exchange state that a checkpoint must save (same on every rank)."""
        return keeps_rank_state(self)

    def policy_state(self) -> dict[str, Any]:
        """This rank's policy state (caches and versions); per rank, unlike :meth:`state` (collective: kept
        flights complete first)."""
        return rank_state(self)

    def load_policy_state(self, state: dict[str, Any]) -> None:
        load_rank_state(self, state)

    def policy_mismatch(self, state: dict[str, Any]) -> str | None:
        return rank_state_mismatch(self, state)

    def mismatch(self, state: dict[str, Any]) -> str | None:
        """Why a checkpoint does not belong to this run (the differing fields, both values), or None."""
        return state_mismatch(self, state)
