"""Compressed messages (sparse_dist/compress.py): round-trip error per format, unbiased stochastic rounding,
error feedback over many exchanges, and the flag's parser. Multi-rank bytes and exactness of evaluation run
in tests/mpi/cases/static_input_cases.py."""

import numpy as np
import pytest
import torch

from sparse_dist.compress import AdaptiveCodec, Codec


def _rows(seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randn(64, 33, generator=generator, dtype=torch.float32) * torch.logspace(-3, 2, 64)[:, None]
    rows[5] = 0.0  # an all-zero row: scale 0 must decode to zeros
    return rows


@pytest.mark.parametrize("name,relative,row_bytes", [("fp16", 2.0**-11, 2 * 33 + 2), ("bf16", 2.0**-8, 2 * 33)])
def test_16_bit_formats_round_to_nearest(name: str, relative: float, row_bytes: int) -> None:
    codec = Codec(name)
    rows = _rows()
    payload = codec.encode(rows)
    assert payload.dtype == torch.uint8 and payload.shape == (64, codec.row_bytes(33)) == (64, row_bytes)
    back = codec.decode(payload, 33, torch.float32)
    # relative error of the format's rounding; below its normal range, half its smallest subnormal step (fp16's
    # range is the row's: its values are scaled by a power of two at most the row's largest magnitude)
    peak = rows.abs().amax(dim=1, keepdim=True)
    smallest = {"fp16": 2.0**-24 * peak, "bf16": torch.full_like(peak, 2.0**-133)}[name]
    assert torch.all((back - rows).abs() <= relative * rows.abs() + smallest / 2)
    assert torch.equal(back[5], torch.zeros(33))


@pytest.mark.parametrize("magnitude", [1e-9, 1e-6, 1e6, 1e30])
def test_fp16_keeps_its_precision_for_rows_far_outside_halfs_range(magnitude: float) -> None:
    """A plain cast to half flushes 1e-9 to zero, keeps 1e-6 to a few bits and turns 1e6 into inf: the row's
    exponent keeps every value within half's rounding, 2^-11 of its size."""
    rows = torch.randn(16, 24, generator=torch.Generator().manual_seed(2), dtype=torch.float32) * magnitude
    codec = Codec("fp16")
    back = codec.decode(codec.encode(rows), 24, torch.float32)
    peak = rows.abs().amax(dim=1, keepdim=True)
    assert torch.all((back - rows).abs() <= 2.0**-11 * rows.abs() + 2.0**-25 * peak)
    plain = rows.to(torch.float16).to(torch.float32)
    assert not torch.all((plain - rows).abs() <= 2.0**-11 * rows.abs() + 2.0**-25 * peak)  # what the exponent adds


def test_fp16_rounds_as_a_plain_cast_inside_halfs_normal_range() -> None:
    rows = _rows(3)[20:40]  # magnitudes 0.03 to 3: half's normal range
    codec = Codec("fp16")
    assert torch.equal(codec.decode(codec.encode(rows), 33, torch.float32), rows.to(torch.float16).to(torch.float32))


def test_int8_error_is_at_most_half_a_step_of_its_row() -> None:
    codec = Codec("int8")
    rows = _rows()
    payload = codec.encode(rows)
    assert payload.shape == (64, 33 + 4)
    back = codec.decode(payload, 33, torch.float32)
    step = rows.abs().amax(dim=1, keepdim=True) / 127
    assert torch.all((back - rows).abs() <= step / 2 * (1 + 1e-6))
    assert torch.equal(back[5], torch.zeros(33))
    assert codec.encode(rows[:0]).shape == (0, 37) and codec.decode(codec.encode(rows[:0]), 33, torch.float32).shape == (0, 33)


def test_stochastic_int8_is_unbiased_and_within_one_step() -> None:
    rows, draws = _rows(1)[:8], 2000
    step = rows.abs().amax(dim=1, keepdim=True) / 127
    total = torch.zeros_like(rows)
    codec = Codec("int8", stochastic=True, seed=3)
    for k in range(draws):
        back = codec.decode(codec.encode(rows, (k,)), 33, torch.float32)
        assert torch.all((back - rows).abs() <= step * (1 + 1e-6))
        total += back
    # each draw's error has variance at most step^2 / 4: the mean lies within 6 of its standard deviations
    assert torch.all((total / draws - rows).abs() <= 6 * step / 2 / np.sqrt(draws) + 1e-7)
    assert torch.equal(codec.encode(rows, (7,)), codec.encode(rows, (7,)))  # reproducible


def test_error_feedback_keeps_the_accumulated_error_bounded() -> None:
    generator = torch.Generator().manual_seed(4)
    base, drift = torch.randn(40, 16, generator=generator), torch.randn(40, 16, generator=generator)
    errors = {}
    for feedback in (False, True):
        codec = Codec("int8", feedback=feedback)
        accumulated = torch.zeros(40, 16)
        for t in range(50):  # a slowly changing block, sent 50 times: the receiver sums what it decodes
            x = base + 1e-3 * t * drift
            accumulated += x - codec.decode(codec.send(x, (1, "rows", 0), 40, None), 16, torch.float32)
        errors[feedback] = float(accumulated.norm())
    # what the receivers summed is off by the last residual only: at most half a step per value of its row
    last = base + 1e-3 * 49 * drift
    bound = float(((last.abs().amax(dim=1) / 127 * 1.01) ** 2 * 16 / 4).sum().sqrt())
    assert errors[True] <= bound
    assert errors[False] > 10 * errors[True]  # without feedback, rounding errors of a slow block add up


def test_feedback_residual_follows_the_rows_a_sampled_message_sends() -> None:
    codec = Codec("fp16", feedback=True)
    rows = torch.full((2, 3), 1.0 + 2.0**-12)  # not representable in fp16: a residual of 2^-12 per value
    codec.send(rows, (0, "rows", 1), 5, np.array([1, 3]))
    residual = codec.residuals[(0, "rows", 1)]
    assert torch.allclose(residual[[1, 3]], torch.full((2, 3), 2.0**-12)) and torch.equal(residual[[0, 2, 4]],
                                                                                         torch.zeros(3, 3))


def test_compress_specs_are_parsed_and_checked() -> None:
    assert Codec.parse("none") is None
    codec = Codec.parse("int8:stochastic,feedback", seed=2)
    assert (codec.format, codec.stochastic, codec.feedback, codec.seed, str(codec)) == \
        ("int8", True, True, 2, "int8:stochastic,feedback")
    for bad in ("int3", "fp16:stochastic", "int8,fast", "int8:floor", "int8,min=4", "adaptive,min=3",
                "adaptive,budget=2", "adaptive,budget=x", "adaptive,bits=4"):
        with pytest.raises(ValueError):
            Codec.parse(bad)
    adaptive = Codec.parse("adaptive:stochastic,min=2,budget=0.01,feedback", seed=5)
    assert isinstance(adaptive, AdaptiveCodec) and (adaptive.floor, adaptive.budget, adaptive.seed) == (2, 0.01, 5)
    assert str(adaptive) == "adaptive:stochastic,min=2,budget=0.01,feedback" and str(Codec.parse("adaptive")) == "adaptive"


def test_int8_sends_a_zero_row_as_zero_bytes_and_a_negative_row_by_its_largest_magnitude() -> None:
    from sparse_dist.compress import AdaptiveCodec, Codec

    rows = torch.zeros(3, 5)
    rows[1] = torch.tensor([-4.0, -1.0, -2.0, -0.5, -3.0])
    rows[2] = torch.tensor([1.0, -6.35, 0.0, 2.0, 6.0])
    payload = Codec.parse("int8").encode(rows)
    assert torch.equal(payload[0], torch.zeros(9, dtype=torch.uint8))  # scale +0.0, not -0.0
    scales = payload[:, :4].contiguous().view(torch.float32).flatten()
    assert torch.equal(scales, torch.tensor([0.0, 4.0 / 127.0, 6.35 / 127.0]))
    codes = payload[:, 4:].contiguous().view(torch.int8)
    assert codes[1, 0] == -127 and codes[2, 1] == -127 and codes[2, 4] == round(6.0 / (6.35 / 127.0))


@pytest.mark.parametrize("width", [6, 7, 8, 13])
@pytest.mark.parametrize("count", [1, 2, 5])
def test_int8_decodes_any_row_count_and_width_also_from_a_slice(width: int, count: int) -> None:
    """One sampled row of a width that is not a multiple of 4 (CiteSeer's 6 classes) failed to decode: the
    scale's view as float32 needs a row stride divisible by 4, which .contiguous() keeps from the payload."""
    codec = Codec.parse("int8")
    rows = torch.randn(count, width, generator=torch.Generator().manual_seed(width))
    payload = codec.encode(rows)
    padded = torch.zeros(count + 2, payload.shape[1], dtype=payload.dtype)
    padded[1:count + 1] = payload
    for message in (payload, padded[1:count + 1]):
        decoded = codec.decode(message, width, torch.float32)
        assert decoded.shape == (count, width)
        assert torch.allclose(decoded, rows, atol=rows.abs().max().item() / 100)


@pytest.mark.parametrize("name,levels", [("int4", 7), ("int2", 1)])
@pytest.mark.parametrize("width", [1, 3, 4, 5, 33])
def test_narrow_integer_codes_pack_into_their_bits_and_round_to_half_a_step(name: str, levels: int,
                                                                             width: int) -> None:
    """int4 packs two codes a byte, int2 four (the last byte padded); each value is within half a step of its
    row's scale, max |x| / levels, and the row's largest magnitude comes back exactly up to float rounding."""
    codec = Codec(name)
    rows = _rows(6)[:, :width]
    payload = codec.encode(rows)
    bits = {"int4": 4, "int2": 2}[name]
    assert payload.shape == (64, 4 + -(-width * bits // 8)) and codec.row_bytes(width) == payload.shape[1]
    back = codec.decode(payload, width, torch.float32)
    step = rows.abs().amax(dim=1, keepdim=True) / levels
    assert torch.all((back - rows).abs() <= step / 2 * (1 + 1e-6))
    assert torch.equal(back[5], torch.zeros(width))
    # the codes themselves, read back from the bytes: code + levels in each slot, lowest bits first
    scale = payload[:, :4].contiguous().view(torch.float32)
    expected = torch.round(rows / torch.where(scale > 0, scale, torch.ones_like(scale))).clamp(-levels, levels)
    slots = [(int(byte) >> (bits * k)) & ((1 << bits) - 1) for byte in payload[7, 4:] for k in range(8 // bits)]
    assert [slot - levels for slot in slots[:width]] == expected[7].to(torch.int64).tolist()
    assert all(slot == 0 for slot in slots[width:])  # padding


def test_stochastic_int4_is_unbiased() -> None:
    rows, draws = _rows(1)[:8, :9], 3000
    step = rows.abs().amax(dim=1, keepdim=True) / 7
    codec = Codec("int4", stochastic=True, seed=3)
    total = sum(codec.decode(codec.encode(rows, (k,)), 9, torch.float32) for k in range(draws))
    assert torch.all((total / draws - rows).abs() <= 6 * step / 2 / np.sqrt(draws) + 1e-7)


def test_tightening_adds_bits() -> None:
    steps = []
    text: str | None = "int2:stochastic,feedback"
    while text is not None:
        steps.append(text)
        text = Codec.parse(text).tightened()
    assert steps == ["int2:stochastic,feedback", "int4:stochastic,feedback", "int8:stochastic,feedback", "fp16"]
    steps = []
    text = "adaptive,min=2,feedback"
    while text is not None:
        steps.append(text)
        text = Codec.parse(text).tightened()
    assert steps == ["adaptive,min=2,feedback", "adaptive,feedback", "adaptive,min=8,feedback", "fp16"]


def _measured(codec: AdaptiveCodec, key: tuple[int, str], rows: torch.Tensor) -> None:
    codec.send(rows, (*key, 0), rows.shape[0], None)


def test_adaptive_widths_follow_the_measured_error_of_each_layer_and_direction() -> None:
    """Dense Gaussian rows fit int4 within the default budget (1/32); rows whose one large value sets a step
    that rounds all the others coarsely do not and stay at int8; a key that sent nothing keeps its width; the floor bounds from below;
    each key codes at its own width, and the error sums start afresh after a choice."""
    generator = torch.Generator().manual_seed(0)
    dense = torch.randn(200, 128, generator=generator)
    spiky = torch.randn(200, 128, generator=generator)
    spiky[:, 0] = 12.0  # int4's step becomes 12 / 7: about 1/10 of the row's squared size is lost
    keys = [(0, "rows"), (0, "gradients"), (1, "rows")]
    for floor, want in ((4, {(0, "rows"): 4, (0, "gradients"): 8}), (8, {(0, "rows"): 8, (0, "gradients"): 8})):
        codec = Codec.parse(f"adaptive,min={floor},feedback")
        assert codec.at(0, "rows").format == "int8"
        _measured(codec, (0, "rows"), dense)
        _measured(codec, (0, "gradients"), spiky)
        sums = codec.local_sums(keys)
        assert sums[2].tolist() == [0.0, 0.0] and np.all(sums[:2, 1] > 0)
        measured = codec.choose(keys, sums)
        assert set(measured) == {(0, "rows"), (0, "gradients")}
        at_int4 = 1.0 / 32 / (127 / 7) ** 2  # a measurement at int8 predicting exactly the budget at int4
        assert measured[(0, "rows")] < at_int4 < measured[(0, "gradients")]
        assert codec.widths == want and codec.local_sums(keys).sum() == 0.0
        assert codec.at(0, "rows").bits == want[(0, "rows")] and codec.at(1, "rows").bits == 8
    # measured at int4, predicted for int2 (49x the error): over the budget, so it stays at int4 even with min=2
    codec = Codec.parse("adaptive,min=2")
    codec.widths[(0, "rows")] = 4
    _measured(codec, (0, "rows"), dense)
    codec.choose(keys, codec.local_sums(keys))
    assert codec.widths[(0, "rows")] == 4


def test_adaptive_children_share_the_residuals_across_widths() -> None:
    codec = Codec.parse("adaptive,feedback")
    rows = torch.randn(10, 16, generator=torch.Generator().manual_seed(1))
    payload = codec.send(rows, (2, "rows", -1), 10, None)
    assert payload.shape == (10, 16 + 4) and (2, "rows", -1) in codec.residuals
    codec.widths[(2, "rows")] = 4
    residual = codec.residuals[(2, "rows", -1)].clone()
    child = codec.at(2, "rows")
    back = child.decode(codec.send(rows, (2, "rows", -1), 10, None), 16, torch.float32)
    # what the receiver got plus the new residual is what was sent plus the old residual
    assert torch.allclose(back + codec.residuals[(2, "rows", -1)], rows + residual, atol=1e-6)
    with pytest.raises(TypeError):
        codec.encode(rows)


def test_adaptive_prices_a_row_at_the_mean_of_its_widths() -> None:
    """Before any choice, the floor's width and int8's (what the cost model and --policy auto price); then the
    widths in use."""
    codec = Codec.parse("adaptive")
    assert codec.row_bytes(128) == (Codec("int4").row_bytes(128) + Codec("int8").row_bytes(128)) // 2 == 100
    assert Codec.parse("adaptive,min=8").row_bytes(128) == Codec("int8").row_bytes(128)
    codec.widths.update({(1, "rows"): 4, (1, "gradients"): 4, (2, "rows"): 16})
    assert codec.row_bytes(128) == round((68 + 68 + 258) / 3)
