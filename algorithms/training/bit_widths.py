"""Adaptive bit widths in the training loop (``--compress adaptive``): at the end of every step the ranks sum
what each (layer, direction) of messages measured and agree on the widths of the next step.

The codec (:class:`sparse_dist.compress.AdaptiveCodec`) measures and chooses; this work sums its measurements
over the job (one allreduce of ``2 x layers x 2`` float64, phase ``other``, inside the step's figures: its bytes
are the step's) and records, per epoch, the widths the step's messages travelled at and their measured relative
squared error. The widths are the same on every rank and kept in the replicated checkpoint state, so a run
resumed at any ``P`` codes its next messages as the uninterrupted run does.

Collective: :meth:`BitWidthWork.end_of_step`, entered by every rank of the job.
"""

from __future__ import annotations

from typing import Any

import torch

from algorithms.policies.base import EpochWork
from sparse_dist.compress import DIRECTIONS, WIDTH_FORMATS, AdaptiveCodec, width_key

STATE_KEY = "bit_widths"


class BitWidthWork(EpochWork):
    """The agreement of an adaptive codec's widths between steps (see the module docstring)."""

    def __init__(self, codec: AdaptiveCodec, comm: Any, layers: int) -> None:
        self.codec, self.comm = codec, comm
        self.keys = [(layer, direction) for layer in range(layers) for direction in DIRECTIONS]

    def end_of_step(self) -> dict[str, Any]:
        """Sum the step's measurements over every rank and choose the next widths (collective); returns the
        record's ``bit_widths``: the widths this step used and each measured relative squared error."""
        used = {_text(key): self.codec.widths.get(key, self.codec.start) for key in self.keys}
        totals = torch.from_numpy(self.codec.local_sums(self.keys))
        self.comm.allreduce_(totals, "other")
        measured = self.codec.choose(self.keys, totals.numpy())
        return {STATE_KEY: {"used": used, "relative_error": {_text(key): value for key, value in measured.items()}}}

    def state(self) -> dict[str, Any]:
        return {STATE_KEY: {_text(key): bits for key, bits in self.codec.widths.items()}}

    def load_state(self, state: dict[str, Any]) -> None:
        widths = state.get(STATE_KEY)
        if widths is not None:
            self.codec.widths = {width_key(text): int(bits) for text, bits in widths.items()}


def state_problem(widths: Any) -> str | None:
    """Why a checkpoint's ``bit_widths`` is not a table of ``"layer/direction"`` to a width, or None."""
    if not isinstance(widths, dict):
        return f"bit widths are {type(widths).__name__}, expected a table"
    for text, bits in widths.items():
        try:
            width_key(text if isinstance(text, str) else "")
        except ValueError:
            return f"bit widths name {str(text)[:40]!r}, expected layer/direction"
        if bits not in WIDTH_FORMATS or isinstance(bits, bool):
            return f"bit width {repr(bits)[:40]} for {text}, expected one of {sorted(WIDTH_FORMATS)}"
    return None


def _text(key: tuple[int, str]) -> str:
    return f"{key[0]}/{key[1]}"
