"""Local CSR helpers that replace a library call by a cheaper one: the same arrays as the call they replace."""

import numpy as np
import pytest

from sparse_dist.csr import distinct_ids, distinct_ids_and_positions


@pytest.mark.parametrize("count,bound,dtype", [(0, 10, np.int32), (1, 1, np.int64), (50, 40, np.int32),
                                               (3000, 200, np.int32), (3000, 12000, np.int64),
                                               (3000, 12001, np.int64), (10, 1_000_000, np.int32)])
def test_distinct_ids_equal_numpy_unique_on_both_paths(count: int, bound: int, dtype: type) -> None:
    """Bitmap path (bound <= 4 n) and sort path (bound > 4 n) alike: numpy's sorted ids, in the ids' dtype,
    and positions that rebuild the input."""
    ids = np.random.default_rng(count + bound).integers(0, bound, size=count).astype(dtype)
    distinct, inverse = distinct_ids_and_positions(ids, bound)
    expected, expected_inverse = np.unique(ids, return_inverse=True)
    assert distinct.dtype == ids.dtype and inverse.dtype == np.int64
    assert np.array_equal(distinct, expected) and np.array_equal(inverse, expected_inverse)
    assert np.array_equal(distinct[inverse], ids)
    alone = distinct_ids(ids, bound)
    assert alone.dtype == ids.dtype and np.array_equal(alone, expected)
