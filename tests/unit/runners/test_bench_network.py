"""``bench network``'s alpha-beta fit: every ``--max-bytes`` the command line accepts leaves messages to fit beta on."""

from __future__ import annotations

import math

import pytest

from runners.argtypes import FLAG_RANGES
from runners.bench.network import FIT_FROM, SIZES, fit_alpha_beta


def _broadcasts(alpha: float, beta: float, groups: int, largest: int) -> list[tuple[int, float]]:
    """Seconds of the model's broadcasts (binomial below 512 bytes, scatter + ring allgather above), up to
    ``largest`` bytes, as the command measures them."""
    steps = max(math.ceil(math.log2(groups)), 1)
    rows = []
    for size in (s for s in SIZES if s <= largest):
        if size <= 512:
            rows.append((size, steps * alpha))
        else:
            rows.append((size, (steps + groups - 1) * alpha + 2.0 * (groups - 1) / groups * size * beta))
    return rows


def test_the_smallest_max_bytes_accepted_still_fits_beta() -> None:
    lowest = FLAG_RANGES["bench network"]["--max-bytes"].low
    assert lowest == FIT_FROM == 2 ** 21
    alpha, beta = fit_alpha_beta(_broadcasts(2e-6, 1e-9, 4, lowest), 4)
    assert alpha == pytest.approx(2e-6) and beta == pytest.approx(1e-9)


def test_below_it_no_message_would_fit_beta() -> None:
    rows = _broadcasts(2e-6, 1e-9, 4, FIT_FROM - 1)
    assert max(size for size, _ in rows) < FIT_FROM  # what the flag's range refuses: the fit would have no rows
