"""Every numeric flag of every command has a range a real run can use, refused while the command line is parsed.

Issue 36 (F5, F6, F7, F17): a value past a flag's range is one sentence naming the flag, exit status 2, no
traceback, before MPI starts or anything is allocated. The in-process cases parse with the whole command line's
parser (built once); a few cases launch a real ``mpiexec`` to show the refusal is said once per job.
"""

from __future__ import annotations

import argparse
import os
import tracemalloc

import pytest
import torch
from mpirun import BIN, run_mpi

from algorithms.policies import AxisSpec, PolicySpec
from algorithms.static_input import evaluations
from runners import cli
from runners.argtypes import FLAG_RANGES, MAX_FORCED_THREADS, Range, usable_cores
from sparse_dist.compress import Codec

SPARSE_DIST = str(BIN / "sparse-dist")

# what each command needs besides the flag under test (a positional or a required flag; never read: the flag is
# refused first)
_AROUND: dict[str, tuple[list[str], list[str]]] = {
    "train": (["train"], ["--data", "/no/such/dataset"]),
    "prepare": (["prepare"], ["synthetic", "--out", "/no/such/out"]),
    "plot": (["plot"], ["/no/such/study"]),
    "cost compare": (["cost", "compare"], ["/no/such/study"]),
    "cost predict": (["cost", "predict"], ["--calibrate-from", "/no/such/study"]),
    "cost node-split": (["cost", "node-split"], ["--calibrate-from", "/no/such/study"]),
    "cost bytes": (["cost", "bytes"], ["--data", "/no/such/dataset"]),
    "emulate": (["emulate"], ["--", "true"]),
    **{f"bench {kind}": (["bench", kind], ["--data", "/no/such/dataset"])
       for kind in ("train", "policies", "minibatch", "partition", "cores")},
    "bench grid": (["bench", "grid"], ["--data", "/no/such/dataset", "--grid", "1,1,1"]),
}


def _argv(command: str, flag: str, value: str) -> list[str]:
    before, after = _AROUND.get(command, (command.split(), []))
    return [*before, f"{flag}={value}", *(after if flag != "--synthetic" else [])]  # --synthetic or --data


def _outside(limit: Range) -> list[tuple[str, str]]:
    """(which end, a value just past it) for both ends of ``limit``."""
    integer = isinstance(limit.low, int) and isinstance(limit.high, int)
    low = limit.low if limit.low_open else (limit.low - 1 if integer else limit.low - 0.5)
    high = 10**6 if limit.cores else (limit.high if limit.high_open else (limit.high + 1 if integer
                                                                         else limit.high * 2))
    return [("too small", str(low)), ("too large", str(high))]


CASES = [pytest.param(command, flag, value, id=f"{command} {flag} {end}")
         for command, flags in FLAG_RANGES.items() for flag, limit in flags.items()
         for end, value in _outside(limit)]


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    """The whole command line's parser, every command complete (built once: it imports every command)."""
    return cli._parser()


def _one_sentence(said: str, command: str) -> str:
    """The refusal's sentence, checked to be all that was said: ``sparse-dist CMD: error: ...`` and the line
    pointing at ``--help``, no traceback."""
    prog = f"sparse-dist {command}"
    lines = said.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"{prog}: error: ") and lines[1] == f"(see {prog} --help)", said
    assert "Traceback" not in said
    return lines[0].removeprefix(f"{prog}: error: ")


def _numeric(action: argparse.Action) -> bool:
    """Whether a flag takes a number (or numbers) by the type it was declared with or was narrowed to."""
    kind = action.type
    return kind in (int, float) or hasattr(kind, "bounds") or getattr(kind, "ranged", False)


def _flags(parser: argparse.ArgumentParser, words: list[str]) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            done: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in done and name not in cli.RENAMED_COMMANDS:
                    done.add(id(sub))
                    found += _flags(sub, [*words, name])
        elif action.option_strings:
            found.append((" ".join(words), action))
    return found


