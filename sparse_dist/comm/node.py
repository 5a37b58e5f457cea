"""Ranks per node, whether a communicator spans nodes, and the default thread count of a rank."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from sparse_dist.comm.requests import _start_deferred
from sparse_dist.comm.startup import MPI, _initialised

if TYPE_CHECKING:
    from sparse_dist.comm.communicator import Communicator


def _on_my_node(mpi_comm: Any) -> int:
    """How many ranks of ``mpi_comm`` share this rank's node (collective over ``mpi_comm``)."""
    _start_deferred()
    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_size()
    finally:
        local.Free()


def ranks_on_this_node() -> int:
    """How many ranks of the world share this node (for a default thread count; collective over the world)."""
    return _on_my_node(_initialised())


def spans_nodes(comm: Communicator) -> bool:
    """Whether some rank of ``comm`` is on another node than this one (collective over ``comm``).

    The same answer on every rank: if any two ranks share no node, no rank's node holds them all.
    """
    return _on_my_node(comm._comm) < comm.size


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
