"""Ranks per node and the default thread count of a rank (collective over the world)."""

from __future__ import annotations

import os

from sparse_dist.comm.requests import _start_deferred
from sparse_dist.comm.startup import MPI, _initialised


def ranks_on_this_node() -> int:
    """How many ranks of the world share this node (for a default thread count; collective over the world)."""
    _start_deferred()
    local = _initialised().Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_size()
    finally:
        local.Free()


def default_threads_per_rank() -> int:
    """``SLURM_CPUS_PER_TASK`` if set, else the cores this process may use divided by the ranks on its node.

    Collective over the world: the ranks on this node are counted on every rank, whatever its
    environment says, so a variable set on some ranks only cannot leave others in the split.
    """
    on_node = ranks_on_this_node()
    slurm = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm and slurm.isdigit():
        return int(slurm)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // on_node)
