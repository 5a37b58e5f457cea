"""The performance model: alpha-beta formulas, partition statistics, bytes, calibration (no MPI)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from datasets_for_tests import random_directed, write

from runners.perf.calibration import calibrate
from runners.perf.cost_model import (ExpectedTraffic, ModelShape, Rates, predict_epoch, workload_analytic,
                                     workload_from_shards)
from sparse_dist.cost import Network, allreduce_time, alltoallv_time, bcast_time
from runners.data.shards import part_file, read_meta
from sparse_dist.layout import Grid, RowLayout
from sparse_dist.predict import predict_spmm_bytes

FLAT = Network("flat", 2e-6, 1e-9, 2e-6, 1e-9, ranks_per_node=1_000, cores_per_node=1_000)


def test_collective_formulas() -> None:
    # binomial below 12 KiB: ceil(log2 5) = 3 steps of (alpha + m beta)
    assert bcast_time(1000, 5, FLAT) == pytest.approx(3 * (2e-6 + 1000e-9))
    # scatter + ring allgather above: (3 + 4) alpha + 2 * 4/5 * m beta
    assert bcast_time(1e6, 5, FLAT) == pytest.approx(7 * 2e-6 + 1.6e6 * 1e-9)
    assert allreduce_time(1000, 4, FLAT) == pytest.approx(2 * (2e-6 + 1000e-9))
    assert allreduce_time(1e6, 4, FLAT) == pytest.approx(4 * 2e-6 + 1.5e6 * 1e-9)
    assert bcast_time(1e6, 1, FLAT) == 0.0 and allreduce_time(1e6, 1, FLAT) == 0.0
    t = alltoallv_time(np.array([100.0, 0.0]), np.array([0.0, 300.0]), np.array([1, 1]), 2, FLAT)
    assert t == pytest.approx(2e-6 + 300e-9)


def test_two_groups_broadcast_both_ways_at_once_more_groups_take_turns() -> None:
    from sparse_dist.layout import Grid
    from sparse_dist.plans import plan_class

    dense = plan_class("dense-bcast")
    rows, row_bytes = np.array([3e5, 1e5]), 512.0
    two = dense.exchange_seconds(rows, np.zeros((2, 2)), np.zeros(2), Grid(2), row_bytes, FLAT)
    # the prefetch has both owners' broadcasts in flight, one each way: the larger one, not the sum
    assert two == pytest.approx(bcast_time(3e5 * row_bytes, 2, FLAT))
    rows3 = np.array([3e5, 1e5, 2e5])
    three = dense.exchange_seconds(rows3, np.zeros((3, 3)), np.zeros(3), Grid(3), row_bytes, FLAT)
    assert three == pytest.approx(sum(bcast_time(r * row_bytes, 3, FLAT) for r in rows3))
    # 1.5D with two groups and two replica columns: each column holds one owner
    assert dense.exchange_seconds(rows, np.zeros((2, 2)), np.zeros(2), Grid(4, 2), row_bytes, FLAT) == \
        pytest.approx(bcast_time(3e5 * row_bytes, 2, FLAT))


def test_off_node_bandwidth_is_shared_by_the_ranks_of_a_node() -> None:
    net = Network("two-tier", 1e-6, 1e-10, 5e-6, 1e-9, ranks_per_node=4, nics_per_node=1)
    assert net.link(4) == (1e-6, 1e-10)
    alpha, beta = net.link(8)  # 4 of a rank's 7 peers are off node, 4 ranks share one NIC
    assert alpha == 5e-6 and beta == pytest.approx(1e-9 * 4 * 4 / 7)


def test_shard_statistics_match_the_matrix(tmp_path: Path) -> None:
    data = write(random_directed(n=300, seed=3), tmp_path / "d", parts=6)
    meta = read_meta(data)
    blocks = []
    for index in range(meta["num_parts"]):
        with np.load(data / part_file(index)) as part:
            blocks.append(sp.csr_matrix((part["data"], part["indices"], part["indptr"]),
                                        shape=(part["indptr"].size - 1, meta["num_nodes"])))
    matrix = sp.vstack(blocks).tocsr()
    for groups in (1, 2, 3, 6):
        offsets = meta["row_offsets"][:: meta["num_parts"] // groups]
        work = workload_from_shards(data, groups)
        for i in range(groups):
            rows = matrix[offsets[i]:offsets[i + 1]]
            for j in range(groups):
                block = rows[:, offsets[j]:offsets[j + 1]]
                used = int((block.getnnz(axis=0) > 0).sum())
                assert work.boundary[i, j] == (used if i != j else 0)
            own = rows[:, offsets[i]:offsets[i + 1]]
            loops = int((own.diagonal() != 0).sum())
            assert work.nnz_local[i] == own.nnz + (offsets[i + 1] - offsets[i] - loops)
            assert work.nnz_remote[i] == rows.nnz - own.nnz
        needed = [set() for _ in range(groups)]
        for i in range(groups):
            rows = matrix[offsets[i]:offsets[i + 1]]
            for j in range(groups):
                if i != j:
                    needed[j] |= set((np.flatnonzero(rows[:, offsets[j]:offsets[j + 1]].getnnz(axis=0))
                                      + offsets[j]).tolist())
        assert work.union.tolist() == [len(s) for s in needed]


def test_analytic_boundary_matches_a_random_partition() -> None:
    rng = np.random.default_rng(0)
    n, d, groups = 24_000, 8, 4
    part = rng.integers(0, groups, n)
    neighbours = rng.integers(0, n, (n, d))              # node v's d neighbours (symmetric graph)
    empirical = np.zeros((groups, groups))
    neighbour_parts = part[neighbours]                     # v is in B_ij when v is in j and a neighbour in i
    for i in range(groups):
        touches = (neighbour_parts == i).any(axis=1)
        for j in range(groups):
            if i != j:
                empirical[i, j] = int((touches & (part == j)).sum())
    work = workload_analytic("random", n, n * d, groups)
    off = ~np.eye(groups, dtype=bool)
    # E|B_ij| = n_j (1 - (1 - 1/G)^d) for nodes with exactly d neighbours, each in part i w.p. 1/G
    expected_reach = 1 - (1 - 1 / groups) ** d
    assert work.boundary[0, 1] == pytest.approx(n / groups * expected_reach)
    counts = np.bincount(part, minlength=groups)
    assert np.allclose(empirical[off] / np.broadcast_to(counts, (groups, groups))[off], expected_reach, rtol=0.03)


def test_predicted_bytes_follow_the_exact_byte_model_and_the_policies(tmp_path: Path) -> None:
    data = write(random_directed(n=240, seed=5), tmp_path / "d", parts=4)
    work = workload_from_shards(data, 4)
    shape = ModelShape((12, 16, 4))   # layer 0 exchanges 12 columns without a transpose, layer 1 4 columns with
    rates = Rates(spmm=1e9, dense=1e9)
    layout = RowLayout.from_counts(work.rows.tolist())
    for plan in ("dense-bcast", "sparse-bcast", "p2p"):
        exact = predict_epoch(work, shape, plan, ExpectedTraffic(), rates, FLAT)
        sent = sum(int(predict_spmm_bytes(Grid(4), layout, work.boundary, work.union, plan, w, 4)[d][:, 0].sum())
                   for w, d in ((12, "forward"), (4, "forward"), (4, "backward")))
        assert exact.exchange_bytes_total == sent
        if plan != "dense-bcast":
            sampled = predict_epoch(work, shape, plan, ExpectedTraffic(sample_p=0.25), rates, FLAT)
            assert sampled.exchange_bytes_total == pytest.approx(0.25 * sent)
        if plan != "p2p":
            stale = predict_epoch(work, shape, plan, ExpectedTraffic(active=0.5), rates, FLAT)
            forward = sum(int(predict_spmm_bytes(Grid(4), layout, work.boundary, work.union, plan, w, 4)
                              ["forward"][:, 0].sum()) for w in (12, 4))
            assert stale.exchange_bytes_total == pytest.approx(sent - 0.5 * forward)
    assert ExpectedTraffic.from_specs("none", "sancus-e:eps=3").active == 0.25
    assert ExpectedTraffic.from_specs("bns:p=0.2,side=owner", "none").sample_p == 0.2
    # skipping stale gradients too: the backward bytes shrink by the same share as the forward ones
    skipping = predict_epoch(work, shape, "sparse-bcast", ExpectedTraffic.from_specs("none", "sancus-e:eps=1,skip_backward=1"),
                             rates, FLAT)
    exact = predict_epoch(work, shape, "sparse-bcast", ExpectedTraffic(), rates, FLAT)
    assert skipping.exchange_bytes_total == pytest.approx(0.5 * exact.exchange_bytes_total)
    with pytest.raises(ValueError, match="data-dependent"):
        ExpectedTraffic.from_specs("none", "sancus-h:eps=0.1")


def test_calibration_reproduces_the_calibration_run(tmp_path: Path) -> None:
    data = write(random_directed(n=240, seed=5), tmp_path / "d", parts=2)
    work = workload_from_shards(data, 2)
    shape = ModelShape((12, 16, 4))
    row = {"run": "r", "world_size": 2, "replication": 1, "threads_per_rank": 1, "plan": "p2p",
           "t_local_spmm": 0.03, "t_dense": 0.2}
    rates = calibrate(row, work, shape, FLAT, ExpectedTraffic())
    again = predict_epoch(work, shape, "p2p", ExpectedTraffic(), rates, FLAT)
    assert again.compute_spmm == pytest.approx(0.03) and again.compute_dense == pytest.approx(0.2)
    # half the rows and nonzeros per rank at twice the ranks: compute halves (no overlap, same rates)
    assert math.isclose(rates.spmm * 0.03, float(np.max(work.nnz_local + work.nnz_remote)) * (12 + 2 * 4))


def test_a_policys_own_compute_is_calibrated_on_its_run_and_priced_by_the_unsampled_blocks(tmp_path: Path) -> None:
    """dgs's explanation (``t_policy``): the calibration run is reproduced, a run with twice the nonzeros per rank
    pays twice the seconds, and a row without the column (an older results.csv) prices none."""
    data = write(random_directed(n=240, seed=5), tmp_path / "d", parts=2)
    work = workload_from_shards(data, 2)
    shape = ModelShape((12, 16, 4))
    dgs = ExpectedTraffic.from_specs("dgs:nodes=0.5", "none")
    row = {"run": "r", "world_size": 2, "replication": 1, "threads_per_rank": 1, "plan": "p2p",
           "t_local_spmm": 0.03, "t_dense": 0.2, "t_policy": 0.5}
    rates = calibrate(row, work, shape, FLAT, dgs)
    again = predict_epoch(work, shape, "p2p", dgs, rates, FLAT)
    assert again.compute_policy == pytest.approx(0.5)
    assert again.epoch == pytest.approx(again.compute_spmm + again.compute_dense + 0.5 + again.exchange
                                        + again.allreduce)
    doubled = workload_from_shards(data, 2)
    doubled.nnz_local, doubled.nnz_remote = 2 * doubled.nnz_local, 2 * doubled.nnz_remote
    assert predict_epoch(doubled, shape, "p2p", dgs, rates, FLAT).compute_policy == pytest.approx(1.0)
    older = calibrate({key: value for key, value in row.items() if key != "t_policy"}, work, shape, FLAT, dgs)
    assert predict_epoch(work, shape, "p2p", dgs, older, FLAT).compute_policy == 0.0


def test_pipe_overlaps_its_exchange_and_compression_scales_the_rows(tmp_path: Path) -> None:
    from sparse_dist.compress import Codec

    data = write(random_directed(n=240, seed=5), tmp_path / "d", parts=4)
    work = workload_from_shards(data, 4)
    shape = ModelShape((12, 16, 4))
    layout = RowLayout.from_counts(work.rows.tolist())
    exact = predict_epoch(work, shape, "p2p", ExpectedTraffic(), Rates(spmm=1e9, dense=1e9), FLAT)
    pipe_traffic = ExpectedTraffic.from_specs("none", "pipe:tau=1")
    assert pipe_traffic.overlapped and pipe_traffic.active == 1.0
    for rates in (Rates(spmm=1e9, dense=1e9), Rates(spmm=1e3, dense=1e3)):  # exchange-bound, then compute-bound
        plain = predict_epoch(work, shape, "p2p", ExpectedTraffic(), rates, FLAT)
        pipe = predict_epoch(work, shape, "p2p", pipe_traffic, rates, FLAT)
        compute = plain.compute_spmm + plain.compute_dense
        assert pipe.exchange_bytes_total == plain.exchange_bytes_total  # every flight is sent, later
        assert pipe.epoch == pytest.approx(max(compute, plain.exchange) + plain.allreduce)
        assert plain.epoch == pytest.approx(compute + plain.exchange + plain.allreduce)
    # fp16: 2 bytes a value plus an int16 exponent a row; int8: 1 byte a value plus a float32 scale a row
    per_width = {w: [predict_spmm_bytes(Grid(4), layout, work.boundary, work.union, "p2p", w, 4)[d][:, 0].sum()
                     for d in ("forward", "backward")] for w in (12, 4)}
    rows_sent = {(w, d): per_width[w][k] / (4 * w) for w in (12, 4) for k, d in enumerate(("forward", "backward"))}
    legs = ((12, "forward"), (4, "forward"), (4, "backward"))
    for codec, row_bytes in (("fp16", lambda w: 2 * w + 2), ("bf16", lambda w: 2 * w), ("int8", lambda w: w + 4)):
        compressed = predict_epoch(work, shape, "p2p", ExpectedTraffic(codec=Codec.parse(codec)),
                                   Rates(spmm=1e9, dense=1e9), FLAT)
        assert compressed.exchange_bytes_total == pytest.approx(sum(rows_sent[leg] * row_bytes(leg[0]) for leg in legs))
        assert compressed.exchange < exact.exchange


def test_emulated_nodes_share_the_machines_cores() -> None:
    from dataclasses import replace

    from runners.perf.cost_model import cores_per_rank

    one_core_nodes = Network("emu", 5e-5, 8e-9, 5e-5, 8e-9, ranks_per_node=1, cores_per_node=1)
    assert [cores_per_rank(one_core_nodes, p, 1) for p in (2, 4)] == [1.0, 1.0]
    shared = replace(one_core_nodes, machine_cores=2)  # 4 emulated nodes on a 2-core machine: half a core each
    assert [cores_per_rank(shared, p, 1) for p in (1, 2, 4)] == [1.0, 1.0, 0.5]


def test_an_evaluation_is_an_exact_forward_priced_by_the_step_rates(tmp_path: Path) -> None:
    """Exchanges: every exchanging layer's forward, exact and uncompressed, at the narrower width; layer 0
    of a GCN with X's halo kept multiplies nothing (the kept product); compute from the step's SpMM rate and a
    third of its dense rate (an evaluation's turns, which also wait, do not calibrate it); only p2p's exchanges
    travel beside a step."""
    from sparse_dist.plans import plan_class
    from runners.perf.cost_model import EVALUATION_DENSE_SHARE, predict_evaluation

    data = write(random_directed(n=240, seed=5), tmp_path / "d", parts=4)
    work = workload_from_shards(data, 4)
    rates = Rates(spmm=1e6, dense=2e6)
    widths = {(12, 16, 4): [12, 4], (16, 16, 8): [16, 8]}
    for dims, exchanged in widths.items():
        for once in (False, True):
            shape = ModelShape(dims, input_once=once)
            cost = predict_evaluation(work, shape, "p2p", rates, FLAT)
            sent = exchanged[1:] if once else exchanged
            assert cost.exchange == pytest.approx(sum(plan_class("p2p").exchange_seconds(
                work.rows, work.boundary, work.union, Grid(4), w * 4, FLAT) for w in sent))
            spmm_widths = ([0] if once else exchanged[:1]) + exchanged[1:]
            nnz = float(np.max(work.nnz_local + work.nnz_remote))
            dense = float(np.max(work.rows)) * sum(a * b for a, b in zip(dims[:-1], dims[1:]))
            assert cost.compute == pytest.approx(nnz * sum(spmm_widths) / 1e6
                                                 + dense * EVALUATION_DENSE_SHARE / 2e6)
            assert cost.hides_beside_step
    # SAGE's layer 0 sees its input outside the product too: with X's halo kept it still multiplies
    sage_once = predict_evaluation(work, ModelShape((12, 16, 4), kind="sage", input_once=True), "p2p", rates, FLAT)
    sage = predict_evaluation(work, ModelShape((12, 16, 4), kind="sage"), "p2p", rates, FLAT)
    assert sage_once.compute == pytest.approx(sage.compute) and sage_once.exchange < sage.exchange
    for plan in ("dense-bcast", "sparse-bcast"):
        broadcast = predict_evaluation(work, ModelShape((12, 16, 4)), plan, rates, FLAT)
        assert not broadcast.hides_beside_step and broadcast.exchange == pytest.approx(sum(
            plan_class(plan).exchange_seconds(work.rows, work.boundary, work.union, Grid(4), w * 4, FLAT)
            for w in (12, 4)))


def test_the_cycle_adds_the_evaluation_after_its_step_and_bounds_it_by_core_or_link_beside_the_next() -> None:
    from runners.perf.cost_model import EvaluationCost, Prediction, predict_cycle

    def step(compute: float, exchange: float, overlapped: bool = False) -> Prediction:
        return Prediction(2, "p2p", compute, 0.0, exchange, 0.01, 0, 0, 0, overlapped=overlapped)

    evaluation = EvaluationCost(compute=0.25, exchange=0.45)
    assert predict_cycle(step(0.8, 0.9), evaluation, False) == pytest.approx(0.8 + 0.9 + 0.01 + 0.25 + 0.45)
    # beside the next step: its exchange hides in the step's compute, its compute does not
    assert predict_cycle(step(0.8, 0.9), evaluation, True) == pytest.approx(0.8 + 0.9 + 0.01 + 0.25)
    # a link-bound run (a sampled step, a slow link): everything on the link, then the evaluation's compute
    slow = EvaluationCost(compute=0.25, exchange=2.3)
    assert predict_cycle(step(0.7, 0.45), slow, True) == pytest.approx(0.45 + 0.01 + 2.3 + 0.25)
    # pipe: its step hides the exchange, the link does not
    assert predict_cycle(step(0.8, 4.6, overlapped=True), slow, True) == pytest.approx(4.6 + 0.01 + 2.3 + 0.25)
    # a broadcast plan's evaluation exchanges wait for its turns: as after the step, beside it or not
    waiting = EvaluationCost(compute=0.25, exchange=0.45, hides_beside_step=False)
    assert predict_cycle(step(0.8, 0.9), waiting, True) == pytest.approx(0.8 + 0.9 + 0.01 + 0.25 + 0.45)
    # evaluating every other epoch: the mean of a plain step and an evaluated one
    assert predict_cycle(step(0.8, 0.9), evaluation, False, every=2) == pytest.approx(
        ((0.8 + 0.9 + 0.01) * 2 + 0.25 + 0.45) / 2)
