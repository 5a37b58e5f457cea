"""The README's commands are true: every ``sparse-dist`` command in its code blocks (and in the Makefile)
parses with the real parser, and a cheap subset runs end to end, verbatim where it can.

Commands are found in fenced code blocks: lines (joined at a trailing backslash, ``$ `` prompts and
``#`` comments removed) whose program is ``sparse-dist`` (bare, ``$B/``, ``.venv/bin/``), alone or after
``mpiexec -n P``. Each is parsed by ``runners.cli._parser()`` and checked by its command's
``check_arguments``, as ``sparse-dist`` itself does before MPI starts; a failure names the README line.
The runs use a temporary directory as the working directory (the README's relative paths land there)
and this environment's ``bin`` for ``$B`` and ``.venv/bin``; where a run departs from the README
(fewer ranks, fewer epochs, a small calibration study instead of a long one) the test says so.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from mpirun import BIN, ROOT, run_with_timeout

README = ROOT / "README.md"
MAKEFILE = ROOT / "Makefile"
PROGRAM = "sparse-dist"


@dataclass(frozen=True)
class DocCommand:
    """One ``sparse-dist`` command of a document: where it is, as written, and its arguments."""

    where: str            # e.g. "README.md:46"
    text: str             # the command as written (continuation lines joined)
    argv: tuple[str, ...]  # the arguments after ``sparse-dist``
    ranks: int | None     # ``mpiexec -n P``, or None when launched directly

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def _logical_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Lines joined at a trailing backslash, each with the number of its first line."""
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, line in lines:
        start, text = pending if pending else (number, "")
        text = f"{text} {line.strip()}" if text else line.strip()
        if text.endswith("\\"):
            pending = (start, text[:-1].rstrip())
            continue
        pending = None
        joined.append((start, text))
    if pending:
        joined.append(pending)
    return joined


def _command(where: str, text: str) -> DocCommand | None:
    """The ``sparse-dist`` command of one shell line, or None if the line runs something else."""
    text = text.removeprefix("$ ").strip()
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError:
        return None
    programs = [i for i, token in enumerate(tokens) if token.rsplit("/", 1)[-1] == PROGRAM]
    if not programs or not tokens:
        return None
    first = programs[0]
    launcher = tokens[:first]
    ranks = None
    if launcher:
        if launcher[0].rsplit("/", 1)[-1] != "mpiexec" or "-n" not in launcher:
            return None
        ranks = int(launcher[launcher.index("-n") + 1])
    return DocCommand(where, text.split(" #")[0].strip(), tuple(tokens[first + 1:]), ranks)


def readme_commands() -> list[DocCommand]:
    """Every ``sparse-dist`` command in the README's fenced code blocks: every line of a ``sh`` block,
    and the ``$ ``-prompted lines of a plain block (its other lines are output)."""
    commands: list[DocCommand] = []
    block: list[tuple[int, str]] | None = None
    shell = False
    for number, line in enumerate(README.read_text().splitlines(), start=1):
        fence = line.strip()
        if fence.startswith("```"):
            if block is not None:
                for start, text in _logical_lines(block):
                    found = _command(f"README.md:{start}", text) if shell or text.startswith("$ ") else None
                    if found:
                        commands.append(found)
                block = None
            else:
                block, shell = [], fence[3:].strip() in ("sh", "bash", "shell", "console")
            continue
        if block is not None:
            block.append((number, line))
    return commands


def makefile_commands() -> list[DocCommand]:
    """The ``sparse-dist`` commands of the Makefile's recipes (``make run``), with its variables' defaults."""
    commands = []
    for number, line in enumerate(MAKEFILE.read_text().splitlines(), start=1):
        if PROGRAM not in line or not line.startswith("\t"):
            continue
        text = line.strip().split("||")[-1].replace("$(BIN)/", "").replace("$(RANKS)", "2")
        found = _command(f"Makefile:{number}", text.strip())
        if found:
            commands.append(found)
    return commands


COMMANDS = readme_commands()
MAKE_COMMANDS = makefile_commands()


