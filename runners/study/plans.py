"""A study's plans as `train` flags: the 1D plans (``--plan NAME``) and the process grid (``grid:X,Y,Z`` or
``grid:auto``, run as ``train --grid``), which combinations a study skips and why."""

from __future__ import annotations

from algorithms.policies import PolicySpec
from runners.perf.grid_model import GRID_PLAN, is_grid_plan, parse_grid_plan


def plan_flags(plan: str) -> list[str]:
    """The `train` flags of a study plan: ``--plan NAME``, or ``--grid X,Y,Z`` / ``--grid auto`` for
    ``grid:X,Y,Z`` / ``grid:auto``."""
    return ["--grid", plan[len(GRID_PLAN):]] if is_grid_plan(plan) else ["--plan", plan]


def plan_refusal(plan: str, policy: PolicySpec, compress: str) -> str | None:
    """Why a study skips ``policy`` with ``compress`` on ``plan``, in one sentence, or None: a 1D plan's own
    refusal (:meth:`PolicySpec.refusal`); the process grid runs exact and uncoded (``train --grid``)."""
    if not is_grid_plan(plan):
        return policy.refusal(plan)
    if not policy.is_exact:
        return "the process grid runs exact (sampling and staleness thin or age a 1D halo exchange)"
    return "the process grid's allreduces are not coded" if compress != "none" else None


def grid_misfit(plan: str, ranks: int, replication: int) -> str | None:
    """Why a grid plan does not run at ``ranks`` and ``replication`` (None for 1D plans and fitting grids)."""
    if not is_grid_plan(plan):
        return None
    if replication != 1:
        return "the process grid is the layout; it takes no replication"
    shape = parse_grid_plan(plan)
    return None if shape is None or shape.size == ranks else f"X * Y * Z = {shape.size}, not P"


__all__ = ["grid_misfit", "plan_flags", "plan_refusal"]
