"""The README's and docs' commands are true: every ``sparse-dist`` command in the code blocks of README.md
and docs/**/*.md (and in the Makefile) parses with the real parser, and a cheap subset runs end to end,
verbatim where it can. Every relative link points at a file that exists (and at a heading of it), and the
generated flags page is what ``docs/flags_page.py`` renders from the parsers now.

Commands are found in fenced code blocks: lines (joined at a trailing backslash, ``$ `` prompts and
``#`` comments removed) whose program is ``sparse-dist`` (bare, ``$B/``, ``.venv/bin/``), alone or after
``mpiexec -n P``. Each is parsed by ``runners.cli._parser()`` and checked by its command's
``check_arguments``, as ``sparse-dist`` itself does before MPI starts; a failure names the file and line.
The runs use a temporary directory as the working directory (the pages' relative paths land there)
and this environment's ``bin`` for ``$B`` and ``.venv/bin``; where a run departs from the page
(fewer ranks, fewer epochs, a small calibration study instead of a long one) the test says so.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
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
DOCS = sorted((ROOT / "docs").rglob("*.md"))
MAKEFILE = ROOT / "Makefile"
PROGRAM = "sparse-dist"

# Pages other engineers write in parallel on their own branches (links to them are allowed while absent);
# the lead empties this set when the branches are merged.
WRITTEN_ELSEWHERE: set[str] = set()


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


def doc_commands(path: Path) -> list[DocCommand]:
    """Every ``sparse-dist`` command in one document's fenced code blocks: every line of a ``sh`` block,
    and the ``$ ``-prompted lines of any other block (its other lines are output)."""
    name = path.relative_to(ROOT).as_posix()
    commands: list[DocCommand] = []
    block: list[tuple[int, str]] | None = None
    shell = False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fence = line.strip()
        if fence.startswith("```"):
            if block is not None:
                for start, text in _logical_lines(block):
                    found = _command(f"{name}:{start}", text) if shell or text.startswith("$ ") else None
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


README_COMMANDS = doc_commands(README)
COMMANDS = README_COMMANDS + [command for page in DOCS for command in doc_commands(page)]
MAKE_COMMANDS = makefile_commands()


def test_the_docs_have_the_commands_this_file_checks() -> None:
    """The extraction itself can fail: it must find the commands (a silent empty list passes nothing), the
    README's tour among them, and commands on many pages."""
    assert len(COMMANDS) >= 45, [str(c) for c in COMMANDS]
    assert {c.argv[0] for c in COMMANDS} >= {"prepare", "train", "sweep", "plot", "cost", "demo", "info", "bench",
                                             "emulate"}
    assert {c.argv[0] for c in README_COMMANDS} >= {"prepare", "train", "demo", "info", "sweep", "plot"}
    assert any(c.ranks == 4 for c in COMMANDS) and any(c.ranks is None for c in COMMANDS)
    assert len({c.where.rsplit(":", 1)[0] for c in COMMANDS}) >= 10
    assert [c.argv[:2] for c in MAKE_COMMANDS] == [("prepare", "planetoid"), ("train", "--data")]


def test_the_readme_fits_on_a_screen() -> None:
    """Issue 25: the README says what the project is, the two commands, a tour and where to go next;
    reference text and measured tables live in docs/."""
    lines = README.read_text().splitlines()
    assert len(lines) < 300, len(lines)
    assert "make run" in README.read_text() and "make test" in README.read_text()


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


RUN_OUTPUTS = {"data_prepared", "results", "data", ".venv", ".pytest_cache"}
"""What `make run`, `make test` and the tour write into the checkout (ignored by git): no test may depend on them."""


def _checkout_without_outputs(where: Path) -> Path:
    """``where`` holding the repository's own files (links) but none of what a run wrote there, so that a
    documented command parses as on a fresh clone whatever `make run` or the tour left in this checkout."""
    where.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name not in RUN_OUTPUTS and not entry.name.startswith("cora."):
            (where / entry.name).symlink_to(entry)
    return where


@pytest.mark.parametrize("command", COMMANDS + MAKE_COMMANDS, ids=lambda c: c.where)
def test_every_documented_command_parses(command: DocCommand, monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)  # so that the parser says its error here
    monkeypatch.chdir(_checkout_without_outputs(tmp_path))  # commands run from the repository root
    args, said = _parse(command.argv)
    assert args is not None, f"{command}\nis refused by the parser:\n{said}"


