"""The cover plan under real mpiexec (tests/mpi/cases/cover_cases.py, one launch of 4 ranks that also runs
P = 1, 2, 3 on sub-communicators): float64 exactness against one process on a directed graph with isolated,
in-only and out-only nodes and on Cora, GCN and SAGE, uneven and empty row groups, c = 2; counted == predicted
bytes, never above p2p; compression and pipe. Its refusals, said before MPI starts, exit 2."""

import argparse

import pytest
from mpirun import run_case

from runners import cli, train_cmd


def test_cover_plan_equals_one_process_in_float64() -> None:
    result = run_case(4, "cover_cases.py", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "cover cases (40 runs on this rank): all checks pass" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("argv,sentence", [
    (["--model", "gat"], "attention (gat) weighs each edge by its source row"),
    (["--dropout-side", "receiver"], "use --dropout-side owner"),
    (["--sample", "bns:keep=0.5"], "the cover plan pre-aggregates rows over several columns"),
    (["--stale", "sancus-e:eps=1"], "need a broadcast plan"),
])
def test_cover_refusals_are_one_sentence_before_mpi(argv: list[str], sentence: str) -> None:
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    args = parser.parse_args(["--data", "d", "--plan", "cover", *argv])
    problem = train_cmd.check_arguments(args)
    assert problem is not None and sentence in problem, problem


def test_cover_refusal_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["train", "--data", "d", "--plan", "cover", "--model", "gat"])
    assert stopped.value.code == 2
    assert "--plan cover sends partial sums" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--stale", "pipe:tau=1"], ["--compress", "int8"], ["--model", "sage"]])
def test_cover_composes_with(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    assert train_cmd.check_arguments(parser.parse_args(["--data", "d", "--plan", "cover", *argv])) is None
