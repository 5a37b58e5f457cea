import numpy as np
import scipy.sparse as sp

from runners.data.synthetic import CHUNK_ROWS, synthetic_rows

N = CHUNK_ROWS * 2 + 1234  # crosses chunk borders


def test_rows_do_not_depend_on_how_the_range_is_split() -> None:
    whole = synthetic_rows("random", 0, N, N, 3, seed=5)
    cuts = [0, 17, CHUNK_ROWS - 1, CHUNK_ROWS + 5, N]
    pieces = sp.vstack([synthetic_rows("random", lo, hi, N, 3, seed=5) for lo, hi in zip(cuts, cuts[1:])])
    assert (whole != pieces.tocsr()).nnz == 0


def test_clustered_graph_keeps_most_edges_in_the_community() -> None:
    rows = synthetic_rows("clustered", 0, 20_000, 20_000, 10, seed=1, community_size=100, mixing=0.05)
    coo = rows.tocoo()
    inside = np.mean(coo.row // 100 == coo.col // 100)
    assert 0.93 < inside < 0.97  # 1 - mixing plus the small chance a random target lands inside


def test_seeds_give_different_graphs() -> None:
    a = synthetic_rows("random", 0, 1000, 1000, 4, seed=0)
    b = synthetic_rows("random", 0, 1000, 1000, 4, seed=1)
    assert (a != b).nnz > 0
