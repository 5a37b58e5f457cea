"""The compiled (numba) per-row sampler is bitwise the numpy reference (sparse_dist/sampling.py:sample_rows):
over many keys, fanouts (0, 1, below, at and above the degrees, all), degrees 0 to thousands, duplicated
columns, int32 and int64 indices, float32 and float64 values, repeated and unordered wanted rows,
an owner whose rows start past 0, one and two threads; the compiled block assembly against numpy's; and
through the single-rank sampler, batches sampled in groups of K. The JIT happens when the sampler is built,
never while it samples."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

pytest.importorskip("numba")

from sparse_dist import sampling_compiled  # noqa: E402
from sparse_dist.comm import world  # noqa: E402
from sparse_dist.layout import RowLayout  # noqa: E402
from sparse_dist.sampling import (DistributedSampler, assemble_block, reorder_rows, resolve_sampler,  # noqa: E402
                                  sample_rows, sampling_key)
from sparse_dist.sampling_compiled import (BlockColumns, reorder_rows_compiled, sample_rows_compiled,  # noqa: E402
                                           sample_rows_into)


def rows_of_every_degree(first_row: int = 0, seed: int = 0, index_dtype=np.int32, value_dtype=np.float64,
                         duplicates: bool = True) -> sp.csr_matrix:
    """Rows of degree 0, 1, ..., 40, then 200 and 3000 (a hub), over 4000 columns; with ``duplicates`` some
    rows store a column twice (a non-canonical CSR: the draws pick positions, not columns)."""
    rng = np.random.default_rng(seed)
    degrees = list(range(41)) + [200, 3000, 0, 7]
    columns, values, indptr = [], [], [0]
    for degree in degrees:
        mine = rng.choice(4000, size=degree, replace=False)
        if duplicates and degree >= 6:
            mine[-2:] = mine[:2]  # two columns stored twice
        columns.append(mine)
        values.append(rng.random(degree) + 0.25)
        indptr.append(indptr[-1] + degree)
    matrix = sp.csr_matrix((np.concatenate(values).astype(value_dtype), np.concatenate(columns).astype(index_dtype),
                            np.asarray(indptr, dtype=index_dtype)), shape=(len(degrees), 4000))
    matrix.indices, matrix.indptr = matrix.indices.astype(index_dtype), matrix.indptr.astype(index_dtype)  # scipy
    return matrix  # may have downcast them


def assert_bitwise(reference: tuple, compiled: tuple) -> None:
    for want, got in zip(reference, compiled, strict=True):
        assert want.dtype == got.dtype and want.shape == got.shape
        assert np.array_equal(want.view(np.uint8), got.view(np.uint8))  # bitwise, NaN-free or not


@pytest.mark.parametrize("index_dtype,value_dtype", [(np.int32, np.float64), (np.int64, np.float32)])
def test_compiled_rows_are_bitwise_the_numpy_reference(index_dtype, value_dtype) -> None:
    first_row = 1000  # the owner's rows are global rows 1000 ...
    rows = rows_of_every_degree(index_dtype=index_dtype, value_dtype=value_dtype)
    rng = np.random.default_rng(7)
    every = np.arange(rows.shape[0]) + first_row
    shuffled_with_repeats = rng.choice(every, size=3 * every.size)
    checked = 0
    for wanted in (every, shuffled_with_repeats, every[:0], every[[41, 41, 42]]):
        for fanout in (0, 1, 2, 3, 5, 15, 40, 199, 200, 201, 2999, 3000, None):
            for seed, epoch, step, layer in ((0, 0, 0, 0), (1, 2, 3, 1), (9, 17, 250, 2), (2**40, 5, 1, 0)):
                key = sampling_key(seed, epoch, step, layer)
                reference = sample_rows(rows, first_row, wanted, fanout, key)
                for threads in (1, 2):
                    assert_bitwise(reference, sample_rows_compiled(rows, first_row, wanted, fanout, key, threads))
                checked += 1
    assert checked == 4 * 13 * 4


def test_many_keys_on_a_random_graph() -> None:
    """200 keys, fanouts 1-15, a random graph whose rows have degrees around 10 (most rows sampled)."""
    rng = np.random.default_rng(3)
    a = sp.random(500, 500, density=0.02, format="csr", random_state=rng)
    a.data = rng.random(a.nnz)
    wanted = rng.permutation(500)[:300]
    for draw in range(200):
        key = sampling_key(draw, draw // 7, draw % 11, draw % 3)
        fanout = 1 + draw % 15
        assert_bitwise(sample_rows(a, 0, wanted, fanout, key), sample_rows_compiled(a, 0, wanted, fanout, key, 2))


def test_draws_that_collide_often_and_rows_far_above_the_fanout_match_the_reference() -> None:
    """Floyd's draw takes ``j`` itself where ``t`` was drawn before: often where ``k`` is close to ``d`` (rows of
    21 and 22 entries at fanout 20), rarely on rows of 60, 200 and 3000 entries; a row storing one column many
    times keeps positions, not columns. Every case against the numpy reference, over 60 keys and fanouts 1-20."""
    rng = np.random.default_rng(11)
    rows = []
    rows.append(np.full(50, 7))  # one column fifty times
    rows.append(np.repeat([3, 9], 25))  # two columns, each 25 times
    rows.append(rng.choice(4000, size=21, replace=False))
    rows.append(rng.choice(4000, size=22, replace=False))
    rows.append(rng.choice(4000, size=60, replace=False))
    rows.append(rng.choice(4000, size=200, replace=False))
    rows.append(rng.choice(4000, size=3000, replace=False))
    indptr = np.concatenate(([0], np.cumsum([r.size for r in rows])))
    matrix = sp.csr_matrix((rng.random(indptr[-1]) + 0.5, np.concatenate(rows), indptr), shape=(len(rows), 4000))
    wanted = np.arange(len(rows))
    for draw in range(60):
        key = sampling_key(draw, 3, draw % 5, draw % 3)
        for fanout in (1, 2, 5, 11, 20):
            assert_bitwise(sample_rows(matrix, 0, wanted, fanout, key),
                           sample_rows_compiled(matrix, 0, wanted, fanout, key, 2))


def test_every_subset_of_a_row_is_equally_likely() -> None:
    """A row of 6 entries at fanout 3 over 40,000 keys: each of its 20 subsets within 5 standard errors of
    2,000 draws (uniform without replacement, so each entry is kept with probability k / d); a draw that kept
    ``t`` where it had been drawn before (a duplicate) or favoured low positions fails it."""
    draws = 40_000  # rows alike, each with its own id: independent draws in one call
    rows = sp.csr_matrix((np.ones(6 * draws), np.tile(np.arange(6) * 10, draws), np.arange(draws + 1) * 6),
                         shape=(draws, 60))
    kept, columns, _ = sample_rows_compiled(rows, 0, np.arange(draws), 3, sampling_key(4, 1, 2, 0), 2)
    picked = columns.reshape(draws, 3)
    assert np.all(kept == 3) and np.all(np.diff(picked, axis=1) > 0)  # distinct, in storage order
    subsets, counts = np.unique(picked, axis=0, return_counts=True)
    expected = draws / 20
    spread = (expected * (1 - 1 / 20)) ** 0.5
    assert len(subsets) == 20 and np.all(np.abs(counts - expected) <= 5 * spread), counts


def test_sampling_into_slices_of_one_buffer_is_sampling_alone() -> None:
    """The sampler writes a row set's columns and values into views of one int64 answer buffer."""
    rows = rows_of_every_degree(first_row=0)
    wanted = np.arange(rows.shape[0])
    key = sampling_key(4, 1, 2, 0)
    kept, columns, values = sample_rows_compiled(rows, 0, wanted, 5, key, 2)
    buffer = np.full(3 + 2 * columns.size, -1, dtype=np.int64)  # three words before: an offset into it
    sample_rows_into(rows, 0, wanted, 5, key, 2, kept, buffer[3:3 + columns.size],
                     buffer[3 + columns.size:].view(np.float64))
    assert np.array_equal(buffer[:3], [-1, -1, -1]) and np.array_equal(buffer[3:3 + columns.size], columns)
    assert np.array_equal(buffer[3 + columns.size:].view(np.float64), values)


