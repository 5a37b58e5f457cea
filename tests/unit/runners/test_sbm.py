"""The stochastic block model of ``prepare synthetic --homophily`` (single process)."""

import numpy as np
import pytest

from runners.data.sbm import measured_homophily, stochastic_blocks


@pytest.mark.parametrize("homophily", [0.0, 0.05, 0.4, 1.0])
def test_the_share_of_edges_inside_a_class_is_the_homophily_asked(homophily: float) -> None:
    data = stochastic_blocks(4000, 5, 8, homophily, 20, seed=3)
    assert measured_homophily(data) == pytest.approx(homophily, abs=0.02)
    adjacency = data.adjacency
    assert (adjacency != adjacency.T).nnz == 0 and adjacency.diagonal().sum() == 0  # symmetric, no self-loops
    assert np.array_equal(np.bincount(data.labels, minlength=5) > 0, np.ones(5, bool))
    assert data.features.dtype == np.float32 and data.features.min() >= 0  # row normalisation applies
    assert np.allclose(data.features.sum(axis=1), 20)  # words per node


def test_features_tell_the_class_and_splits_do_not_overlap() -> None:
    data = stochastic_blocks(3000, 4, 6, 0.25, 40, signal=0.5, seed=1)
    block = 40 // 4
    own = np.array([data.features[i, c * block:(c + 1) * block].sum() for i, c in enumerate(data.labels)])
    assert own.mean() == pytest.approx(20 * (0.5 + 0.5 * block / 40), rel=0.05)
    train, val, test = data.masks["train"], data.masks["val"], data.masks["test"]
    assert not (train & val).any() and not (train & test).any() and not (val & test).any()
    assert 0.07 < train.mean() < 0.13 and 0.25 < test.mean() < 0.35


def test_the_graph_is_a_function_of_its_seed() -> None:
    a, b = stochastic_blocks(500, 3, 4, 0.2, 9, seed=7), stochastic_blocks(500, 3, 4, 0.2, 9, seed=7)
    assert (a.adjacency != b.adjacency).nnz == 0 and np.array_equal(a.features, b.features)
    assert (a.adjacency != stochastic_blocks(500, 3, 4, 0.2, 9, seed=8).adjacency).nnz > 0


def test_impossible_shapes_are_refused() -> None:
    for args in ((3, 5, 4, 0.2, 10), (100, 1, 4, 0.2, 10), (100, 5, 4, 1.5, 10), (100, 5, 4, 0.2, 3)):
        with pytest.raises(ValueError, match="stochastic_blocks: need"):
            stochastic_blocks(*args)
