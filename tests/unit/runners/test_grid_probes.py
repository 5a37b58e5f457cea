"""The grid model's probes (runners/grid_probes.py) and its elementwise work (runners/perf/grid_model.py); no MPI."""

from __future__ import annotations

import pytest

from runners.grid_probes import LARGE_VALUES, PROBE_ROWS, SMALL_VALUES, fit_allreduce_link, probe_rates
from runners.perf.cost_model import Rates
from runners.perf.grid_model import LOSS_PASSES, OUTPUT_PASSES, choose_grid, factorisations, predict_grid_epoch
from sparse_dist.cost import Network, allreduce_time
from sparse_dist.grid import GridShape

FLAT = Network("flat", 2e-6, 1e-9, 2e-6, 1e-9, ranks_per_node=1_000, cores_per_node=1_000)


@pytest.mark.parametrize("size", [2, 3, 4, 8, 13])
def test_the_link_fit_recovers_alpha_and_beta_from_the_models_own_allreduce_times(size: int) -> None:
    alpha, beta = 7e-6, 1 / 2.5e9
    net = Network("probe", alpha, beta, alpha, beta)
    small = allreduce_time(SMALL_VALUES * 4, size, net)
    large = allreduce_time(LARGE_VALUES * 4, size, net)
    fitted = fit_allreduce_link(small, large, size)
    assert fitted == pytest.approx((alpha, beta), rel=1e-9)


def test_a_link_faster_than_its_latency_explains_is_not_free_of_latency_and_not_negative() -> None:
    # a large allreduce measured at less than twice the small one: beta cannot be fitted, so it is the floor
    alpha, beta = fit_allreduce_link(1e-4, 1.5e-4, 4)
    assert beta == 1e-12 and alpha == pytest.approx(1e-4 / 2 - SMALL_VALUES * 4 * 1e-12)
    assert fit_allreduce_link(1e-4, 1e-3, 1) == (0.0, 1e-12)


def test_the_probe_rates_price_the_probes_own_work_at_the_probes_seconds() -> None:
    degree, width, threads = 9, 24, 2
    spmm, gemm, passes = 0.8, 0.3, 0.05
    rates = probe_rates((spmm, gemm, passes), degree, width, threads, "test")
    assert PROBE_ROWS * degree * width / (rates.spmm * threads) == pytest.approx(spmm)
    # the grid model's dense work of a layer (one rows x F x F) is its three products: forward and two gradients
    assert PROBE_ROWS * width * width / (rates.dense * threads) == pytest.approx(3 * gemm)
    assert PROBE_ROWS * width / (rates.elementwise * threads) == pytest.approx(passes)


def test_elementwise_work_is_every_replica_of_each_output_block_and_only_priced_with_a_rate() -> None:
    nodes, nnz, dims = 6000, 60_000, (32, 64, 64, 10)
    rates = Rates(spmm=1e8, dense=1e9, elementwise=2e8)
    alone = predict_grid_epoch(GridShape(1, 1, 1), nodes, nnz, dims, 4, rates, FLAT)
    counted = nodes * (64 * OUTPUT_PASSES + 64 * OUTPUT_PASSES + 10 * LOSS_PASSES)
    assert alone.compute_elementwise == pytest.approx(counted / 2e8)
    assert alone.epoch == pytest.approx(alone.compute + alone.exchange + alone.allreduce)
    # 1 x 4 x 1: layer 0's output (rows over z: all, columns over x: all) on every rank of y: the whole block, four
    # times over the grid; 2 x 1 x 2 splits every output over two axes of two
    wide = predict_grid_epoch(GridShape(1, 4, 1), nodes, nnz, dims, 4, rates, FLAT)
    split = predict_grid_epoch(GridShape(2, 1, 2), nodes, nnz, dims, 4, rates, FLAT)
    assert wide.compute_elementwise > 1.5 * split.compute_elementwise
    without = predict_grid_epoch(GridShape(1, 4, 1), nodes, nnz, dims, 4, Rates(spmm=1e8, dense=1e9), FLAT)
    assert without.compute_elementwise == 0.0
    assert without.compute == pytest.approx(wide.compute - wide.compute_elementwise)
    # with a slow enough elementwise rate the pick avoids the grid that replicates wide outputs
    slow = Rates(spmm=1e12, dense=1e15, elementwise=1e6)
    assert str(choose_grid(4, factorisations(4), nodes, nnz, dims, 4, slow, FLAT)[0].shape) != "1x4x1"


def test_a_coded_grid_is_priced_at_its_coded_bytes() -> None:
    from sparse_dist.compress import Codec
    from sparse_dist.grid_gcn import step_bytes

    nodes, nnz, dims, shape = 6000, 60_000, (32, 64, 64, 10), GridShape(2, 2, 2)
    slow_link = Network("slow", 1e-6, 1e-8, 1e-6, 1e-8, ranks_per_node=1_000, cores_per_node=1_000)
    rates = Rates(spmm=1e8, dense=1e9)
    codec = Codec.parse("int8,feedback")
    exact = predict_grid_epoch(shape, nodes, nnz, dims, 4, rates, slow_link)
    coded = predict_grid_epoch(shape, nodes, nnz, dims, 4, rates, slow_link, codec=codec)
    every_rank = [step_bytes(shape, {"x": x, "y": y, "z": z}, nodes, dims, 4, codec=codec)
                  for x in range(2) for y in range(2) for z in range(2)]
    assert sum(coded.bytes.values()) == max(sum(rank.values()) for rank in every_rank)
    assert coded.bytes["forward"] < exact.bytes["forward"] / 2 and coded.bytes["loss"] == exact.bytes["loss"]
    assert coded.bytes["grad_allreduce"] == exact.bytes["grad_allreduce"]  # the weights' gradient stays exact
    assert coded.exchange < exact.exchange and coded.allreduce == exact.allreduce
    assert coded.compute == exact.compute