def test_compiled_reorder_is_scipys() -> None:
    """Rows permuted by the compiled kernel and by scipy's row indexing: the same arrays, empty rows too."""
    rng = np.random.default_rng(4)
    for n in (0, 1, 7, 300):
        kept = rng.integers(0, 6, size=n)
        columns = rng.integers(0, 50, size=int(kept.sum()))
        values = rng.random(columns.size)
        order = rng.permutation(n)
        want, got = reorder_rows((kept, columns, values), order), reorder_rows_compiled((kept, columns, values), order)
        for x, y in zip(want, got, strict=True):
            assert x.dtype == y.dtype and np.array_equal(x, y)


def single_rank_sampler(kernel: str, rows: sp.csr_matrix, fanouts: list) -> DistributedSampler:
    comm = world(gpu_aware="off")
    layout = RowLayout.from_counts([rows.shape[0]] * comm.size) if comm.size == 1 else None
    assert layout is not None, "a single-process test"
    return DistributedSampler(comm, layout, 0, rows, fanouts, seed=11, kernel=kernel, threads=2)


def test_bulk_sampling_with_either_kernel_makes_bitwise_the_same_blocks() -> None:
    """``sample_many`` of K = 1, 3 and 5 batches (--sample-batches K): the numba sampler's blocks are the
    numpy one's, bitwise, and every batch is the one sampled alone."""
    rng = np.random.default_rng(5)
    a = sp.random(300, 300, density=0.05, format="csr", random_state=rng)
    a = (a + sp.eye(300)).tocsr()
    numba_sampler, numpy_sampler = (single_rank_sampler(kernel, a, [4, 2, None]) for kernel in ("numba", "numpy"))
    assert (numba_sampler.kernel, numpy_sampler.kernel) == ("numba", "numpy")
    seeds = [rng.choice(300, size=12, replace=False) for _ in range(5)]
    for k in (1, 3, 5):
        steps = list(range(10, 10 + k))
        got, want = (s.sample_many(seeds[:k], 3, steps) for s in (numba_sampler, numpy_sampler))
        alone = [numba_sampler.sample(seeds[b], 3, steps[b]) for b in range(k)]
        for blocks in (want, alone):
            for batch_got, batch_want in zip(got, blocks, strict=True):
                for x, y in zip(batch_got, batch_want, strict=True):
                    assert np.array_equal(x.dst, y.dst) and np.array_equal(x.src, y.src)
                    for field in ("indptr", "indices", "data"):
                        assert np.array_equal(getattr(x.matrix, field), getattr(y.matrix, field))


