"""Ranks x threads on a node: the splits of a node's cores and the epoch the cost model gives each.

A node of ``C`` cores runs ``r`` ranks of ``t = C / r`` threads each (:func:`node_splits`: every divisor ``r``).
More ranks a node shrink every rank's rows (and its compute) but add exchanges between them; fewer ranks leave the
rows whole and lean on torch's threads, whose speed is not linear in ``t`` (a step's elementwise passes, its
Python and its synchronisations do not split). :func:`predict_epoch` prices compute linearly in cores, so a split
here scales the calibration's per-core rates by the split's **efficiency**: the seconds of one unit of a layer's
work (SpMM, then the dense products and passes) on one thread of an otherwise idle node, divided by ``t`` times the
seconds of that unit when ``r`` copies run at once with ``t`` threads each (all the node's cores busy, as in the
job). It covers both losses, threads that do not scale and ranks that share the node's memory bandwidth. It is
measured on the node, relative to the calibration run's own split (:mod:`runners.node_split_probe`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping

from runners.perf.cost_model import ExpectedTraffic, ModelShape, Prediction, Rates, Workload, predict_epoch
from sparse_dist.cost import Network


@dataclass(frozen=True, order=True)
class NodeSplit:
    """``ranks_per_node`` ranks of ``threads`` threads on one node."""

    ranks_per_node: int
    threads: int

    def __str__(self) -> str:
        return f"{self.ranks_per_node} x {self.threads}"


@dataclass(frozen=True)
class Efficiency:
    """A split's compute speed per core against the calibration's, for the SpMM and for the dense work."""

    spmm: float
    dense: float


@dataclass(frozen=True)
class SplitEpoch:
    """One split's predicted epoch on ``nodes`` nodes (``ranks`` = nodes x ranks per node)."""

    split: NodeSplit
    ranks: int
    efficiency: Efficiency
    prediction: Prediction


def node_splits(cores: int) -> list[NodeSplit]:
    """Every ``r x (cores / r)`` with ``r`` dividing ``cores``, fewest ranks first."""
    return [NodeSplit(ranks, cores // ranks) for ranks in range(1, cores + 1) if cores % ranks == 0]


def efficiency_of(seconds: Mapping[NodeSplit, tuple[float, float]], alone: tuple[float, float],
                  calibration: NodeSplit) -> dict[NodeSplit, Efficiency]:
    """Efficiencies (module docstring) from probe seconds: ``seconds[split]`` = (SpMM, dense) seconds of one unit
    when the split runs its ranks at once, ``alone`` one thread's on an idle node; relative to ``calibration``'s
    (a split in ``seconds``, or ``1 x 1``: efficiency 1)."""
    def raw(split: NodeSplit) -> tuple[float, float]:
        if split == NodeSplit(1, 1):
            return 1.0, 1.0
        spmm, dense = seconds[split]
        return alone[0] / (split.threads * spmm), alone[1] / (split.threads * dense)

    base = raw(calibration)
    return {split: Efficiency(raw(split)[0] / base[0], raw(split)[1] / base[1]) for split in seconds}


def predict_splits(nodes: int, cores: int, workload: Callable[[int], Workload | None], shape: ModelShape,
                    plan: str, policy: ExpectedTraffic, rates: Rates, net: Network,
                    efficiencies: Mapping[NodeSplit, Efficiency]) -> list[SplitEpoch]:
    """Every split of ``efficiencies`` on ``nodes`` nodes of ``cores`` cores, fastest first; a split whose rank
    count ``workload`` has no workload for (None) is left out."""
    priced = []
    for split, efficiency in efficiencies.items():
        ranks = nodes * split.ranks_per_node
        work = workload(ranks)
        if work is None:
            continue
        node = replace(net, ranks_per_node=split.ranks_per_node, cores_per_node=cores, machine_cores=None)
        scaled = replace(rates, spmm=rates.spmm * efficiency.spmm, dense=rates.dense * efficiency.dense)
        prediction = predict_epoch(work, shape, plan, policy, scaled, node, 1, split.threads)
        priced.append(SplitEpoch(split, ranks, efficiency, prediction))
    return sorted(priced, key=lambda epoch: epoch.prediction.epoch)


__all__ = ["Efficiency", "NodeSplit", "SplitEpoch", "efficiency_of", "node_splits", "predict_splits"]