def test_every_numeric_flag_of_every_command_has_a_range(parser: argparse.ArgumentParser) -> None:
    numeric = {(command, action.option_strings[0]) for command, action in _flags(parser, []) if _numeric(action)}
    unranged = sorted((command, action.option_strings[0]) for command, action in _flags(parser, [])
                      if _numeric(action) and not getattr(action.type, "ranged", False))
    assert unranged == []
    table = {(command, flag) for command, flags in FLAG_RANGES.items() for flag in flags}
    assert table - numeric == set(), "FLAG_RANGES names flags no command has"
    assert len(table) > 100
    for command, flags in FLAG_RANGES.items():
        for flag, limit in flags.items():
            assert limit.why and limit.low < limit.high, (command, flag)


@pytest.mark.parametrize("command,flag,value", CASES)
def test_a_value_past_either_end_is_one_sentence_naming_the_flag(
        command: str, flag: str, value: str, parser: argparse.ArgumentParser,
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(_argv(command, flag, value))
    assert exit_info.value.code == 2
    assert _one_sentence(capsys.readouterr().err, command).startswith(f"argument {flag}: ")


@pytest.mark.parametrize("command,flag,limit", [pytest.param(c, f, r, id=f"{c} {f}")
                                                for c, flags in FLAG_RANGES.items() for f, r in flags.items()])
def test_both_ends_of_a_range_are_accepted(command: str, flag: str, limit: Range,
                                           parser: argparse.ArgumentParser) -> None:
    """A range is one a real run can use: its closed ends parse (a thread count's up to the cores here)."""
    ends = [limit.low] if not limit.low_open else []
    ends += [usable_cores()] if limit.cores else ([limit.high] if not limit.high_open else [])
    for end in ends:
        args = parser.parse_args(_argv(command, flag, str(end)))
        assert args is not None


def test_threads_are_at_most_the_cores_unless_forced(parser: argparse.ArgumentParser,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cores = usable_cores()
    assert parser.parse_args(_argv("train", "--threads", str(cores))).threads == cores
    assert parser.parse_args(_argv("train", "--threads", f"{cores + 1}!")).threads == cores + 1
    assert parser.parse_args(_argv("train", "--threads", f"{MAX_FORCED_THREADS}!")).threads == MAX_FORCED_THREADS
    for value, sentence in ((f"{cores + 1}", f"must be an integer >= 0 and <= {cores} (the cores this process may "
                                             f"use), got {cores + 1}; write --threads {cores + 1}! to run more "
                                             f"threads than cores anyway"),
                            ("1000000!", f"must be at most {MAX_FORCED_THREADS} even when forced (--threads N!), "
                                         f"got 1000000")):
        with pytest.raises(SystemExit):
            parser.parse_args(_argv("train", "--threads", value))
        assert f"sparse-dist train: error: argument --threads: {sentence}" in capsys.readouterr().err


def test_a_long_pasted_number_is_shortened_in_the_sentence(parser: argparse.ArgumentParser,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser.parse_args(_argv("train", "--epochs", "9" * 5000 + "x"))
    said = _one_sentence(capsys.readouterr().err, "train")
    assert len(said) < 200 and said.endswith("(5001 characters)"), said


# ---------------------------------------------------------------- F5: nothing in proportion to --epochs
def test_the_evaluation_count_needs_no_memory_in_proportion_to_the_epochs() -> None:
    """F5: ``evaluations`` built a set over every epoch number (RSS grew ~50 MB/s a rank before epoch 1)."""
    tracemalloc.start()
    try:
        assert evaluations(10**6, 1) == 10**6  # the old set: ~40 MB here, so this fails on it, quickly
        assert evaluations(10**12, 3) == 333_333_333_334  # epochs 3, 6, ... and the last
        assert evaluations(10**12, 10**12) == 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, peak
    assert [evaluations(e, k) for e, k in ((0, 1), (10, 3), (9, 3), (200, 1), (1, 7))] == [0, 4, 3, 200, 1]


# ---------------------------------------------------------------- F17: empty specs
@pytest.mark.parametrize("flag,sentence", [
    ("--compress", "--compress '': an empty format; write none for no compression"),
    ("--sample", "argument --sample: an empty sampling policy; write 'none' for exact"),
    ("--stale", "argument --stale: an empty staleness policy; write 'none' for exact"),
])
def test_an_empty_spec_is_refused(flag: str, sentence: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--data", "/no/such/dataset", f"{flag}="])
    assert exit_info.value.code == 2
    assert _one_sentence(capsys.readouterr().err, "train").startswith(sentence)


@pytest.mark.parametrize("parse,text,sentence", [
    (lambda t: Codec.parse(t), "  ", "an empty format"),
    (lambda t: AxisSpec.parse("sample", t), ":keep=0.1", "names no sampling policy"),
    (lambda t: AxisSpec.parse("stale", t), "none:tau=2", "'none' takes no parameters"),
    (lambda t: PolicySpec.parse(t), "", "an empty policy; write 'exact'"),
    (lambda t: PolicySpec.parse_list(t), ",;,", "no policy in ',;,'"),
    (lambda t: AxisSpec.parse("sample", t), "dgs:nodes=0.5,steps=1000000000000", "steps must be at most 10000"),
    (lambda t: AxisSpec.parse("stale", t), "pipe:tau=1000000000000", "tau must be at most 1000"),
    (lambda t: AxisSpec.parse("stale", t), "sancus-e:eps=inf", "eps must be at most 1e+07"),
    (lambda t: AxisSpec.parse("sample", t), "psc:budget=0.1,every=100000000", "every must be at most 1e+07"),
    (lambda t: Codec.parse(t), ",feedback", "--compress ',feedback': compression format must be one of"),
])
def test_policy_and_compression_text_is_refused_in_one_sentence(parse, text: str, sentence: str) -> None:
    with pytest.raises(ValueError) as error:
        parse(text)
    assert sentence in str(error.value) and "\n" not in str(error.value)


def test_policy_parameters_at_their_limits_still_parse() -> None:
    for axis, text in (("stale", "pipe:tau=1000,gamma=0.95"), ("stale", "sancus-h:eps=1000000"),
                       ("sample", "dgs:nodes=0.5,steps=10000,every=10000000"),
                       ("sample", "psc:budget=0.1,every=10000000")):
        assert not AxisSpec.parse(axis, text).is_none


# ---------------------------------------------------------------- under mpiexec: said once, before the ranks work
_NO_GPU = not torch.cuda.is_available()


@pytest.mark.parametrize("flags,sentence", [
    (["--epochs", "99999999999999999999"],
     "argument --epochs: must be an integer >= 1 and <= 10000000, got 99999999999999999999"),
    (["--threads", "1000000"], "argument --threads: must be an integer >= 0 and <= "),
    pytest.param(["--device", "cuda"], "argument --device: cuda needs a GPU",
                 marks=pytest.mark.skipif(not _NO_GPU, reason="this machine has a GPU")),
], ids=["F5 epochs", "F6 threads", "F7 device"])
def test_a_bad_flag_under_mpiexec_is_said_once_before_any_rank_works(flags: list[str], sentence: str) -> None:
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", "/no/such/dataset", *flags], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert _one_sentence(result.stderr, "train").startswith(sentence), result.stderr
    assert "no/such/dataset" not in result.stderr


def test_usable_cores_is_the_affinity() -> None:
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_bench_train_refuses_more_classes_than_features(capsys: pytest.CaptureFixture[str]) -> None:
    """Part 6: a synthetic graph with more classes than features was a ValueError traceback from every rank."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "train", "--synthetic", "100", "--classes", "200"])
    assert exit_info.value.code == 2
    assert _one_sentence(capsys.readouterr().err, "bench train").startswith(
        "--classes 200 is more than --features 128")
