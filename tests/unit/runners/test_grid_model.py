"""The process grid in the cost model (runners/perf/grid_model.py, ``cost predict --plans grid:...``); no MPI."""

from __future__ import annotations

import argparse
import itertools
from types import SimpleNamespace

import pytest

from runners.perf.cost_model import Rates
from runners.perf.grid_model import (AxisNetwork, busiest_rank_bytes, choose_grid, factorisations, grid_shapes,
                                     predict_grid_epoch, split_plans)
from runners.perf_model_cmd import _grid_plans, _plan_list
from runners.study.collect import ResultsError
from sparse_dist.cost import NETWORKS, Network
from sparse_dist.grid import GridShape
from sparse_dist.grid_gcn import layer_collectives, predicted_layer_bytes, predicted_loss_bytes

FLAT = Network("flat", 2e-6, 1e-9, 2e-6, 1e-9, ranks_per_node=1_000, cores_per_node=1_000)
RATES = Rates(spmm=1e8, dense=1e9)


def _trainer_counts(shape: GridShape, nodes: int, dims: tuple[int, ...], itemsize: int) -> list[int]:
    """Every rank's bytes over an epoch from the functions the trainer's counters are checked against
    (tests/mpi/test_grid.py), each asked of a stand-in grid that has the shape and the rank's coordinates."""
    totals = []
    for z, y, x in itertools.product(range(shape.z), range(shape.y), range(shape.x)):
        grid = SimpleNamespace(shape=shape, coords={"x": x, "y": y, "z": z})
        total = predicted_loss_bytes(grid, len(dims) - 2, nodes, itemsize)  # type: ignore[arg-type]
        for layer in range(len(dims) - 1):
            counted = predicted_layer_bytes(grid, layer, nodes, dims[layer], dims[layer + 1],  # type: ignore[arg-type]
                                            itemsize, layer > 0, aggregated_once=layer == 0)
            total += sum(counted.values())
        totals.append(total)
    return totals


@pytest.mark.parametrize("shape, nodes, dims", [
    (GridShape(2, 3, 1), 101, (7, 5, 3)),
    (GridShape(3, 2, 2), 97, (10, 6, 6, 4)),      # four layers: the rotation wraps around
    (GridShape(1, 1, 5), 53, (9, 4)),
    (GridShape(4, 1, 3), 130, (13, 11, 7, 5, 3)),
])
def test_the_busiest_ranks_bytes_are_the_trainers_prediction_at_its_busiest_rank(shape: GridShape, nodes: int,
                                                                                 dims: tuple[int, ...]) -> None:
    model = busiest_rank_bytes(shape, nodes, dims, 4)
    assert sum(model.values()) == max(_trainer_counts(shape, nodes, dims, 4))


def test_grid_auto_picks_the_least_predicted_time() -> None:
    # one layer on 1 x 1 x P: A's rows over z, the input replicated: only the gradients and the loss's scalar move
    candidates = factorisations(4)
    assert {str(s) for s in candidates} == {"1x1x4", "1x4x1", "4x1x1", "1x2x2", "2x1x2", "2x2x1"}
    priced = choose_grid(4, candidates[::-1], 100_000, 1_000_000, (64, 8), 4, RATES, FLAT)
    assert str(priced[0].shape) == "1x1x4" and priced[0].exchange < 1e-4
    # in general: the least time of every factorisation, whatever order they come in
    shapes = factorisations(12)
    times = {str(s): predict_grid_epoch(s, 5000, 80_000, (32, 16, 16, 5), 4, RATES, NETWORKS["ib-hdr"], 4).epoch
             for s in shapes}
    best = choose_grid(12, shapes[::-1], 5000, 80_000, (32, 16, 16, 5), 4, RATES, NETWORKS["ib-hdr"], 4)[0]
    assert best.epoch == min(times.values()) and times[str(best.shape)] == best.epoch


def test_an_axis_sees_the_nodes_its_ranks_are_placed_on() -> None:
    net = Network("two-tier", 1e-6, 1e-10, 5e-6, 1e-9, ranks_per_node=4, nics_per_node=1)
    shape = GridShape(4, 2, 2)
    assert AxisNetwork.of(net, shape, "x").link(4) == net.link(4)  # consecutive ranks: one node
    alpha, beta = AxisNetwork.of(net, shape, "y").link(2)  # 4 apart: every peer off node, 4 ranks on the NIC
    assert alpha == 5e-6 and beta == pytest.approx(4e-9)


def test_grid_plans_are_parsed_and_bad_ones_refused_in_one_sentence() -> None:
    assert split_plans("p2p, grid:4,4,4,grid:auto,grid:2x2x1") == ["p2p", "grid:4,4,4", "grid:auto", "grid:2x2x1"]
    assert _plan_list("p2p,grid:2,1,2") == "p2p,grid:2,1,2"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^plan grid:3,3: expected grid:X,Y,Z with three "
                                                         r"positive integers \(or grid:auto\)$"):
        _plan_list("p2p,grid:3,3")
    with pytest.raises(ResultsError, match=r"^plan grid:2,2,2: X \* Y \* Z = 8, not P = 4$"):
        _grid_plans(["p2p", "grid:2,2,2"], [8, 4], "gcn")
    with pytest.raises(ResultsError, match=r"^plan grid:auto: the process grid runs gcn and sage layers, not gat; "
                                           r"use a 1D plan \(p2p\) for gat$"):
        _grid_plans(["grid:auto"], [4], "gat")
    assert _grid_plans(["grid:auto"], [4], "sage") == ["grid:auto"]
    assert [str(s) for s in grid_shapes("grid:2,1,2", 4)] == ["2x1x2"]


def test_sage_moves_twice_gcns_aggregation_columns_and_the_rest_alike() -> None:
    """SAGE's aggregation, its gradient and its weights' gradient carry twice GCN's columns (its own rows beside its
    neighbours' mean); the output's and the input gradient's allreduces are GCN's (sparse_dist.grid_sage)."""
    shape, coords = GridShape(2, 2, 2), {"x": 1, "y": 0, "z": 1}
    gcn = layer_collectives(shape, coords, 1, 1000, 64, 32, True)
    sage = layer_collectives(shape, coords, 1, 1000, 64, 32, True, terms=2)
    assert [(sent.phase, sent.axis) for sent in gcn] == [(sent.phase, sent.axis) for sent in sage]
    n_d, f_i, f_o, n_o = 500, 32, 16, 500
    assert [sent.numel for sent in gcn] == [n_d * f_i, n_d * f_o, f_i * f_o + f_o, n_d * f_i, n_o * f_i]
    assert [sent.numel for sent in sage] == [n_d * 2 * f_i, n_d * f_o, 2 * f_i * f_o + f_o, n_d * 2 * f_i, n_o * f_i]
    gcn_epoch = predict_grid_epoch(shape, 1000, 20_000, (64, 32, 7), 4, RATES, NETWORKS["ib-hdr"], 1)
    sage_epoch = predict_grid_epoch(shape, 1000, 20_000, (64, 32, 7), 4, RATES, NETWORKS["ib-hdr"], 1, terms=2)
    assert sage_epoch.compute_spmm == gcn_epoch.compute_spmm and sage_epoch.compute_dense > gcn_epoch.compute_dense
    assert sage_epoch.bytes["forward"] > gcn_epoch.bytes["forward"] and sage_epoch.exchange > gcn_epoch.exchange
