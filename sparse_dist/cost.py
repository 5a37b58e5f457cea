"""Alpha-beta cost of MPICH's collectives, and the network presets the performance model uses.

``alpha`` seconds per message, ``beta`` seconds per byte, on-node (``intra``)
and off-node (``inter``); off-node bandwidth is shared by the ranks of a node
behind each NIC. MPICH's algorithms: broadcast of ``m`` bytes over ``g``
ranks is binomial, ``ceil(log2 g) (alpha + m beta)``, below 12 KiB and
scatter + ring allgather, ``(ceil(log2 g) + g - 1) alpha + 2 (g-1)/g m beta``,
above; reduce is costed as a broadcast; allreduce is recursive doubling
below 2 KiB and Rabenseifner, ``2 ceil(log2 g) alpha + 2 (g-1)/g m beta``,
above; alltoallv costs ``alpha`` per peer plus ``beta`` times the larger of
the bytes sent and received. Each exchange plan (:mod:`sparse_dist.plans`)
prices its own exchange with these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BCAST_SHORT = 12288   # MPICH: binomial broadcast below this many bytes
ALLREDUCE_SHORT = 2048  # MPICH: recursive doubling below this many bytes


@dataclass(frozen=True)
class Network:
    """Alpha-beta figures of one machine kind (seconds, seconds per byte)."""

    name: str
    alpha_intra: float
    beta_intra: float
    alpha_inter: float
    beta_inter: float
    ranks_per_node: int = 1
    nics_per_node: int = 1
    cores_per_node: int = 1
    note: str = ""
    machine_cores: int | None = None  # an emulated cluster: all ranks of a run share this many cores of one machine

    def link(self, group_size: int) -> tuple[float, float]:
        """(alpha, beta) of a collective over ``group_size`` consecutive ranks placed ``ranks_per_node`` a node.

        Off-node traffic of all ranks on a node shares its NICs: the share of a rank's bytes that
        leaves the node, ``(g - q)/(g - 1)``, runs at ``beta_inter * q / nics``.
        """
        q = min(self.ranks_per_node, group_size)
        if group_size <= self.ranks_per_node:
            return self.alpha_intra, self.beta_intra
        off_node = (group_size - q) / (group_size - 1)
        return self.alpha_inter, max(self.beta_intra, self.beta_inter * q / self.nics_per_node * off_node)


# Documented defaults. shm: this 2-core machine (MPICH shared memory), from `sparse-dist bench network`.
# The rest are typical published figures, assumed and not measured here.
NETWORKS: dict[str, Network] = {
    "shm": Network("shm", 5.4e-6, 1 / 6.6e9, 5.4e-6, 1 / 6.6e9, ranks_per_node=1_000_000, cores_per_node=2,
                   note="one node, MPICH shared memory: alpha 5.4 us, 6.6 GB/s measured on the 2-core "
                        "development machine by `mpiexec -n 2 sparse-dist bench network`"),
    "ib-hdr": Network("ib-hdr", 0.5e-6, 1 / 20e9, 1.5e-6, 1 / 23e9, ranks_per_node=2, nics_per_node=1,
                      cores_per_node=64,
                      note="CPU nodes, 2 sockets x 32 cores, one HDR InfiniBand NIC (200 Gb/s, ~23 GB/s)"),
    "ib-ndr": Network("ib-ndr", 0.5e-6, 1 / 20e9, 1.2e-6, 1 / 46e9, ranks_per_node=2, nics_per_node=1,
                      cores_per_node=64,
                      note="CPU nodes, 2 sockets x 32 cores, one NDR InfiniBand NIC (400 Gb/s, ~46 GB/s)"),
    "nvlink-hdr": Network("nvlink-hdr", 2.0e-6, 1 / 150e9, 2.5e-6, 1 / 23e9, ranks_per_node=4, nics_per_node=4,
                          cores_per_node=64,
                          note="GPU nodes, 4 GPUs on NVLink (~150 GB/s a GPU), one HDR NIC per GPU"),
}



def log2_steps(g: int) -> int:
    return math.ceil(math.log2(g)) if g > 1 else 0


def _collective(size: float, group: int, net: Network, short: int, long_steps: int) -> float:
    """MPICH's two regimes: a tree of ``ceil(log2 g)`` steps below ``short`` bytes, else ``long_steps``
    latencies plus ``2 (g-1)/g`` of the message per rank (scatter / reduce-scatter + ring allgather)."""
    if group <= 1 or size <= 0:
        return 0.0
    alpha, beta = net.link(group)
    if size < short:
        return log2_steps(group) * (alpha + size * beta)
    return long_steps * alpha + 2.0 * (group - 1) / group * size * beta


def bcast_time(size: float, group: int, net: Network) -> float:
    return _collective(size, group, net, BCAST_SHORT, log2_steps(group) + group - 1)


def allreduce_time(size: float, group: int, net: Network) -> float:
    return _collective(size, group, net, ALLREDUCE_SHORT, 2 * log2_steps(group))


def alltoallv_time(sent: np.ndarray, received: np.ndarray, peers: np.ndarray, group: int, net: Network) -> float:
    """Slowest rank: alpha per peer plus beta times the larger of its bytes sent and received."""
    if group <= 1:
        return 0.0
    alpha, beta = net.link(group)
    return float(np.max(peers * alpha + np.maximum(sent, received) * beta))