# Flags of other programs the pages name: Slurm's sbatch/srun, Open MPI's mpiexec and mpirun, pip, pytest and
# pytest-xdist.
OTHER_PROGRAMS_FLAGS = {"--account", "--partition", "--ntasks", "--ntasks-per-node", "--cpus-per-task", "--gpus-per-task", "--export",
                        "--mpi", "--kill-on-bad-exit", "--oversubscribe", "--no-binary", "--host", "--mca",
                        "--durations", "--maxprocesses"}


def _all_flags(parser: argparse.ArgumentParser) -> set[str]:
    flags: set[str] = set()
    for action in parser._actions:
        flags.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= _all_flags(sub)
    return flags


def test_documented_commands_parse_after_make_run_left_its_outputs(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """The two commands in either order (issue 36): `make run`'s prepared Cora in the checkout changes nothing
    the suite decides. Here it exists in the real checkout's place, and the Makefile's prepare still parses in
    the clean view the test above uses (and is refused in the real one, which is why that view exists)."""
    checkout = _checkout_without_outputs(tmp_path / "clean")
    polluted = tmp_path / "polluted"
    polluted.mkdir()
    for entry in checkout.iterdir():
        (polluted / entry.name).symlink_to(entry.resolve())
    (polluted / "data_prepared" / "cora").mkdir(parents=True)
    (polluted / "data_prepared" / "cora" / "meta.json").write_text("{}")
    prepare = next(c for c in MAKE_COMMANDS if c.argv[0] == "prepare")
    monkeypatch.chdir(polluted)
    refused, _ = _parse(prepare.argv)
    assert refused is None, "prepare --out over an existing directory must be refused (else this test tests nothing)"
    monkeypatch.chdir(checkout)
    args, said = _parse(prepare.argv)
    assert args is not None, said


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_flag_a_page_names_exists(page: Path) -> None:
    """Prose and tables too: a renamed or removed flag anywhere in the README or docs fails here."""
    from runners import cli

    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", page.read_text()))
    unknown = sorted(named - _all_flags(cli._parser()) - OTHER_PROGRAMS_FLAGS)
    assert not unknown, f"{page.relative_to(ROOT)} names flags no sparse-dist command has: {unknown}"


def test_the_pages_name_many_flags() -> None:
    """The flag check above reads every flag the pages name (it would pass on pages that name none)."""
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", "".join(p.read_text() for p in [README, *DOCS])))
    assert len(named) > 100, named


def test_the_documented_files_exist() -> None:
    """Study files, batch templates, modules and tests the README and docs name by path are in the repository."""
    text = "".join(p.read_text() for p in [README, *DOCS])
    named = set(re.findall(r"(?<![\w/.])(?:sparse_dist|algorithms|runners|slurm|tests|docs)/[\w/.-]*\w", text))
    assert len(named) >= 40, named
    missing = sorted(path for path in named - WRITTEN_ELSEWHERE if not (ROOT / path).exists())
    assert not missing, f"the docs name files that do not exist: {missing}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings (outside code blocks); repeated headings get ``-1``, ``-2``."""
    anchors: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            slug, n = _slug(line.lstrip("#")), 1
            while slug in anchors:
                slug, n = f"{_slug(line.lstrip('#'))}-{n}", n + 1
            anchors.add(slug)
    return anchors


def _links(page: Path) -> list[tuple[str, str]]:
    """The relative Markdown links of a page, outside code blocks: (target path, anchor)."""
    links = []
    fenced = False
    for line in page.read_text().splitlines():
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            links.append((path, anchor))
    return links


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_at_a_file_and_heading(page: Path) -> None:
    """A link names an existing file (or a page another engineer writes in parallel: WRITTEN_ELSEWHERE) and,
    with ``#anchor``, one of its headings."""
    broken = []
    for path, anchor in _links(page):
        target = (page.parent / path).resolve() if path else page
        name = target.relative_to(ROOT).as_posix() if target.is_relative_to(ROOT) else str(target)
        if not target.exists():
            if name not in WRITTEN_ELSEWHERE:
                broken.append(f"{path}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            broken.append(f"{path}#{anchor}: no such heading in {name}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_link_check_reads_links() -> None:
    """The link check above must see links (it would pass on pages it failed to read) and anchors."""
    links = [link for page in [README, *DOCS] for link in _links(page)]
    assert len(links) > 50 and sum(bool(anchor) for _, anchor in links) > 10, links
    assert "time-to-accuracy" in _anchors(ROOT / "docs" / "reference" / "results-file.md")


def test_the_flags_page_is_what_the_parsers_say() -> None:
    """docs/reference/flags.md is generated; regenerate it with `python docs/flags_page.py`."""
    spec = importlib.util.spec_from_file_location("flags_page", ROOT / "docs" / "flags_page.py")
    assert spec and spec.loader
    flags_page = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flags_page)
    assert flags_page.PAGE.read_text() == flags_page.render(), \
        "docs/reference/flags.md is out of date: run `python docs/flags_page.py`"


ERRORS_PAGE = ROOT / "docs" / "reference" / "errors.md"


def test_the_documented_flag_error_is_what_the_parser_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/reference/errors.md, "Failures never hang": the sentence a bad --sample gets."""
    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    documented = _block_after(ERRORS_PAGE, r"said once per job \(by launcher rank 0")
    args, said = _parse(["train", "--data", "data/cora", "--sample", "foo"])
    assert args is None and said.strip() == documented.strip()


def _block_after(page: Path, pattern: str) -> str:
    """The first fenced block after the text of ``page`` matching ``pattern``."""
    text = page.read_text()
    match = re.search(pattern, text)
    assert match, f"{page.relative_to(ROOT)} no longer has {pattern!r}"
    block = re.search(r"```[a-z]*\n(.*?)```", text[match.end():], re.S)
    assert block, f"no code block after {pattern!r}"
    return block.group(1)


# ------------------------------------------------------------------------------------------ runs
def _find(prefix: str) -> DocCommand:
    """The first command (README first, then docs/) that starts (after ``sparse-dist``) with ``prefix``;
    fails if it is gone."""
    wanted = tuple(shlex.split(prefix))
    for command in COMMANDS:
        if command.argv[:len(wanted)] == wanted:
            return command
    raise AssertionError(f"no page has a `sparse-dist {prefix} ...` command any more; update tests/cli/test_docs.py")


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


@pytest.mark.slow
def test_the_worked_example_and_the_model_commands_run(tmp_path: Path) -> None:
    # The README tour, verbatim: prepare the built-in Cora.
    prepare = _find("prepare planetoid --out data/cora --parts 4")
    assert prepare.where.startswith("README.md:"), prepare  # the tour's own command, not a guide page's
    assert "(metis)" in _ok(prepare, _run(prepare, tmp_path))  # the default partitioner when pymetis imports
    assert json.loads((tmp_path / "data" / "cora" / "meta.json").read_text())["num_parts"] == 4

    # The tour's training run: as written except 2 ranks (not 4) and --epochs 50 appended (not 200),
    # so that its --checkpoint-every 50 still writes a checkpoint.
    train = _find("train --data data/cora --plan p2p --out cora.jsonl")
    assert "--checkpoint-every" in train.argv and train.where.startswith("README.md:"), train
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
    compare = _find("cost compare results/clustered-strong")
    assert "(calibration)" in _ok(compare, _run(compare, tmp_path))
    predict = _find("cost predict --graph ogbn-papers100M")
    text = _ok(predict, _run(predict, tmp_path))
    assert re.search(r"^\s+1024 p2p\s+exact\s", text, re.M), text
    assert "sancus-h:eps=0.05 left out" in text  # the stand-in study has no sancus-h run to measure


def test_the_documented_missing_dataset_error_is_said_once(tmp_path: Path) -> None:
    """docs/reference/errors.md, "User errors, said once" (and the README's tour): the command and the one
    line it prints, verbatim."""
    block = _block_after(ERRORS_PAGE, r"Every rank raises the same error and rank 0 alone says it").strip().splitlines()
    tour = _block_after(README, r"A mistake is said once per job").strip().splitlines()
    assert tour == block, "the README's example error differs from docs/reference/errors.md's"
    command = _command("README.md", block[0])
    assert command is not None and command.ranks == 2, block
    result = _run(command, tmp_path, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == block[1:], result.stderr
