"""PSC-GCN's closed form (water-filling of Theorem 2) and the per-edge sampling pieces, single process."""

import numpy as np
import pytest
import scipy.sparse as sp

from algorithms.policies import AxisSpec
from algorithms.policies.psc import PscSampler
from algorithms.water_fill import water_fill
from sparse_dist.csr import keep_entries
from sparse_dist.importance import EdgeProblem


def test_water_filling_meets_the_kkt_conditions() -> None:
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 30, size=400)
    indptr = np.concatenate(([0], np.cumsum(counts)))
    v = rng.lognormal(0, 2, size=indptr[-1])
    v[rng.random(v.size) < 0.05] = 0.0  # zero importance: floored, still sampled now and then
    budget = 0.3 * counts
    p = water_fill(indptr, v, budget)
    uncapped_rows = 0
    for row in range(counts.size):
        lo, hi = indptr[row], indptr[row + 1]
        if hi == lo:
            continue
        pr, vr = p[lo:hi], v[lo:hi]
        assert np.all(pr > 0) and np.all(pr <= 1)
        assert pr.sum() == pytest.approx(budget[row], rel=1e-9)
        floored = np.maximum(vr, 1e-3 * vr.mean()) if vr.mean() > 0 else np.ones_like(vr)
        free = pr < 1
        ratio = floored[free] / pr[free]  # sqrt(lambda): the same for every uncapped entry of the row
        assert np.allclose(ratio, ratio[0])
        assert np.all(floored[~free] >= ratio[0] * (1 - 1e-9))  # capped ones lie above the water line
        uncapped_rows += int(np.all(free))
    assert 0 < uncapped_rows < counts.size


def test_water_filling_beats_uniform_and_keeps_small_rows() -> None:
    indptr, v = np.array([0, 4, 6]), np.array([8.0, 1.0, 1.0, 1.0, 5.0, 1.0])
    p = water_fill(indptr, v, np.array([2.0, 2.0]))
    assert np.allclose(p[4:], 1.0)  # a budget covering the row keeps it whole
    assert p[0] == 1.0 and np.allclose(p[1:4], 1.0 / 3.0)  # the dominant entry is capped, the rest share
    variance = lambda q: float(np.sum(v[:4] ** 2 * (1 / q - 1)))  # noqa: E731
    assert variance(p[:4]) < variance(np.full(4, 0.5))  # Lemma 3: at most the uniform variance


def test_psc_keeps_inner_neighbours_and_the_diagonal_and_spends_the_budget_on_boundary_ones() -> None:
    sampler = PscSampler(0.5)
    indptr = np.array([0, 6, 7])
    values = np.array([1.0, 1.0, 3.0, 1.0, 1.0, 1.0, 2.0])
    inner = np.array([True, True, False, False, False, True, False])
    diagonal = np.array([False, False, False, False, False, True, False])
    columns = np.array([0, 1, 5, 6, 7, 2, 8])
    assert np.allclose(sampler.probabilities(EdgeProblem(indptr, values, columns, inner, diagonal, 3)),
                       [1.0, 1.0, 0.5, 0.5, 0.5, 1.0, 0.5])  # before any norm is known: the budget on boundary ones
    p = sampler.probabilities(EdgeProblem(indptr, values, columns, inner, diagonal, 3, np.ones(7)))
    assert np.all(p[[0, 1, 5]] == 1.0)  # inner neighbours and the self-loop: whole
    assert p[2:5].sum() == pytest.approx(0.5 * 3)  # the budget counts the boundary neighbours only
    assert p[2] > p[3] == p[4]  # the larger |A_ij| c_j gets the larger share
    assert p[6] == pytest.approx(0.5)  # a row with one boundary neighbour keeps it with the budget
    with pytest.raises(ValueError, match="a_inner"):
        AxisSpec.parse("sample", "psc:budget=0.1,a_inner=2")


def test_keep_entries_divides_by_p_and_renumbers_kept_columns() -> None:
    block = sp.csr_matrix(np.array([[1.0, 2.0, 0.0], [0.0, 3.0, 4.0]]))
    kept = np.array([True, False, True, True])
    p = np.array([0.5, 0.25, 0.5, 0.8])
    out = keep_entries(block, kept, p, np.array([True, True, True]))
    assert np.allclose(out.toarray(), [[2.0, 0.0, 0.0], [0.0, 6.0, 5.0]])
    dropped_column = keep_entries(block, np.array([False, False, True, True]), p, np.array([False, True, True]))
    assert dropped_column.shape == (2, 2) and np.allclose(dropped_column.toarray(), [[0.0, 0.0], [6.0, 5.0]])


def test_psc_specs_are_checked() -> None:
    spec = AxisSpec.parse("sample", "psc:budget=0.1,every=5,cache=0.3")
    sampler = spec.build(seed=7)
    assert (sampler.budget, sampler.every, sampler.cache, sampler.seed) == (0.1, 5, 0.3, 7)
    assert sampler.recomputes(5) and not sampler.recomputes(0) and not sampler.recomputes(6)
    for bad, message in (("psc:budget=0", r"budget must lie in \(0, 1\]"), ("psc:budget=0.1,every=0", "every"),
                         ("psc:budget=0.1,cache=2", "cache must lie")):
        with pytest.raises(ValueError, match=message):
            AxisSpec.parse("sample", bad)



@pytest.mark.parametrize("shape", [(0, 7), (3, 5), (5000, 128), (70001, 9), (3001, 1000)])
def test_squared_row_norms_match_float64_sums_whatever_the_chunking(shape: tuple[int, int]) -> None:
    """psc's per-row norms: summed in float64 (numpy's own sums to rounding), and bit for bit the one-shot
    float64 sum the chunked loop replaced, for shapes under, across and off the chunk size."""
    import torch
    from sparse_dist.importance import squared_row_norms

    rows = torch.from_numpy(np.random.default_rng(shape[0]).standard_normal(shape).astype(np.float32) * 1e3)
    norms = squared_row_norms(rows)
    assert norms.dtype == np.float64 and norms.shape == (shape[0],)
    wide = rows.numpy().astype(np.float64)
    np.testing.assert_allclose(norms, (wide * wide).sum(axis=1), rtol=1e-12)
    assert np.array_equal(norms, rows.double().square().sum(dim=1).numpy())
    assert np.array_equal(squared_row_norms(rows[::2]), rows[::2].double().square().sum(dim=1).numpy())
