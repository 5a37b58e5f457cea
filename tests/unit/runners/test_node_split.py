"""Ranks x threads on a node: the splits, their efficiencies and the epoch the cost model gives each (no MPI)."""

from __future__ import annotations

import pytest
import torch

from runners import node_split_probe
from runners.perf.cost_model import ExpectedTraffic, ModelShape, Rates, predict_epoch, workload_analytic
from runners.perf.node_split import Efficiency, NodeSplit, efficiency_of, node_splits, predict_splits
from sparse_dist.cost import Network

SHAPE = ModelShape((64, 32, 32, 8))
RATES = Rates(spmm=1e8, dense=1e9, source="test")
NODES, NNZ = 40_000, 400_000


def _work(ranks: int):
    return workload_analytic("test", NODES, NNZ, ranks, cut=0.2)


def test_a_node_is_laid_out_as_every_divisor_of_its_cores() -> None:
    assert node_splits(16) == [NodeSplit(1, 16), NodeSplit(2, 8), NodeSplit(4, 4), NodeSplit(8, 2), NodeSplit(16, 1)]
    assert node_splits(6) == [NodeSplit(1, 6), NodeSplit(2, 3), NodeSplit(3, 2), NodeSplit(6, 1)]
    assert node_splits(1) == [NodeSplit(1, 1)]
    assert str(NodeSplit(8, 2)) == "8 x 2"


def test_efficiency_is_one_thread_alone_against_the_split_per_core_relative_to_the_calibration() -> None:
    alone = (1.0, 2.0)
    seconds = {NodeSplit(1, 4): (0.5, 1.0),   # 4 threads: 2x faster than one thread -> 0.5 a core
               NodeSplit(4, 1): (1.25, 2.5),  # 4 ranks at once, each 1.25x slower than alone -> 0.8 a core
               NodeSplit(2, 2): (0.8, 1.6)}   # 2 threads each, 2 at once: 1 / (2 x 0.8) = 0.625 a core
    against_one = efficiency_of(seconds, alone, NodeSplit(1, 1))
    assert against_one[NodeSplit(1, 4)] == Efficiency(pytest.approx(0.5), pytest.approx(0.5))
    assert against_one[NodeSplit(4, 1)] == Efficiency(pytest.approx(0.8), pytest.approx(0.8))
    assert against_one[NodeSplit(2, 2)].spmm == pytest.approx(0.625)
    # a calibration run with 4 threads already paid its 0.5: its rates are that split's, efficiency 1 there
    against_four = efficiency_of(seconds, alone, NodeSplit(1, 4))
    assert against_four[NodeSplit(1, 4)] == Efficiency(pytest.approx(1.0), pytest.approx(1.0))
    assert against_four[NodeSplit(4, 1)].dense == pytest.approx(1.6)


def test_at_linear_speed_and_a_free_link_every_split_computes_alike() -> None:
    free = Network("free", 0.0, 1e-30, 0.0, 1e-30, ranks_per_node=1, cores_per_node=4)
    linear = {split: Efficiency(1.0, 1.0) for split in node_splits(4)}
    priced = predict_splits(1, 4, _work, SHAPE, "p2p", ExpectedTraffic(), RATES, free, linear)
    assert [epoch.ranks for epoch in sorted(priced, key=lambda e: e.split)] == [1, 2, 4]
    computes = {epoch.split: epoch.prediction.compute_spmm + epoch.prediction.compute_dense for epoch in priced}
    # rows split evenly, so each rank's work is 1/r of the graph's (plus its halo's SpMM, cut 0.2 of the entries
    # stay in the graph's nnz): r ranks of C/r cores each take what one rank of C cores does
    whole = predict_epoch(_work(1), SHAPE, "p2p", ExpectedTraffic(), RATES,
                          Network("free", 0, 1e-30, 0, 1e-30, ranks_per_node=1, cores_per_node=4), 1, 4)
    for split, seconds in computes.items():
        assert seconds == pytest.approx(whole.compute_spmm + whole.compute_dense, rel=1e-3), split


def test_a_costly_link_favours_threads_and_slow_threads_favour_ranks() -> None:
    slow_link = Network("slow", 1e-3, 1e-8, 1e-3, 1e-8, ranks_per_node=1, cores_per_node=4)
    linear = {split: Efficiency(1.0, 1.0) for split in node_splits(4)}
    priced = predict_splits(1, 4, _work, SHAPE, "p2p", ExpectedTraffic(), RATES, slow_link, linear)
    assert priced[0].split == NodeSplit(1, 4) and priced[0].prediction.exchange == 0.0
    fast_link = Network("fast", 1e-6, 1e-11, 1e-6, 1e-11, ranks_per_node=1, cores_per_node=4)
    threads_lose = {NodeSplit(1, 4): Efficiency(0.4, 0.4), NodeSplit(2, 2): Efficiency(0.7, 0.7),
                    NodeSplit(4, 1): Efficiency(0.9, 0.9)}
    priced = predict_splits(1, 4, _work, SHAPE, "p2p", ExpectedTraffic(), RATES, fast_link, threads_lose)
    assert [epoch.split for epoch in priced] == [NodeSplit(4, 1), NodeSplit(2, 2), NodeSplit(1, 4)]
    assert all(a.prediction.epoch <= b.prediction.epoch for a, b in zip(priced, priced[1:]))


def test_two_nodes_double_the_ranks_and_a_split_without_a_workload_is_left_out() -> None:
    linear = {split: Efficiency(1.0, 1.0) for split in node_splits(4)}
    net = Network("two", 1e-6, 1e-10, 2e-6, 1e-9, ranks_per_node=1, cores_per_node=4)
    priced = predict_splits(2, 4, lambda ranks: _work(ranks) if ranks != 4 else None, SHAPE, "p2p",
                             ExpectedTraffic(), RATES, net, linear)
    assert sorted((epoch.split, epoch.ranks) for epoch in priced) == [(NodeSplit(1, 4), 2), (NodeSplit(4, 1), 8)]


def test_the_probe_times_every_split_and_gives_torch_its_threads_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_split_probe, "SPLIT_ROWS", 2048)
    before = torch.get_num_threads()
    seconds, alone = node_split_probe.split_seconds([NodeSplit(1, 2), NodeSplit(2, 1)], degree=5, width=16)
    assert set(seconds) == {NodeSplit(1, 2), NodeSplit(2, 1)}
    assert all(value > 0 for pair in seconds.values() for value in pair) and min(alone) > 0
    assert torch.get_num_threads() == before
