"""Write docs/reference/flags.md from the real ``sparse-dist`` parsers, so the page cannot drift from the code.

Run ``python docs/flags_page.py`` after changing a flag; ``tests/cli/test_docs.py`` fails while the page
differs from what this script renders. Every command's flags come from ``runners.cli._parser()``: each
flag with its metavar, default and help text, and each command's epilog as preformatted text; then every
numeric flag's range and its reason (``runners.argtypes.FLAG_RANGES``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "flags.md"

HEADER = """# Flags of every `sparse-dist` command

Generated from the parsers by `python docs/flags_page.py` (do not edit by hand; `tests/cli/test_docs.py`
fails while this page differs from the code). `sparse-dist COMMAND --help` prints the same text.
The global flags go before the command (`sparse-dist --debug train ...`); a bad flag is refused before
MPI starts, said once per job, exit status 2 (see [errors](errors.md)).
"""


def _cell(text: str) -> str:
    """Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _flag(action: argparse.Action) -> str:
    """``--name METAVAR`` (aliases joined by commas), or the positional's name."""
    formatter = argparse.HelpFormatter("sparse-dist")
    if not action.option_strings:
        return f"`{formatter._metavar_formatter(action, action.dest)(1)[0]}`"
    if action.nargs == 0:
        return ", ".join(f"`{option}`" for option in action.option_strings)
    metavar = formatter._format_args(action, action.dest.upper())
    return ", ".join(f"`{option} {metavar}`" for option in action.option_strings)


def _default(action: argparse.Action) -> str:
    if not action.option_strings or action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    return f"`{str(action.default).replace(str(ROOT) + '/', '')}`"


def _help(action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    text = argparse.HelpFormatter("sparse-dist")._expand_help(action)
    if action.choices is not None and action.metavar is not None:  # else the flag column lists them
        text += f" (one of: {', '.join(str(choice) for choice in action.choices)})"
    return text.replace(str(ROOT) + "/", "")  # defaults inside the checkout are shown relative to it


def _section(parser: argparse.ArgumentParser, words: list[str], lines: list[str], summary: str | None = None) -> None:
    """One command's section (``summary``: its one line in the parent's list, where it has no description),
    then its subcommands' in parser order."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    rows = [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and a.help != argparse.SUPPRESS]
    title = " ".join(["sparse-dist", *words]) if words else "sparse-dist (global flags)"
    if rows or not subcommands:
        lines += ["", f"## `{title}`", ""]
        if parser.description or summary:
            lines += [parser.description or summary, ""]
        if rows:
            lines += ["| flag | default | what |", "|---|---|---|"]
            lines += [f"| {_flag(a)} | {_cell(_default(a))} | {_cell(_help(a))} |" for a in rows]
        if parser.epilog:
            lines += ["", "```text", parser.epilog.strip("\n"), "```"]
    for action in subcommands:
        summaries = {choice.dest: choice.help for choice in action._choices_actions}
        for name, sub in action.choices.items():
            _section(sub, [*words, name], lines, summaries.get(name))


RANGES = """## Ranges, and why

Every numeric flag accepts the interval its help ends with, checked while the command line is parsed: a
value outside it is refused in one sentence, exit status 2, before MPI starts or anything is allocated
(`runners/argtypes.py`, `FLAG_RANGES`). A thread count's upper end is the cores the rank may use
(`os.sched_getaffinity`); `--threads N!` forces more, up to {forced}. A list's bound holds for each entry.
"""


def _ranges(lines: list[str]) -> None:
    """Every command's numeric flags with their interval and the reason for its ends."""
    from runners.argtypes import FLAG_RANGES, MAX_FORCED_THREADS

    lines += ["", *RANGES.format(forced=MAX_FORCED_THREADS).rstrip("\n").splitlines(), "",
              "| command | flag | range | why |", "|---|---|---|---|"]
    for command, flags in FLAG_RANGES.items():
        lines += [f"| {command} | `{flag}` | `{limit.interval()}` | {_cell(limit.why)} |" for flag, limit in flags.items()]


def render() -> str:
    """The page's text, from the parsers as they are now."""
    from runners import cli

    lines = HEADER.rstrip("\n").splitlines()
    _section(cli._parser(), [], lines)
    _ranges(lines)
    return "\n".join(lines) + "\n"


def main() -> int:
    text = render()
    temporary = PAGE.with_name(f".{PAGE.name}.tmp")
    temporary.write_text(text)
    temporary.replace(PAGE)
    print(f"wrote {PAGE} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
