"""The analytic byte model on hand-computed examples."""

import numpy as np

from sparse_dist.layout import Grid, RowLayout
from sparse_dist.predict import predict_spmm_bytes

# Two groups: 3 and 2 rows. Group 0 needs 1 row of H_1; group 1 needs 2 rows of H_0.
LAYOUT = RowLayout.from_counts([3, 2])
COUNTS = np.array([[0, 1], [2, 0]])
UNIONS = np.array([2, 1])
ROW = 4 * 4  # F = 4 float32


def predict(plan: str, grid: Grid = Grid(2)) -> dict[str, np.ndarray]:
    return predict_spmm_bytes(grid, LAYOUT, COUNTS, UNIONS, plan, width=4, itemsize=4)


def test_dense_broadcast_moves_whole_blocks() -> None:
    got = predict("dense-bcast")
    assert got["forward"].tolist() == [[3 * ROW, 2 * ROW], [2 * ROW, 3 * ROW]]
    assert got["backward"].tolist() == [[2 * ROW, 3 * ROW], [3 * ROW, 2 * ROW]]


def test_sparse_broadcast_moves_boundary_unions() -> None:
    got = predict("sparse-bcast")
    assert got["forward"].tolist() == [[2 * ROW, 1 * ROW], [1 * ROW, 2 * ROW]]


def test_p2p_moves_each_pair_boundary() -> None:
    got = predict("p2p")
    assert got["forward"].tolist() == [[2 * ROW, 1 * ROW], [1 * ROW, 2 * ROW]]
    assert got["backward"].tolist() == [[1 * ROW, 2 * ROW], [2 * ROW, 1 * ROW]]


def test_sparse_broadcast_pays_the_union_to_every_receiver() -> None:
    layout = RowLayout.from_counts([2, 2, 2])
    counts = np.array([[0, 0, 0], [1, 0, 0], [1, 0, 0]])  # groups 1 and 2 need the same row of H_0
    unions = np.array([1, 0, 0])
    sparse = predict_spmm_bytes(Grid(3), layout, counts, unions, "sparse-bcast", 1, 8)["forward"]
    p2p = predict_spmm_bytes(Grid(3), layout, counts, unions, "p2p", 1, 8)["forward"]
    assert sparse.tolist() == [[16, 0], [0, 8], [0, 8]]
    assert p2p.tolist() == [[16, 0], [0, 8], [0, 8]]


def test_replicated_group_adds_allreduce_forward_and_broadcast_backward() -> None:
    layout = RowLayout.from_counts([5])
    got = predict_spmm_bytes(Grid(2, 2), layout, np.zeros((1, 1)), np.zeros(1), "p2p", 4, 4)
    # ring allreduce of 20 elements over 2 ranks: each sends and receives 2 * 10 * 4 bytes
    assert got["forward"].tolist() == [[80, 80], [80, 80]]
    # dH_0 is broadcast from replica 0, which owns block 0
    assert got["backward"].tolist() == [[5 * ROW, 0], [0, 5 * ROW]]