def test_the_readme_has_the_commands_this_file_checks() -> None:
    """The extraction itself can fail: it must find the README's commands (a silent empty list passes nothing)."""
    assert len(COMMANDS) >= 30, [str(c) for c in COMMANDS]
    assert {c.argv[0] for c in COMMANDS} >= {"prepare", "train", "sweep", "plot", "model", "demo", "info", "bench"}
    assert any(c.ranks == 4 for c in COMMANDS) and any(c.ranks is None for c in COMMANDS)
    assert [c.argv[:2] for c in MAKE_COMMANDS] == [("prepare", "planetoid"), ("train", "--data")]


def _parse(argv: tuple[str, ...] | list[str]) -> tuple[argparse.Namespace | None, str]:
    """Parse as ``sparse-dist`` does before MPI starts: the parser, then the command's ``check_arguments``.
    Returns the namespace (None when refused) and what the parser said on stderr."""
    from runners import cli

    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            args = cli._parser().parse_args(list(argv))
            check, command_parser = cli._CHECKS.get(getattr(args, "func", None), (None, None))
            problem = check(args) if check is not None else None
            if problem:
                command_parser.error(problem)
        except SystemExit:
            return None, stderr.getvalue()
    return args, stderr.getvalue()


@pytest.mark.parametrize("command", COMMANDS + MAKE_COMMANDS, ids=lambda c: c.where)
def test_every_documented_command_parses(command: DocCommand, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)  # so that the parser says its error here
    args, said = _parse(command.argv)
    assert args is not None, f"{command}\nis refused by the parser:\n{said}"


# Flags of other programs the README names: Slurm's sbatch/srun, Open MPI's mpiexec and mpirun, pip.
OTHER_PROGRAMS_FLAGS = {"--account", "--partition", "--ntasks", "--cpus-per-task", "--gpus-per-task", "--export",
                        "--mpi", "--kill-on-bad-exit", "--oversubscribe", "--no-binary", "--host", "--mca"}


def _all_flags(parser: argparse.ArgumentParser) -> set[str]:
    flags: set[str] = set()
    for action in parser._actions:
        flags.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _all_flags(sub)
    return flags


def test_every_flag_the_readme_names_exists() -> None:
    """Prose and tables too: a renamed or removed flag anywhere in the README fails here."""
    from runners import cli

    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", README.read_text()))
    assert len(named) > 50, named
    unknown = sorted(named - _all_flags(cli._parser()) - OTHER_PROGRAMS_FLAGS)
    assert not unknown, f"README.md names flags no sparse-dist command has: {unknown}"


def test_the_documented_files_exist() -> None:
    """Study files and batch templates the README's commands name are in the repository."""
    text = README.read_text()
    named = set(re.findall(r"(?:runners/study/studies|slurm)/[\w.-]+\.(?:toml|sbatch)", text))
    assert len(named) >= 4, named
    missing = sorted(path for path in named if not (ROOT / path).is_file())
    assert not missing, f"README.md names files that do not exist: {missing}"


def test_the_documented_flag_error_is_what_the_parser_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """README, "Failures never hang": the sentence a bad --sample gets."""
    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    documented = _block_after(r"said once per job \(by launcher rank 0")
    args, said = _parse(["train", "--data", "data/cora", "--sample", "foo"])
    assert args is None and said.strip() == documented.strip()


def _block_after(pattern: str) -> str:
    """The first fenced block after the README text matching ``pattern``."""
    text = README.read_text()
    match = re.search(pattern, text)
    assert match, f"README.md no longer has {pattern!r}"
    block = re.search(r"```[a-z]*\n(.*?)```", text[match.end():], re.S)
    assert block, f"no code block after {pattern!r}"
    return block.group(1)


# ------------------------------------------------------------------------------------------ runs
def _find(prefix: str) -> DocCommand:
    """The README command that starts (after ``sparse-dist``) with ``prefix``; fails if it is gone."""
    wanted = tuple(shlex.split(prefix))
    for command in COMMANDS:
        if command.argv[:len(wanted)] == wanted:
            return command
    raise AssertionError(f"README.md has no `sparse-dist {prefix} ...` command any more; update tests/cli/test_docs.py")


