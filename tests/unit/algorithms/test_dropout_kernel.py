"""The compiled dropout passes give exactly the written rule's values (algorithms/dropout.py's docstring).

The reference below is built from the rule's text alone (SFC64 words of ``SeedSequence((seed, epoch, layer,
chunk))``, four little-endian int16 lanes a word, kept when ``s + 2^15 < T``), not from the library, and is
compared bitwise with the compiled kernels and with the NumPy and torch path they replace (small matrices, and
until compiled): at widths that do not divide a chunk, on row ranges that start mid-chunk and cross chunk edges,
on gathered rows in any order, with one and two threads, forward and backward, and P row ranges (with halo
rows) against one process.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from algorithms import dropout as dropout_module
from algorithms.dropout import LANES_PER_CHUNK, GlobalRowDropout, KeepRule, keep_mask, keep_mask_rows
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
    else:
        monkeypatch.setattr(kernel, "MIN_ENTRIES", 0)
    return request.param


def reference_keep(seed: int, epoch: int, layer: int, rows: np.ndarray, width: int, p: float,
                   lanes_per_chunk: int = LANES_PER_CHUNK) -> torch.Tensor:
    """Keep mask of global ``rows`` (``len(rows) x width``), straight from the written rule."""
    per_chunk = max(1, lanes_per_chunk // width)
    threshold = max(1, round((1.0 - p) * 65536))
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty((rows.size, width), dtype=bool)
    for chunk in np.unique(rows // per_chunk).tolist():
        here = np.flatnonzero(rows // per_chunk == chunk)
        firsts = (rows[here] - chunk * per_chunk) * width
        stream = np.random.SFC64(np.random.SeedSequence((seed, epoch, layer, chunk)))
        words = stream.random_raw((int(firsts.max()) + width + 3) // 4)  # the chunk's words up to the last lane needed
        signed = words.astype("<u8").view("<i2").astype(np.int64)
        for k, first in zip(here.tolist(), firsts.tolist()):
            out[k] = signed[first:first + width] + 32768 < threshold
    return torch.from_numpy(out)


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


@pytest.mark.parametrize("width", [1, 3, 37, 128])
def test_masks_are_the_written_rule_on_ranges_starting_mid_chunk(width: int, path: str) -> None:
    lanes = 7 * 37 + 5  # small chunks whose lane count no width here divides
    per_chunk = max(1, lanes // width)
    for first, count in [(0, 40), (per_chunk // 2 + 1, 3 * per_chunk), (5 * per_chunk - 1, 2), (3, 1)]:
        got = keep_mask(11, 4, 2, first, count, width, 0.3, lanes_per_chunk=lanes)
        rows = np.arange(first, first + count)
        assert torch.equal(got, reference_keep(11, 4, 2, rows, width, 0.3, lanes)), (first, count)


def test_masks_are_the_written_rule_at_the_real_chunk_size(path: str) -> None:
    width = 37  # 2^22 = 113359 * 37 + 9: rows never align with words at a chunk edge
    edge = LANES_PER_CHUNK // width
    rows = np.arange(edge - 50, edge + 70)
    got = keep_mask(2, 9, 1, int(rows[0]), rows.size, width, 0.5)
    assert torch.equal(got, reference_keep(2, 9, 1, rows, width, 0.5))


@pytest.mark.parametrize("p", [0.5, 0.6, 1e-6])
def test_gathered_rows_in_any_order_with_repeats_are_the_written_rule(p: float, path: str) -> None:
    lanes = 7 * 37 + 5
    rows = np.array([30, 2, 3, 4, 31, 0, 90, 91, 92, 4, 7, 6, 200, 8])  # runs, repeats, several chunks, unsorted
    got = keep_mask_rows(5, 2, 3, rows, 37, p, lanes_per_chunk=lanes)
    assert torch.equal(got, reference_keep(5, 2, 3, rows, 37, p, lanes))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_drop_forward_and_backward_are_the_product_by_the_rule(dtype: torch.dtype, threads: int, path: str) -> None:
    width = 37
    edge = LANES_PER_CHUNK // width
    first, own = edge - 1000, 2500  # two chunks, starting mid-chunk
    extra = np.array([5, edge + 4000, 3, 4, 2 * edge + 1])  # halo rows: other chunks, unsorted
    rows = np.concatenate([np.arange(first, first + own), extra])
    mask = reference_keep(8, 3, 0, rows, width, 0.5)
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
    edge = LANES_PER_CHUNK // width
    first, count = edge - 700, 1500
    mask = reference_keep(4, 1, 2, np.arange(first, first + count), width, 0.5)
    z = specials(count, width, dtype).requires_grad_(True)
    grad = specials(count, width, dtype).flip(1)
    out = GlobalRowDropout(0.5, 4, 1, first).relu_drop(z, 2)
    out.backward(grad)
    expected = torch.relu(z.detach()).masked_fill_(~mask, 0)
    assert torch.equal(bits(out), bits(expected))
    assert torch.equal(bits(z.grad), bits(torch.ops.aten.threshold_backward(grad, expected, 0)))


def test_a_drop_keeps_no_mask_for_its_backward() -> None:
    """The compiled path draws the words again in the backward: what it keeps is the streams' states and runs."""
    h = torch.randn(kernel.MIN_ENTRIES // 64, 64, requires_grad=True)
    masking = GlobalRowDropout(0.5, 1, 1, 0)._masking(0, h)
    assert isinstance(masking, dropout_module._StreamOf)
    assert all(isinstance(item, kernel.ChunkRuns) for item in masking.runs)
    assert sum(item.state.nbytes + item.lane.nbytes + item.pos.nbytes + item.length.nbytes
               for item in masking.runs) < 1024


def test_small_passes_never_load_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under one chunk of entries the compiled path is not even asked for (a small graph never imports numba)."""
    asked = []
    monkeypatch.setattr(kernel, "ready", lambda: asked.append(True) or True)
    h = torch.randn(kernel.MIN_ENTRIES // 64 - 1, 64)
    assert isinstance(GlobalRowDropout(0.5, 1, 1, 0)._masking(0, h), dropout_module._MaskOf)
    assert not asked
    assert isinstance(GlobalRowDropout(0.5, 1, 1, 0)._masking(0, torch.randn(kernel.MIN_ENTRIES // 64, 64)),
                      dropout_module._StreamOf) and asked


def test_set_up_loads_the_kernels_only_where_a_pass_will_use_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose largest pass reaches one chunk loads the kernels at set-up, in the caller's thread (not beside
    its first epochs); small passes, CUDA and dtypes the kernels do not take load nothing."""
    loads: list[bool] = []
    monkeypatch.setattr(kernel, "load_now", lambda: loads.append(True) or 0.5)
    cpu = torch.device("cpu")
    assert dropout_module.load_compiled_passes(kernel.MIN_ENTRIES - 1, cpu, torch.float32) is None and not loads
    assert dropout_module.load_compiled_passes(kernel.MIN_ENTRIES, torch.device("cuda"), torch.float32) is None
    assert dropout_module.load_compiled_passes(kernel.MIN_ENTRIES, cpu, torch.float16) is None and not loads
    assert dropout_module.load_compiled_passes(kernel.MIN_ENTRIES, cpu, torch.float64) == 0.5 and loads == [True]


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


def test_the_kernel_draws_numpy_sfc64_words_and_lanes() -> None:
    """KEEP at T = 2^15 + 1 keeps a lane exactly when its int16 is <= 0: the sign bits of NumPy's words."""
    state = np.random.SFC64(np.random.SeedSequence((1, 2, 3, 4))).state["state"]["state"]
    words = np.random.SFC64(np.random.SeedSequence((1, 2, 3, 4))).random_raw(5000)
    out = np.zeros(4 * 5000 - 3, np.uint8)
    runs = [np.array([3]), np.array([0]), np.array([out.size])]  # starts mid-word, ends at the last lane
    compiled_kernels.apply_runs(state, *runs, out, out, KeepRule.of(0.5).threshold + 1, kernel.KEEP)
    assert np.array_equal(out.astype(bool), (words.view(np.int16) <= 0)[3:])


def test_runs_out_of_order_draw_the_stream_again() -> None:
    """Runs behind the words in hand (out of lane order) restart the stream: same lanes, any order."""
    state = np.random.SFC64(np.random.SeedSequence((9, 9, 9, 9))).state["state"]["state"]
    words = np.random.SFC64(np.random.SeedSequence((9, 9, 9, 9))).random_raw(3000)
    lane = np.array([9000, 5, 4000, 4001, 11990])
    length = np.array([7, 1100, 1, 3, 10])
    pos = np.concatenate([[0], np.cumsum(length)[:-1]])
    out = np.zeros(int(length.sum()), np.uint8)
    compiled_kernels.apply_runs(state, lane, pos, length, out, out, KeepRule.of(0.5).threshold + 1, kernel.KEEP)
    expected = np.concatenate([(words.view(np.int16) <= 0)[a:a + n] for a, n in zip(lane, length)])
    assert np.array_equal(out.astype(bool), expected)


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
    """Rows split over ``ranks`` ranges (cuts mid-chunk) and masked each with its own first row, halo rows from
    the other ranks appended, give exactly the rows of one process's pass."""
    width = 37
    rows = 3 * (LANES_PER_CHUNK // width) + 11
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
