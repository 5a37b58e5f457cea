"""The narrow wire of static rows (sparse_dist/lossless_wire.py): which dtype holds which values bitwise, and
the round trip. The multi-rank agreement and the halo it carries are checked under mpiexec
(tests/mpi/cases/static_input_cases.py, check_narrow_wire)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sparse_dist.lossless_wire import CANDIDATES, _CHUNK_ROWS, choose_wire_dtype, from_wire, narrow_mask, to_wire


def chosen(values, dtype=np.float32) -> torch.dtype | None:
    rows = np.asarray(values, dtype=dtype)
    return choose_wire_dtype(narrow_mask(rows), rows.dtype.itemsize)


@pytest.mark.parametrize("values,want", [
    ([[0, 1, 2, 255]], torch.uint8),
    ([[-128, 0, 127]], torch.int8),
    ([[-300, 32767]], torch.int16),
    ([[0.5, 1000.0, 65504.0]], torch.float16),
    ([[2.0 ** 100, 1.5]], torch.bfloat16),  # beyond float16's range, 8 significant bits
    ([[-0.0, 1.0]], torch.float16),  # -0.0 has no integer code: an integer would send +0.0
    ([[np.nan, 1.0]], None),
    ([[np.inf, 1.0]], torch.float16),
    ([[1e-30, 1.0]], None),
    ([[0.1, 1.0]], None),
])
def test_the_narrowest_dtype_that_holds_every_value_bitwise_is_chosen(values, want) -> None:
    assert chosen(values) == want


def test_random_floats_and_integers_travel_as_they_are() -> None:
    assert chosen(np.random.default_rng(0).random((50, 7))) is None
    assert narrow_mask(np.arange(6, dtype=np.int64).reshape(2, 3)) == 0


def test_no_rows_constrain_nothing_and_float64_may_narrow_to_any_candidate() -> None:
    assert narrow_mask(np.zeros((0, 4), np.float32)) == (1 << len(CANDIDATES)) - 1
    assert chosen([[3.0, 4.0]], np.float64) == torch.uint8
    assert chosen([[0.1]], np.float64) is None  # float32 is not a candidate: only the listed narrow dtypes


def test_a_value_past_the_first_chunk_still_decides() -> None:
    rows = np.zeros((_CHUNK_ROWS + 5, 2), np.float32)
    rows[-1, 1] = 0.25
    assert chosen(rows) == torch.float16


def test_a_narrower_dtype_is_chosen_only_when_narrower_than_the_rows() -> None:
    mask = narrow_mask(np.array([[0.5]], np.float16))
    assert mask & (1 << CANDIDATES.index(torch.float16))
    assert choose_wire_dtype(mask, 2) is None


@pytest.mark.parametrize("dtype", CANDIDATES)
def test_rows_come_back_bitwise(dtype: torch.dtype) -> None:
    values = {torch.uint8: [[0, 7, 255]], torch.int8: [[-128, -1, 127]], torch.int16: [[-32768, 300, 32767]],
              torch.float16: [[-0.0, 0.5, 65504.0]], torch.bfloat16: [[2.0 ** 100, -1.5, 0.0]]}[dtype]
    rows = np.asarray(values, dtype=np.float32)
    assert chosen(rows) is not None
    wire = to_wire(rows, dtype)
    assert wire.element_size() == dtype.itemsize and wire.dtype in (torch.uint8, torch.int8, torch.int16)
    back = from_wire(wire, dtype, rows.dtype)
    assert back.dtype == rows.dtype and np.array_equal(back.view(np.uint32), rows.view(np.uint32))