def _run(command: DocCommand, cwd: Path, *, ranks: int | None = None, extra: tuple[str, ...] = (),
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``command`` (``ranks`` instead of its own ``-n`` when given; ``extra`` appended) in ``cwd``
    with this environment's programs; the whole process group is killed past ``timeout``."""
    ranks = ranks or command.ranks
    argv = [str(BIN / PROGRAM), *command.argv, *extra]
    if ranks is not None:
        argv = [str(BIN / "mpiexec"), "-n", str(ranks), *argv]
    return run_with_timeout(argv, timeout=timeout, cwd=cwd)


def _ok(command: DocCommand, result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"{command}\nexit {result.returncode}:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result.stdout


CALIBRATION_STUDY = """
# A one-run stand-in for clustered-strong (which takes tens of minutes): enough for `model`.
[study]
name = "clustered-strong"
output = "results/clustered-strong"
ranks = [1]
plans = ["p2p"]
policies = ["exact"]
epochs = 3
warmup = 1
timeout = 120

[train]
hidden = 16
threads = 1

[[dataset]]
name = "cora"
path = "data/cora"
"""


def test_the_worked_example_and_the_model_commands_run(tmp_path: Path) -> None:
    # Worked example, verbatim: prepare the built-in Cora.
    prepare = _find("prepare planetoid --out data/cora --parts 4")
    assert "(metis)" in _ok(prepare, _run(prepare, tmp_path))  # the default partitioner when pymetis imports
    assert json.loads((tmp_path / "data" / "cora" / "meta.json").read_text())["num_parts"] == 4

    # Worked example's training run: as written except 2 ranks (not 4) and --epochs 50 appended (not 200),
    # so that its --checkpoint-every 50 still writes a checkpoint.
    train = _find("train --data data/cora --plan p2p --out cora.jsonl")
    assert "--checkpoint-every" in train.argv
    text = _ok(train, _run(train, tmp_path, ranks=2, extra=("--epochs", "50")))
    assert "final test accuracy" in text
    records = [json.loads(line) for line in (tmp_path / "cora.jsonl").read_text().splitlines()]
    assert sum(r.get("type") == "epoch" for r in records) == 50
    assert list(tmp_path.glob("cora.ckpt*")), "the checkpoint the README promises was not written"

    # demo and info, verbatim.
    demo = _find("demo")
    assert "match: all plans equal the single-process result" in _ok(demo, _run(demo, tmp_path))
    info = _find("info")
    assert "world size" in _ok(info, _run(info, tmp_path))

    # Scaling studies: the model commands read results/clustered-strong, as the sweep writes it when run
    # from this directory. A one-run study under that name stands in for the long clustered-strong.
    (tmp_path / "calibration.toml").write_text(CALIBRATION_STUDY)
    sweep = DocCommand("tests/cli/test_docs.py", "sparse-dist sweep calibration.toml", ("sweep", "calibration.toml"), None)
    _ok(sweep, _run(sweep, tmp_path, timeout=180))
    assert (tmp_path / "results" / "clustered-strong" / "results.csv").is_file()
    compare = _find("model compare results/clustered-strong")
    assert "(calibration)" in _ok(compare, _run(compare, tmp_path))
    predict = _find("model predict --graph ogbn-papers100M")
    text = _ok(predict, _run(predict, tmp_path))
    assert re.search(r"^\s+1024 p2p\s+exact\s", text, re.M), text
    assert "sancus-h:eps=0.05 left out" in text  # the stand-in study has no sancus-h run to measure


def test_the_documented_missing_dataset_error_is_said_once(tmp_path: Path) -> None:
    """README, "User errors, said once": the command and the one line it prints, verbatim."""
    block = _block_after(r"Every rank raises the same error and rank 0 alone says it").strip().splitlines()
    command = _command("README.md", block[0])
    assert command is not None and command.ranks == 2, block
    result = _run(command, tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == block[1:], result.stderr
