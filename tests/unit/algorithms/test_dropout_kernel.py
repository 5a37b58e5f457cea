"""The compiled dropout passes give exactly the written rule's values (algorithms/dropout.py's docstring).

The reference is built from the rule's text alone (tests/support/reference_gcn.py: each lane's SplitMix64 word of
the layer's key, four little-endian 16-bit lanes a word, kept when ``u ^ 0x8000 < T``), not from the library,
and is compared bitwise with the compiled kernels, with the NumPy and torch path they replace (small matrices,
and until compiled) and with the torch form CUDA falls back to: at widths that do not divide a word, on row
ranges that start mid-word, on gathered rows in any order, with one to five threads (a pass cut anywhere),
forward and backward, and P row ranges (with halo rows) against one process.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reference_gcn import dropout_key, dropout_keep_rows

from algorithms import dropout as dropout_module
from algorithms.dropout import (GlobalRowDropout, KeepRule, keep_mask, keep_mask_range_and_rows, keep_mask_rows,
                                row_runs, stream_key)
from sparse_dist import dropout_compiled as compiled_kernels
from sparse_dist import dropout_kernel as kernel
from sparse_dist.receiver_dropout import masked, zero_dropped_


@pytest.fixture(scope="module", autouse=True)
def compiled() -> None:
    kernel.warm_up()
    assert kernel.ready()


@pytest.fixture(params=["compiled", "numpy"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each library path in turn: the compiled kernels (at every size here), or the torch and NumPy passes used
    for small matrices and until the kernels are ready."""
    if request.param == "numpy":
        monkeypatch.setattr(kernel, "ready", lambda: False)
        monkeypatch.setattr(kernel, "loaded", lambda: False)
    else:
        monkeypatch.setattr(kernel, "MIN_ENTRIES", 0)
    return request.param


FORMS = ["auto", "torch"]  # the host rule, and the torch form (CUDA's fallback) run on the CPU


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bit patterns (so -0 differs from +0 and NaN equals itself)."""
    return t.contiguous().view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def specials(rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Normal values with -0, +0, NaN and +-inf sprinkled in (where multiply and fill differ)."""
    values = torch.randn(rows, width, dtype=dtype, generator=torch.Generator().manual_seed(rows * width))
    flat = values.view(-1)
    for k, special in enumerate([-0.0, 0.0, float("nan"), float("inf"), -float("inf"), -1.0]):
        flat[k::97] = special
    return values


def test_the_key_is_the_written_chain() -> None:
    for seed, epoch, layer in [(0, 0, 0), (11, 4, 2), (2**40, 7, 3)]:
        assert stream_key(seed, epoch, layer) == dropout_key(seed, epoch, layer)
    assert len({stream_key(1, e, l) for e in range(4) for l in range(4)}) == 16
    with pytest.raises(ValueError, match="must be >= 0"):
        stream_key(1, -1, 0)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("width", [1, 3, 37, 128])
def test_masks_are_the_written_rule_on_ranges_starting_mid_word(width: int, form: str, path: str) -> None:
    for first, count in [(0, 40), (5, 300), (1001, 3), (3, 1), (2**33 + 7, 9)]:
        got = keep_mask(11, 4, 2, first, count, width, 0.3, form=form)
        rows = np.arange(first, first + count)
        assert torch.equal(got, dropout_keep_rows(11, 4, 2, rows, width, 0.3)), (first, count)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("p", [0.5, 0.6, 1e-6])
