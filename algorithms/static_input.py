"""What layer 0 exchanges, and which side applies dropout (DESIGN section 4: what never changes is sent once).

Layer 0's input ``X`` is static. Two ways to feed its SpMM:

* ``once``: every rank fetches the boundary rows of ``X`` it needs one time
  (:class:`sparse_dist.halo.StaticHalo`), draws their dropout masks itself and
  computes layer 0 alone, forward and backward, for the rest of the run.
* ``per-epoch``: layer 0 exchanges ``dropout(X) W`` (or ``dropout(X)``, whichever
  is narrower) in every training forward, its gradient in every backward, and
  ``X W`` in every evaluation forward, like any other layer.

``auto`` takes the one the byte model says moves fewer bytes over the whole run
(:func:`choose_input_exchange`), unless the halo does not fit ``--halo-budget``.
Bytes are not the whole cost: ``once`` makes every rank compute layer 0 for its
halo rows too (the owner did it once for all receivers before), so where bytes
are cheap (one shared-memory node) and ``X`` is wide, ``per-epoch`` can be the
faster one; the start-up line says how many more rows layer 0 computes.

Receiver-side dropout (``--dropout-side``): exchanges carry pre-dropout rows and
every rank masks what it multiplies, so a cached (SANCUS) or stale (pipelined)
block stays the same rows from one epoch to the next and only its mask changes.
``auto`` turns it on where dropout is on, a staleness rule compares the rows'
values (``sancus-h``), and no exchanging layer then sends more columns than
owner-side (:func:`receiver_side`: no policy may cost more bytes than the plan
it wraps, and ``sancus-h``'s skip share is not assumed).
The product is the same either way; the cost is that a layer that shrinks the
width then exchanges its input (``F_in`` columns) instead of ``H W``.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from algorithms.layers import GraphLayer
from algorithms.policies.spec import AxisSpec
from sparse_dist.layout import Grid, RowLayout
from sparse_dist.predict import SENT, predict_halo_bytes, predict_spmm_bytes

INPUT_EXCHANGES: tuple[str, ...] = ("auto", "once", "per-epoch")
DROPOUT_SIDES: tuple[str, ...] = ("auto", "owner", "receiver")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class HaloBudgetError(ValueError):
    """The halo ``--input-exchange once`` needs does not fit ``--halo-budget``."""


def parse_byte_size(text: str) -> int | None:
    """``unlimited`` -> None; ``4096``, ``512K``, ``64M``, ``1.5G``, ``2GiB`` -> bytes (powers of 1024)."""
    value = text.strip().lower()
    if value in ("unlimited", "none", "inf"):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", value)
    if match is None:
        raise ValueError(f"expected a size such as 512M, 2G or 1048576 (bytes), or 'unlimited'; got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def halo_budget_arg(text: str) -> int | None:
    """argparse type of ``--halo-budget``."""
    try:
        return parse_byte_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def receiver_side(dropout_side: str, dropout: float, stale: AxisSpec,
                  widths: Sequence[tuple[int, int]] | None = None) -> bool:
    """Whether exchanges carry pre-dropout rows.

    ``auto``: where a staleness rule looks at the rows' values (``sancus-h``'s variation gap) under
    dropout, and only if that costs no bytes: ``widths`` holds, per layer that exchanges every epoch,
    ``(receiver-side width, owner-side width)`` of its exchange, and ``auto`` stays owner-side when any
    receiver-side width is larger (a layer that shrinks the width, e.g. 64 hidden -> 4 classes, would
    send its 64 input columns instead of 4). ``sancus-h``'s share of skipped blocks is data dependent,
    so none is assumed. None: no layer known to widen (callers that know the model pass its widths,
    :func:`exchange_widths`). Rules that look only at epochs (``sancus-e``, ``sancus-a``) stay owner-side:
    a stale block is then an earlier epoch's masked rows, and the exchange keeps its narrower width (on
    Cora at P = 4, ``sancus-e:eps=1`` moved 138.5 MB owner-side against 226.2 MB receiver-side).
    """
    if dropout_side not in DROPOUT_SIDES:
        raise ValueError(f"dropout side must be one of {DROPOUT_SIDES}, got {dropout_side!r}")
    if dropout_side == "auto":
        rule = stale.policy
        wants = dropout > 0 and rule is not None and bool(getattr(rule, "needs_gap", False))
        return wants and all(receiver <= owner for receiver, owner in (widths or ()))
    return dropout_side == "receiver" and dropout > 0


def exchange_widths(layers: Sequence[tuple[int, int]], input_exchange: str,
                    shapes: Sequence[tuple[int, int] | None] | None = None) -> list[tuple[int, int]]:
    """``(receiver-side, owner-side)`` columns of each layer's per-epoch exchange, for :func:`receiver_side`.

    ``layers``: ``(F_in, F_out)`` per layer. SpMM layers exchange ``F_in`` receiver-side and
    ``min(F_in, F_out)`` owner-side (:func:`algorithms.layers.propagate`); ``shapes`` gives, per layer, the
    two widths where the layer says otherwise (attention, :meth:`GraphLayer.exchange_shape`). Layer 0 is
    left out when ``input_exchange`` is ``once`` (it never exchanges); under ``auto`` it is counted, since
    whether it exchanges depends on the side chosen here.
    """
    pairs = []
    for index, (f_in, f_out) in enumerate(layers):
        if index == 0 and input_exchange == "once":
            continue
        shape = shapes[index] if shapes is not None else None
        pairs.append(shape if shape is not None else (f_in, min(f_in, f_out)))
    return pairs


def model_exchange_widths(layers: Iterable[GraphLayer], input_exchange: str) -> list[tuple[int, int]]:
    """:func:`exchange_widths` of a built model's layers (each layer's own declaration where it makes one)."""
    layers = list(layers)
    shapes = []
    for layer in layers:
        receiver, owner = layer.exchange_shape(True), layer.exchange_shape(False)
        shapes.append(None if receiver is None or owner is None else (receiver[0], owner[0]))
    return exchange_widths([(layer.fan_in, layer.fan_out) for layer in layers], input_exchange, shapes)


def evaluations(epochs: int, eval_every: int) -> int:
    """Evaluation forwards of a run: every ``eval_every`` epochs and after the last (counted, not listed: O(1)
    time and memory whatever ``epochs``)."""
    if epochs <= 0:
        return 0
    return epochs // eval_every + (1 if epochs % eval_every else 0)


def _megabytes(value: float) -> str:
    return f"{value / 2**20:.3f} MiB"


@dataclass(frozen=True)
class InputExchange:
    """The choice for layer 0 and the figures behind it (bytes: all ranks' sent, summed)."""

    mode: str                  # "once" or "per-epoch"
    requested: str             # "auto", "once" or "per-epoch"
    once_bytes: int            # the one-time halo exchange
    per_epoch_run_bytes: float  # layer 0 exchanged every epoch, over the run's training and evaluation forwards
    halo_rows: list[int]       # per row group
    halo_bytes: list[int]      # per row group: what each of its ranks keeps
    budget: int | None
    reason: str
    extra_rows: float = 0.0    # the largest halo over its group's own rows: layer 0's added local work
    wire_dtype: str = ""       # the halo's rows travel in it, bitwise (sparse_dist.lossless_wire); "": as loaded

    def describe(self) -> str:
        """One line for the start of a run."""
        keeps = (f"; each rank keeps up to {max(self.halo_rows, default=0)} halo rows "
                 f"({_megabytes(max(self.halo_bytes, default=0))}) and computes layer 0 on up to "
                 f"{self.extra_rows:.0%} more rows") if self.mode == "once" else ""
        wire = f" (as {self.wire_dtype}, bitwise)" if self.wire_dtype else ""
        return (f"layer-0 input: {self.mode} ({self.reason}): X's boundary rows once = "
                f"{_megabytes(self.once_bytes)}{wire}, layer 0 every epoch = {_megabytes(self.per_epoch_run_bytes)} "
                f"over the run{keeps}")

    def record(self) -> dict[str, Any]:
        return {"mode": self.mode, "requested": self.requested, "once_bytes": self.once_bytes,
                "per_epoch_run_bytes": self.per_epoch_run_bytes, "halo_rows": self.halo_rows,
                "halo_bytes": self.halo_bytes, "budget": self.budget, "reason": self.reason,
                "extra_rows": self.extra_rows, "wire_dtype": self.wire_dtype}


def choose_input_exchange(requested: str, *, grid: Grid, layout: RowLayout, boundary_counts: np.ndarray,
                          union_sizes: np.ndarray, plan: str, f_in: int, f_out: int, itemsize: int, epochs: int,
                          evaluations: int, sample_p: float = 1.0, receiver: bool = False,
                          budget: int | None = None, layer0: tuple[int, bool] | None = None,
                          pair_counts: np.ndarray | None = None, wire: torch.dtype | None = None) -> InputExchange:
    """Decide how layer 0 gets its input from global metadata only, so every rank decides alike.

    The per-epoch side is the exact byte model of layer 0's exchanges (width ``min(F_in, F_out)``,
    or ``F_in`` under receiver-side dropout; a backward exchange where it multiplies by ``W``
    first), training forwards scaled by the sampling keep rate ``sample_p``. Staleness policies
    are not counted (they could only shrink the per-epoch side). ``layer0``: (width, backward) of layer 0's
    exchange where the layer says otherwise (attention: ``[Z | s]`` and its gradient,
    :meth:`algorithms.layers.GraphLayer.exchange_shape`). ``pair_counts``: the plan's own rows per pair where
    its byte model needs them (``cover``: a cover of X's rows per epoch against X's boundary rows once).
    ``wire``: the narrower dtype X's rows travel in once, where one holds them bitwise
    (:func:`sparse_dist.lossless_wire.agree_wire_dtype`; the per-epoch side sends products, full width). Raises
    :class:`HaloBudgetError`
    when ``once`` is requested and a halo exceeds ``budget``.
    """
    if requested not in INPUT_EXCHANGES:
        raise ValueError(f"input exchange must be one of {INPUT_EXCHANGES}, got {requested!r}")
    counts = np.array(boundary_counts, dtype=np.int64, copy=True)
    np.fill_diagonal(counts, 0)
    halo_rows = [int(r) for r in counts.sum(axis=1)]
    halo_bytes = [rows * f_in * itemsize for rows in halo_rows]
    wire_itemsize = wire.itemsize if wire is not None else itemsize
    once = int(predict_halo_bytes(grid, boundary_counts, f_in, wire_itemsize)[:, SENT].sum())
    transform_first = f_out < f_in and not receiver
    width, returns = layer0 if layer0 is not None else (f_out if transform_first else f_in, transform_first)
    volume = predict_spmm_bytes(grid, layout, boundary_counts, union_sizes, plan, width, itemsize,
                                pair_counts=pair_counts)
    forward = float(volume["forward"][:, SENT].sum())
    backward = float(volume["backward"][:, SENT].sum()) if returns else 0.0
    per_epoch = epochs * sample_p * (forward + backward) + evaluations * forward
    too_big = budget is not None and max(halo_bytes, default=0) > budget
    if requested == "once" and too_big:
        group = int(np.argmax(halo_bytes))
        raise HaloBudgetError(
            f"--input-exchange once: row group {group} would keep {halo_rows[group]} halo rows of X "
            f"({f_in} columns, {_megabytes(halo_bytes[group])} per rank), more than --halo-budget "
            f"{_megabytes(budget)}; raise --halo-budget, or use --input-exchange per-epoch (or auto)")
    if requested != "auto":
        mode, reason = requested, "as asked"
    elif too_big:
        mode, reason = "per-epoch", "the halo does not fit --halo-budget"
    elif once <= per_epoch:
        mode, reason = "once", "auto: fewer bytes"
    else:
        mode, reason = "per-epoch", "auto: fewer bytes"
    extra = max((rows / max(own, 1) for rows, own in zip(halo_rows, layout.counts())), default=0.0)
    return InputExchange(mode, requested, once, per_epoch, halo_rows, halo_bytes, budget, reason, float(extra),
                         str(wire).removeprefix("torch.") if wire is not None and mode == "once" else "")
