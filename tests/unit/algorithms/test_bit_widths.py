"""Adaptive bit widths' agreement (algorithms/training/bit_widths.py) on one process: what a step records, the
widths it leaves for the next, and a checkpoint's widths (round trip, hostile values). Multi-rank bytes run in
tests/mpi/cases/static_input_cases.py; resume under mpiexec in tests/cli/test_adaptive_bits.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from algorithms.training.bit_widths import BitWidthWork, state_problem
from sparse_dist.compress import Codec


class _OneRank:
    """A communicator of one rank: an allreduce leaves the tensor as it is."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def allreduce_(self, tensor: torch.Tensor, phase: str) -> None:
        self.calls.append(phase)


def test_a_step_records_the_widths_it_used_and_leaves_the_next_ones() -> None:
    codec = Codec.parse("adaptive,feedback")
    comm = _OneRank()
    work = BitWidthWork(codec, comm, layers=2)
    rows = torch.randn(300, 64, generator=torch.Generator().manual_seed(0))
    codec.send(rows, (1, "rows", -1), 300, None)
    record = work.end_of_step()["bit_widths"]
    assert comm.calls == ["other"]
    assert record["used"] == {"0/rows": 8, "0/gradients": 8, "1/rows": 8, "1/gradients": 8}
    assert set(record["relative_error"]) == {"1/rows"} and 0 < record["relative_error"]["1/rows"] < 1e-3
    assert codec.widths == {(1, "rows"): 4}
    assert work.end_of_step()["bit_widths"]["used"]["1/rows"] == 4  # nothing sent since: the width stays
    state = work.state()
    assert state == {"bit_widths": {"1/rows": 4}} and state_problem(state["bit_widths"]) is None
    fresh = Codec.parse("adaptive,feedback")
    BitWidthWork(fresh, comm, layers=2).load_state(state)
    assert fresh.widths == codec.widths and fresh.at(1, "rows").format == "int4"


@pytest.mark.parametrize("widths,clause", [
    ([4], "bit widths are list"),
    ({"1/rows": 3}, "bit width 3 for 1/rows"),
    ({"1/rows": True}, "bit width True"),
    ({"1/sideways": 4}, "name '1/sideways'"),
    ({"x/rows": 4}, "name 'x/rows'"),
    ({7: 4}, "name '7'"),
])
def test_hostile_bit_widths_are_refused_in_one_clause(widths: Any, clause: str) -> None:
    problem = state_problem(widths)
    assert problem is not None and clause in problem, problem