def square(rows: sp.csr_matrix) -> sp.csr_matrix:
    """``rows`` followed by empty rows up to its column count: a graph whose every column is a row."""
    padded = sp.csr_matrix((rows.shape[1], rows.shape[1]), dtype=rows.dtype)
    padded.indptr = np.concatenate([rows.indptr, np.full(rows.shape[1] - rows.shape[0], rows.indptr[-1])]).astype(
        rows.indptr.dtype)
    padded.indices, padded.data = rows.indices.copy(), rows.data.copy()
    return padded


def test_the_kernel_is_compiled_when_the_sampler_is_built_not_while_it_samples() -> None:
    a = square(rows_of_every_degree(duplicates=False, index_dtype=np.int64, value_dtype=np.float32))
    sampler = single_rank_sampler("numba", a, [3])
    kernels = (sampling_compiled._sample_kernel, sampling_compiled._block_columns_kernel)
    compiled = [list(kernel.signatures) for kernel in kernels]
    assert all(compiled)  # built (or loaded from numba's cache) by the constructor
    sampler.sample(np.arange(a.shape[0]), 0, 0)
    assert [list(kernel.signatures) for kernel in kernels] == compiled  # no JIT while sampling


def test_kernel_names_resolve() -> None:
    assert resolve_sampler("numpy") == "numpy"
    assert resolve_sampler("numba") == resolve_sampler("auto") == "numba"  # numba is importable here
    with pytest.raises(ValueError, match="sampler must be one of auto, numba, numpy, got 'c'"):
        resolve_sampler("c")


def test_a_wrong_count_writes_no_entry_outside_its_rows_slot() -> None:
    """The kernel checks each row's count as it samples it: a row whose ``kept`` is not its own writes nothing,
    every other row writes only its own slot, and the caller refuses the call; entries beyond the slots (a
    buffer longer than the counts) stay as they were."""
    rows = rows_of_every_degree(duplicates=False)
    wanted = np.arange(rows.shape[0])
    key = sampling_key(4, 1, 2, 0)
    kept, columns, values = sample_rows_compiled(rows, 0, wanted, 5, key, 2)
    wrong = kept.copy()
    wrong[3] += 1  # row 3 (degree 3) claims a fourth entry: its slot and every later one shift by one
    total = int(wrong.sum())
    sentinel = -7
    out_columns, out_values = np.full(total + 50, sentinel, dtype=np.int64), np.full(total + 50, float(sentinel))
    with pytest.raises(ValueError, match="kept must be kept_per_row of the wanted rows"):
        sample_rows_into(rows, 0, wanted, 5, key, 2, wrong, out_columns, out_values)
    assert (out_columns[total:] == sentinel).all() and (out_values[total:] == sentinel).all()
    starts, right = (np.concatenate(([0], np.cumsum(counts))) for counts in (wrong, kept))
    assert (out_columns[starts[3]:starts[4]] == sentinel).all()  # the wrong row wrote nothing
    for row in (0, 2, 4, 40, wanted.size - 1):  # the others wrote their own entries in their own slots
        assert np.array_equal(out_columns[starts[row]:starts[row] + kept[row]], columns[right[row]:right[row + 1]])


