"""``train --grid``'s flags: what a grid run refuses, each in one sentence naming what to use instead, before MPI
starts (runners/train_grid.py); what it accepts. The runs themselves: tests/mpi/test_grid_train.py."""

from __future__ import annotations

import argparse

import pytest

from runners import train_cmd


def _problem(*flags: str) -> str | None:
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    return train_cmd.check_arguments(parser.parse_args(["--data", "d", *flags]))


@pytest.mark.parametrize("flags,words", [
    (["--grid", "2,2"], "three positive integers"),
    (["--grid", "2,0,1"], "three positive integers"),
    (["--layer-kind", "gat"], "--grid runs gcn and sage layers, not gat; use a 1D plan (--plan p2p) for gat"),
    (["--plan", "cover"], "--grid replaces --plan"),
    (["--replication", "2"], "--grid replaces --replication"),
    (["--sample", "bns:keep=0.1"], "thin or age the 1D halo exchange"),
    (["--stale", "pipe:tau=1"], "thin or age the 1D halo exchange"),
    (["--compress", "adaptive,feedback"], "the grid codes its allreduces at one width"),
    (["--policy", "auto"], "--policy auto chooses among the 1D plans' policies"),
    (["--overlap-evaluation"], "a grid run evaluates after its step"),
    (["--steer-evaluation"], "a grid run evaluates after its step"),
    (["--audit-every", "5"], "a grid run's guard reads its own exact reference"),
    (["--clip", "1.0"], "--clip is not built for the grid"),
    (["--feature-norm", "none"], "normalises features by their row sums"),
    (["--input-exchange", "once"], "the grid aggregates X once"),
    (["--halo-budget", "1G"], "the grid aggregates X once"),
    (["--mode", "minibatch"], "mini-batch training"),
])
def test_a_grid_run_refuses_the_1d_ideas_in_one_sentence(flags: list[str], words: str) -> None:
    grid = [] if flags[0] == "--grid" else ["--grid", "2,1,1"]
    problem = _problem(*grid, *flags)
    assert problem is not None and words in problem, problem
    assert "\n" not in problem


def test_a_grid_run_takes_the_model_and_training_flags() -> None:
    assert _problem("--grid", "2,2,1") is None
    assert _problem("--grid", "1x2x4", "--layer-kind", "sage", "--dropout", "0.3", "--eval-every", "5",
                    "--checkpoint", "ck", "--dtype", "float64", "--weight-decay", "0") is None
    for codec in ("int8,feedback", "fp16", "bf16", "int4:stochastic", "int2,feedback"):  # one width: coded
        assert _problem("--grid", "2,2,1", "--compress", codec) is None, codec