def test_gathered_rows_in_any_order_with_repeats_are_the_written_rule(p: float, form: str, path: str) -> None:
    rows = np.array([30, 2, 3, 4, 31, 0, 90, 91, 92, 4, 7, 6, 200, 8, 2**35])  # runs, repeats, unsorted, far
    got = keep_mask_rows(5, 2, 3, rows, 37, p, form=form)
    assert torch.equal(got, dropout_keep_rows(5, 2, 3, rows, 37, p))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_drop_forward_and_backward_are_the_product_by_the_rule(dtype: torch.dtype, threads: int, path: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel, "_MIN_SHARE", 1000)  # small shares: every thread gets a piece, cut mid-row
    width = 37
    first, own = 113359 - 1000, 2500
    extra = np.array([5, 117359, 3, 4, 226719])  # halo rows: unsorted, runs of one and of two
    rows = np.concatenate([np.arange(first, first + own), extra])
    mask = dropout_keep_rows(8, 3, 0, rows, width, 0.5)
    h = specials(rows.size, width, dtype).requires_grad_(True)
    grad = specials(rows.size, width, dtype).flip(0)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = GlobalRowDropout(0.5, 8, 3, first).drop(h, 0, extra)
        out.backward(grad)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(bits(out), bits(torch.mul(h.detach(), mask)))
    assert torch.equal(bits(h.grad), bits(torch.mul(grad, mask)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_relu_drop_forward_and_backward_are_relu_then_fill(dtype: torch.dtype, path: str) -> None:
    width = 128
    first, count = 32768 - 700, 1500
    mask = dropout_keep_rows(4, 1, 2, np.arange(first, first + count), width, 0.5)
    z = specials(count, width, dtype).requires_grad_(True)
    grad = specials(count, width, dtype).flip(1)
    out = GlobalRowDropout(0.5, 4, 1, first).relu_drop(z, 2)
    out.backward(grad)
    expected = torch.relu(z.detach()).masked_fill_(~mask, 0)
    assert torch.equal(bits(out), bits(expected))
    assert torch.equal(bits(z.grad), bits(torch.ops.aten.threshold_backward(grad, expected, 0)))


def test_a_drop_keeps_no_mask_for_its_backward() -> None:
    """The compiled path makes the words again in the backward: what it keeps is the key and the runs."""
    h = torch.randn(kernel.MIN_ENTRIES // 64, 64, requires_grad=True)
    masking = GlobalRowDropout(0.5, 1, 1, 0)._masking(0, h)
    assert isinstance(masking, dropout_module._StreamOf)
    runs = masking.runs
    assert runs.lane.nbytes + runs.pos.nbytes + runs.length.nbytes < 1024


def test_small_passes_never_load_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under MIN_ENTRIES entries the compiled path is not even asked for where the kernels are not loaded (a short
    run on a small graph never imports numba)."""
    asked = []
    monkeypatch.setattr(kernel, "ready", lambda: asked.append(True) or True)
    monkeypatch.setattr(kernel, "loaded", lambda: False)
    h = torch.randn(kernel.MIN_ENTRIES // 64 - 1, 64)
    assert isinstance(GlobalRowDropout(0.5, 1, 1, 0)._masking(0, h), dropout_module._MaskOf)
    assert not asked
    assert isinstance(GlobalRowDropout(0.5, 1, 1, 0)._masking(0, torch.randn(kernel.MIN_ENTRIES // 64, 64)),
                      dropout_module._StreamOf) and asked


def test_set_up_loads_the_kernels_only_where_a_pass_will_use_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose largest pass reaches MIN_ENTRIES, or whose epochs of smaller passes reach MIN_RUN_LANES, loads
    the kernels at set-up, in the caller's thread (not beside its first epochs); a short run of small passes,
    CUDA and dtypes the kernels do not take load nothing."""
    loads: list[bool] = []
    monkeypatch.setattr(kernel, "load_now", lambda: loads.append(True) or 0.5)
    cpu = torch.device("cpu")
    small = kernel.MIN_ENTRIES - 1
    enough = -(-kernel.MIN_RUN_LANES // small)  # epochs of the small pass that reach MIN_RUN_LANES
    assert dropout_module.load_compiled_passes(small, cpu, torch.float32) is None and not loads
    assert dropout_module.load_compiled_passes(small, cpu, torch.float32, enough - 1) is None and not loads
    assert dropout_module.load_compiled_passes(kernel.MIN_ENTRIES, torch.device("cuda"), torch.float32) is None
    assert dropout_module.load_compiled_passes(kernel.MIN_ENTRIES, cpu, torch.float16) is None and not loads
    assert dropout_module.load_compiled_passes(kernel.MIN_ENTRIES, cpu, torch.float64) == 0.5 and loads == [True]
    assert dropout_module.load_compiled_passes(small, cpu, torch.float32, enough) == 0.5 and loads == [True] * 2


def test_loaded_kernels_take_small_passes_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once loaded (a long run's set-up), a pass from MIN_LOADED_ENTRIES lanes is compiled without asking for a
    load; smaller ones stay with NumPy and torch."""
    monkeypatch.setattr(kernel, "ready", lambda: pytest.fail("a small pass asked for a load"))
    monkeypatch.setattr(kernel, "loaded", lambda: True)
    drop = GlobalRowDropout(0.5, 1, 1, 0)
    assert isinstance(drop._masking(0, torch.randn(kernel.MIN_LOADED_ENTRIES // 64, 64)), dropout_module._StreamOf)
    assert isinstance(drop._masking(0, torch.randn(kernel.MIN_LOADED_ENTRIES // 64 - 1, 64)), dropout_module._MaskOf)


def test_load_now_leaves_the_kernels_ready() -> None:
    """After :func:`load_now` the passes are compiled at once (a second call costs nothing)."""
    assert kernel.load_now() is not None
    assert kernel.ready() and kernel.load_now() == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mask_passes_equal_torch_bitwise(dtype: torch.dtype, path: str) -> None:
    values = specials(300, 300, dtype)  # above one thread's share: two threads split it
    mask = keep_mask(1, 2, 3, 0, 300, 300, 0.4)
    assert torch.equal(bits(masked(values, mask)), bits(values * mask))
    filled = values.clone()
    zero_dropped_(filled, mask)
    assert torch.equal(bits(filled), bits(values.masked_fill(~mask, 0)))


def _splitmix_stream(key: int, count: int) -> np.ndarray:
    """The first ``count`` outputs of the sequential SplitMix64 generator seeded with ``key`` (Python ints)."""
    mask, state, out = (1 << 64) - 1, key, []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append(z ^ (z >> 31))
    return np.array(out, dtype=np.uint64)


def test_the_kernel_makes_the_splitmix64_generators_words_and_lanes() -> None:
    """KEEP at T = 2^15 + 1 keeps a lane exactly when its int16 is <= 0: the sign bits of the generator's words."""
    key = dropout_key(1, 2, 3)
    words = _splitmix_stream(key, 5000)
    out = np.zeros(4 * 5000 - 3, np.uint8)
    runs = [np.array([3]), np.array([0]), np.array([out.size])]  # starts mid-word, ends at the last lane
    compiled_kernels.apply_runs(np.uint64(key), *runs, out, out, KeepRule.of(0.5).threshold + 1, kernel.KEEP)
    assert np.array_equal(out.astype(bool), (words.view(np.int16) <= 0)[3:])


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_runs_in_any_order_cut_into_any_shares_give_the_same_lanes(count: int) -> None:
    """Runs out of lane order, cut into ``count`` shares anywhere (mid-run, mid-word): the same lanes."""
    key = dropout_key(9, 9, 9)
    words = _splitmix_stream(key, 3000)
    runs = kernel.LaneRuns(np.array([9000, 5, 4000, 4001, 11990]), np.array([0, 7, 1107, 1108, 1111]),
                           np.array([7, 1100, 1, 3, 10]))
    out = np.zeros(runs.lanes, np.uint8)
    shares = runs.shares(count)
    assert len(shares) == count and sum(share.lanes for share in shares) == runs.lanes
    for share in shares:
        compiled_kernels.apply_runs(np.uint64(key), share.lane, share.pos, share.length, out, out,
                                    KeepRule.of(0.5).threshold + 1, kernel.KEEP)
    expected = np.concatenate([(words.view(np.int16) <= 0)[a:a + n] for a, n in zip(runs.lane, runs.length)])
    assert np.array_equal(out.astype(bool), expected)


def test_row_runs_merge_consecutive_rows_only() -> None:
    runs = row_runs(10, 4, 3, np.array([9, 10, 11, 2, 2, 3]))
    assert runs.lane.tolist() == [40, 90, 20, 20] and runs.pos.tolist() == [0, 30, 60, 70]
    assert runs.length.tolist() == [30, 30, 10, 20]
    assert row_runs(10, 4, 0, None).lanes == 0


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (3, 1)])
@pytest.mark.parametrize("p", [0.0, 0.5])
def test_empty_and_tiny_inputs_and_p_zero(shape: tuple[int, int], p: float, path: str) -> None:
    h = specials(*shape, torch.float32) if 0 not in shape else torch.empty(shape)
    h.requires_grad_(True)
    mask = keep_mask(1, 1, 1, 7, shape[0], shape[1], p)
    out = GlobalRowDropout(p, 1, 1, 7).drop(h, 1)
    assert torch.equal(bits(out), bits(torch.mul(h.detach(), mask)))
    out.sum().backward()
    assert torch.equal(h.grad, mask.float())


@pytest.mark.parametrize("ranks", [2, 3, 5])
def test_p_ranks_mask_like_one_process(ranks: int, path: str) -> None:
    """Rows split over ``ranks`` ranges (cuts mid-word) and masked each with its own first row, halo rows from
    the other ranks appended, give exactly the rows of one process's pass."""
    width = 37
    rows = 3 * 113359 + 11
    z = specials(rows, width, torch.float32)
    whole_relu = GlobalRowDropout(0.5, 6, 2, 0).relu_drop(z, 1)
    whole = GlobalRowDropout(0.5, 6, 2, 0).drop(z, 0)
    cuts = np.linspace(0, rows, ranks + 1).astype(int)
    for first, end in zip(cuts[:-1], cuts[1:]):
        halo = np.concatenate([np.arange(0, first, 997), np.arange(end, rows, 1009)])[::-1].copy()
        piece = torch.cat([z[first:end], z[torch.from_numpy(halo)]])
        dropout = GlobalRowDropout(0.5, 6, 2, int(first))
        assert torch.equal(bits(dropout.relu_drop(z[first:end], 1)), bits(whole_relu[first:end]))
        dropped = dropout.drop(piece, 0, halo)
        assert torch.equal(bits(dropped), bits(torch.cat([whole[first:end], whole[torch.from_numpy(halo)]])))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("p", [0.5, 0.6, 1e-6])
def test_cuda_masks_are_the_cpu_masks(form: str, p: float) -> None:
    """On CUDA (CuPy's kernel where importable, and torch's form) the masks are the written rule's, bit for bit:
    a CUDA run draws the CPU run's masks."""
    for first, count, width in [(0, 40, 1), (5, 3000, 37), (2**33 + 7, 9, 128), (1, 20000, 256)]:
        got = keep_mask(11, 4, 2, first, count, width, p, "cuda", form=form)
        assert got.device.type == "cuda"
        assert torch.equal(got.cpu(), dropout_keep_rows(11, 4, 2, np.arange(first, first + count), width, p))
    rows = np.array([30, 2, 3, 4, 31, 0, 90, 91, 92, 4, 7, 6, 200, 8, 2**35])
    got = keep_mask_rows(5, 2, 3, rows, 37, p, "cuda", form=form)
    assert torch.equal(got.cpu(), dropout_keep_rows(5, 2, 3, rows, 37, p))


@pytest.mark.parametrize("pieces_of", [1, 100, 1 << 20])
def test_short_runs_gathered_in_pieces_are_the_written_rule(pieces_of: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The NumPy pass gathers a grid block's one-run-a-row lanes a piece at a time (bounded memory): pieces of one
    run, of runs cut at any lane count, and all at once give the rows' cut."""
    monkeypatch.setattr(kernel, "ready", lambda: False)
    monkeypatch.setattr(kernel, "_GATHERED_LANES", pieces_of)
    got = keep_mask(5, 0, 1, 77, 211, 37, 0.3, columns=(4, 31))
    assert torch.equal(got, dropout_keep_rows(5, 0, 1, np.arange(77, 288), 37, 0.3)[:, 4:31])


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("columns", [(0, 37), (0, 5), (5, 37), (13, 14), (20, 20)])
def test_a_column_block_is_the_cut_of_the_whole_rows(columns: tuple[int, int], form: str, path: str) -> None:
    """A grid rank's block (rows, a column range) is the written rule's rows cut to those columns, made alone."""
    c0, c1 = columns
    got = keep_mask(3, 1, 2, 1001, 300, 37, 0.5, form=form, columns=columns)
    assert got.shape == (300, c1 - c0)
    assert torch.equal(got, dropout_keep_rows(3, 1, 2, np.arange(1001, 1301), 37, 0.5)[:, c0:c1])
    with pytest.raises(ValueError, match="columns must satisfy"):
        keep_mask(3, 1, 2, 0, 3, 37, 0.5, columns=(5, 38))


def test_a_gpu_kernel_that_fails_leaves_torchs_form_with_the_same_bits(monkeypatch: pytest.MonkeyPatch,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Where CuPy's kernel was built but cannot run, the masks come from torch's form, said once in the log."""
    from algorithms import dropout_device

    monkeypatch.setattr(dropout_device, "_cupy_kernel", lambda device: object())  # launching it raises
    monkeypatch.setattr(dropout_device, "_failed", set())
    out = torch.empty(300, 37, dtype=torch.bool)
    with caplog.at_level("WARNING"):
        dropout_device.keep_range(stream_key(3, 1, 2), 1001, out, KeepRule.of(0.5).threshold)
    assert torch.equal(out, dropout_keep_rows(3, 1, 2, np.arange(1001, 1301), 37, 0.5))
    assert "CuPy's kernel failed" in caplog.text


@pytest.mark.parametrize("form", FORMS)
def test_a_range_then_gathered_rows_is_the_written_rule(form: str, path: str) -> None:
    """A rank's own rows then a static input's halo rows, in one mask: the range's rows, then the gathered ones."""
    halo = np.array([5, 117359, 3, 4, 2**34])
    got = keep_mask_range_and_rows(8, 3, 0, 1000, 250, halo, 37, 0.5, form=form)
    assert torch.equal(got, dropout_keep_rows(8, 3, 0, np.concatenate([np.arange(1000, 1250), halo]), 37, 0.5))
    assert keep_mask_range_and_rows(8, 3, 0, 1000, 0, np.empty(0, np.int64), 37, 0.5, form=form).shape == (0, 37)