def test_compiled_block_columns_are_bitwise_numpys_assembly() -> None:
    """The requester's side: the block's source ids (destinations first, then the new ids increasing) and
    column positions, compiled, against assemble_block's numpy lines; no rows, no new ids, all new ids; few
    new ids (sorted) and many (read off the marks in order)."""
    rng = np.random.default_rng(9)
    n = 1000
    cases = [(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))]
    for size, entries in ((1, 0), (5, 40), (100, 1500), (600, 5000)):
        dst = rng.choice(n, size=size, replace=False).astype(np.int64)
        cases.append((dst, rng.integers(0, n, size=entries)))
        cases.append((dst, rng.choice(dst, size=entries)))  # only destinations: no new id
    block_columns = BlockColumns(n)  # one set of marks through every case: each call leaves them clean
    for dst, columns in cases + cases[::-1]:
        kept = np.full(dst.size, 0, dtype=np.int64)
        if dst.size:
            kept[0] = columns.size
        values = rng.random(columns.size)
        want = assemble_block(dst, kept, columns, values)
        got = assemble_block(dst, kept, columns, values, block_columns=block_columns)
        assert np.array_equal(want.src, got.src) and want.src.dtype == got.src.dtype
        wide = sampling_compiled._block_columns_kernel(dst.astype(np.int64), columns.astype(np.int64),
                                                       np.zeros(n, dtype=np.int64))  # marks beyond 2^31 ids
        assert np.array_equal(wide[0], got.src) and np.array_equal(wide[1], got.matrix.indices)
        for field in ("indptr", "indices", "data"):
            assert np.array_equal(getattr(want.matrix, field), getattr(got.matrix, field))


def test_ids_outside_the_rows_are_refused_before_a_kernel_writes() -> None:
    """The compiled kernels write unchecked, so their callers check: a sampler built on rows whose columns
    are not rows of its layout, rows asked of an owner that does not hold them (below, which numpy would
    wrap around, and above), a ``kept`` that is not the rows' own, a buffer too small, and block ids out of
    range (the marks left clean, as the next call shows)."""
    rows = rows_of_every_degree(duplicates=False)  # 45 rows over 4000 columns: not a graph of its own
    with pytest.raises(ValueError, match=r"a sampler's rows must be the 45 rows its rank owns with column ids in "
                                         r"\[0, 45\), got 45 rows of 4000 columns"):
        single_rank_sampler("numba", rows, [3])
    key = sampling_key(4, 1, 2, 0)
    for wanted in (np.array([12, 9]), np.array([54, 55])):  # the owner holds 10..54
        for kernel in (sample_rows, lambda *args: sample_rows_compiled(*args, 2)):
            with pytest.raises(IndexError, match=r"rows asked of this rank must lie in \[10, 55\)"):
                kernel(rows, 10, wanted, 5, key)
    wanted = np.arange(rows.shape[0])
    kept, columns, values = sample_rows_compiled(rows, 0, wanted, 5, key, 2)
    with pytest.raises(ValueError, match="kept must be kept_per_row of the wanted rows"):
        sample_rows_into(rows, 0, wanted, 5, key, 2, np.maximum(kept - 1, 0), columns, values)
    with pytest.raises(ValueError, match=f"columns and values must hold {columns.size} entries"):
        sample_rows_into(rows, 0, wanted, 5, key, 2, kept, columns[:-1], values)
    block_columns = BlockColumns(100)
    dst = np.array([5, 7])
    for columns in (np.array([5, 100]), np.array([-1, 7]), np.array([7, 99, 3, 1000])):
        with pytest.raises(IndexError, match=r"block ids must lie in \[0, n_global\)"):
            block_columns(dst, columns)
    src, positions = block_columns(dst, np.array([99, 5, 3, 99]))
    assert src.tolist() == [5, 7, 3, 99] and positions.tolist() == [3, 0, 2, 3]
