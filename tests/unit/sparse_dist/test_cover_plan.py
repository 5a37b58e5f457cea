"""The cover plan's arithmetic without MPI: König covers against brute force, never above p2p on several graphs
and partitions, its byte model, and what it refuses (flags, policies, the guard's tightened policies).
Exactness and counted == predicted bytes under mpiexec: tests/mpi/test_cover.py."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from algorithms.policies import AxisSpec, PolicySpec
from algorithms.policies.base import RunShape
from sparse_dist.cover_sets import (MatchedBlock, block_checksum, block_fingerprint, konig_cover,
                                    cover_counts_of_rows, entries_of_rows, pre_aggregated,
                                    pre_aggregated_of_transpose)
from sparse_dist.layout import Grid, RowLayout
from sparse_dist.plans import PLAN_NAMES, plan_class
from sparse_dist.predict import predict_spmm_bytes


def brute_force_cover(dense: np.ndarray) -> int:
    m, n = dense.shape
    for size in range(m + n + 1):
        for chosen in itertools.combinations(range(m + n), size):
            rows = [k for k in chosen if k < m]
            cols = [k - m for k in chosen if k >= m]
            covered = np.zeros_like(dense)
            covered[rows, :] = True
            covered[:, cols] = True
            if not (dense & ~covered).any():
                return size
    raise AssertionError("unreachable")


def test_konig_covers_are_minimum_and_cover_every_nonzero() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        m, n = rng.integers(1, 7, 2)
        block = sp.random(m, n, density=rng.random(), format="csr", random_state=rng)
        cover = konig_cover(block)
        dense = block.toarray() != 0
        covered = np.zeros_like(dense)
        covered[cover.rows, :] = True
        covered[:, cover.columns] = True
        assert not (dense & ~covered).any()
        assert cover.size == brute_force_cover(dense)
        assert cover.size <= min(np.unique(block.indices).size, np.count_nonzero(np.diff(block.indptr)))


def test_a_star_is_one_row_and_all_columns_win_ties() -> None:
    star = sp.csr_matrix(np.array([[1, 1, 1, 1], [0, 0, 0, 0]], dtype=float))  # one row of p, four columns of q
    cover = konig_cover(star)
    assert cover.rows.tolist() == [0] and cover.columns.size == 0
    diagonal = sp.identity(3, format="csr")  # a matching: columns and rows tie; the columns are taken
    cover = konig_cover(diagonal)
    assert cover.columns.tolist() == [0, 1, 2] and cover.rows.size == 0


def test_fingerprints_see_a_transpose_and_a_changed_value() -> None:
    rng = np.random.default_rng(1)
    block = sp.random(5, 7, density=0.4, format="csr", random_state=rng)
    flipped = sp.csr_matrix(block.T)
    assert block_fingerprint(block) == block_fingerprint(flipped, transposed=True)
    changed = block.copy()
    changed.data[0] += 1e-12
    assert block_fingerprint(changed) != block_fingerprint(block)


def scrambled(block: sp.csr_matrix, rng: np.random.Generator) -> sp.csr_matrix:
    """The same pattern stored unsorted within rows and with a few entries twice (not canonical)."""
    coo = block.tocoo()
    order = np.lexsort((rng.random(coo.nnz), coo.row))  # rows ascending, columns shuffled within a row
    twice = order[: min(3, order.size)]
    rows, cols = np.concatenate((coo.row[order], coo.row[twice])), np.concatenate((coo.col[order], coo.col[twice]))
    by_row = np.argsort(rows, kind="stable")
    indptr = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=block.shape[0]))))
    return sp.csr_matrix((np.ones(rows.size), cols[by_row], indptr), shape=block.shape)


def test_one_matching_gives_the_transposes_cover_bitwise() -> None:
    """A cover depends on the pattern only (not on which maximum matching found it): the owner's cover of
    ``B^T`` from the receiver's matching of ``B`` equals a fresh ``konig_cover(B^T)``, sorted or not; and its
    partial-sum entries read from the held ``B`` equal those of ``B^T`` formed in full."""
    rng = np.random.default_rng(2)
    for trial in range(400):
        m, n = rng.integers(1, 25, 2)
        block = sp.random(m, n, density=rng.random() * 0.4, format="csr", random_state=rng)
        if trial % 3 == 0:
            block = scrambled(block, rng)
        matched = MatchedBlock(block)
        for got, want in ((matched.cover(), konig_cover(block)),
                          (matched.transposed_cover(), konig_cover(sp.csr_matrix(block.T)))):
            assert np.array_equal(got.columns, want.columns) and np.array_equal(got.rows, want.rows)
        if trial % 3:  # canonical blocks, as a plan holds them: the owner's partial-sum entries, both ways
            transpose = sp.csr_matrix(block.T)
            cover = matched.transposed_cover()
            got_rows, want_rows = pre_aggregated_of_transpose(block, cover), pre_aggregated(transpose, cover)
            for part in ("indptr", "indices", "data"):
                assert np.array_equal(getattr(got_rows, part), getattr(want_rows, part))
    flipped = MatchedBlock(sp.csr_matrix(np.array([[1, 1, 1, 1], [0, 0, 0, 0]], dtype=float))).transposed_cover()
    assert flipped.columns.tolist() == [0] and flipped.rows.size == 0  # the star's transpose: one column wins


def test_checksums_and_entry_positions() -> None:
    rng = np.random.default_rng(3)
    block = sp.random(6, 9, density=0.5, format="csr", random_state=rng)
    assert block_checksum(block) == block_checksum(sp.csr_matrix(block.T))
    rows = np.array([4, 0, 4], dtype=np.int64)
    want = np.concatenate([np.arange(block.indptr[r], block.indptr[r + 1]) for r in rows])
    assert np.array_equal(entries_of_rows(block.indptr, rows), want)


def power_law(n: int, seed: int) -> sp.csr_matrix:
    """A small R-MAT-like graph (skewed degrees), symmetrised."""
    rng = np.random.default_rng(seed)
    src = np.minimum((rng.pareto(1.2, 8 * n) * 3).astype(np.int64), n - 1)
    dst = rng.integers(0, n, 8 * n)
    a = sp.csr_matrix((np.ones(src.size), (src, dst)), shape=(n, n))
    a = ((a + a.T) > 0).astype(float)
    perm = rng.permutation(n)
    return sp.csr_matrix(a[perm][:, perm])


@pytest.mark.parametrize("graph", ["power-law", "uniform", "directed"])
@pytest.mark.parametrize("parts", [2, 3, 4, 8])
def test_cover_never_moves_more_rows_than_p2p(graph: str, parts: int) -> None:
    n = 300
    rng = np.random.default_rng(parts)
    if graph == "power-law":
        a = power_law(n, parts)
    elif graph == "uniform":
        a = sp.random(n, n, density=0.02, format="csr", random_state=rng)
    else:
        a = sp.random(n, n, density=0.03, format="csr", random_state=rng)
        a = sp.csr_matrix(a[:, :])
    counts = np.diff(np.linspace(0, n, parts + 1).astype(int)) if parts != 3 else np.array([150, 0, 150])
    layout = RowLayout.from_counts([int(c) for c in counts])
    offsets = np.asarray(layout.offsets, dtype=np.int64)
    cover = np.zeros((parts, parts), dtype=np.int64)
    boundary = np.zeros((parts, parts), dtype=np.int64)
    for g in range(parts):
        rows = a[offsets[g]:offsets[g + 1]]
        cover[g] = cover_counts_of_rows(rows, offsets, g)
        for j in range(parts):
            if j != g:
                cols = rows.indices[(rows.indices >= offsets[j]) & (rows.indices < offsets[j + 1])]
                boundary[g, j] = np.unique(cols).size
    assert np.all(cover <= boundary)
    if graph == "power-law" and parts >= 2:
        assert cover.sum() < boundary.sum()  # hubs make some pair's cover smaller than its columns
    union = np.zeros(parts, dtype=np.int64)
    grid = Grid(parts, 1)
    p2p = predict_spmm_bytes(grid, layout, boundary, union, "p2p", 16, 8)
    mine = predict_spmm_bytes(grid, layout, boundary, union, "cover", 16, 8, pair_counts=cover)
    for phase in ("forward", "backward"):
        assert np.all(mine[phase] <= p2p[phase])
        assert mine[phase][:, 0].sum() == cover.sum() * 16 * 8  # every moved row counted once each way
    assert np.array_equal(mine["forward"][:, ::-1], mine["backward"])


def test_the_byte_model_asks_for_the_covers() -> None:
    layout = RowLayout.from_counts([2, 2])
    with pytest.raises(ValueError, match="pass pair_counts"):
        predict_spmm_bytes(Grid(2, 1), layout, np.zeros((2, 2), np.int64), np.zeros(2, np.int64), "cover", 4, 4)


def test_cover_is_a_plan_name_and_refuses_in_one_sentence() -> None:
    assert "cover" in PLAN_NAMES
    cover = plan_class("cover")
    assert cover.run_refusal(attention=True).startswith("--plan cover")
    assert "--dropout-side owner" in cover.run_refusal(receiver_dropout=True)
    assert cover.run_refusal() is None
    for name in PLAN_NAMES:
        if name != "cover":
            assert plan_class(name).run_refusal(attention=True, receiver_dropout=True) is None


@pytest.mark.parametrize("sample,stale,refused", [
    ("bns:keep=0.5", "none", True), ("psc:budget=0.5", "none", True), ("dgs:nodes=0.5", "none", True),
    ("none", "sancus-e:eps=1", True), ("none", "pipe:tau=1", False), ("none", "pipe:tau=2,gamma=0.9", False),
    ("none", "none", False)])
def test_policies_on_cover(sample: str, stale: str, refused: bool) -> None:
    spec = PolicySpec(AxisSpec.parse("sample", sample), AxisSpec.parse("stale", stale))
    problem = spec.refusal(RunShape(plan="cover"))
    assert bool(problem) == refused, problem
    if refused:
        assert problem.count(". ") == 0  # one sentence


@pytest.mark.parametrize("stale", ["pipe:tau=3", "pipe:tau=2,gamma=0.9", "pipe:tau=1"])
def test_the_guard_never_tightens_into_a_refused_combination(stale: str) -> None:
    from algorithms.training.tighten import ActivePolicies
    policies = ActivePolicies(AxisSpec.parse("sample", "none"), AxisSpec.parse("stale", stale), "int8")
    while not policies.is_exact:
        spec = PolicySpec(policies.sample, policies.stale)
        assert spec.refusal(RunShape(plan="cover")) is None, policies.text
        policies = policies.tightened()
