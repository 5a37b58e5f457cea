"""A study's ``[train]`` table: the ``sparse-dist train`` flags it adds to every run, checked by ``train``'s own
parser and argument checks when the study is loaded (:func:`runners.study.spec.load_study`)."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

from algorithms.policies import PolicySpec
from runners.study.plans import plan_flags, plan_refusal


def train_flags(options: dict[str, object]) -> list[str]:
    """``[train]`` table -> ``sparse-dist train`` flags (``true`` -> bare flag, ``false`` -> left out)."""
    flags: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False:
            flags += [flag, str(value)]
    return flags


class _FlagRefused(Exception):
    """What argparse would have printed before exiting."""


class _TrainParser(argparse.ArgumentParser):
    """``train``'s own parser, raising instead of exiting, so a study is checked by the rules a run obeys."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _FlagRefused(message)


def _train_parser() -> _TrainParser:
    from runners.argtypes import bound_flags
    from runners.train_cmd import add_arguments  # imports torch: only once a study is loaded

    parser = _TrainParser(prog="sparse-dist train", add_help=False, allow_abbrev=False)
    add_arguments(parser)
    bound_flags(parser, "train")  # a [train] value out of its range is refused when the study is loaded
    return parser


def check_train_table(train: dict[str, Any], configurations: list[tuple[str, PolicySpec, str, Any]],
                      data_dirs: list[Path] | None = None) -> str | None:
    """Why a study's ``[train]`` table cannot run (one sentence), or None: a key that is no ``train`` option
    (suggesting the nearest), a value its typed parser refuses, or a combination ``train`` would refuse with
    one of the study's (plan, policy, compression) configurations on one of its dataset directories
    ``data_dirs`` (the runs' real ``--data``, so that a path checked against it, such as a ``checkpoint``,
    is refused for a true reason or not at all; default: the current directory). Run when a study is loaded,
    so ``--dry-run`` and every sweep check it before any launch."""
    from runners.train_cmd import check_arguments

    data_dirs = data_dirs or [Path(".")]
    parser = _train_parser()
    options = sorted({flag[2:].replace("-", "_") for action in parser._actions for flag in action.option_strings})
    for key, value in train.items():
        name = key.replace("-", "_")
        if name not in options:  # a flag's name; an old one too (it says its new name when parsed)
            close = difflib.get_close_matches(name, options, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; expected some of {options}"
            return f"[train] {key}: not an option of `sparse-dist train`{hint}"
        try:
            parser.parse_args(["--data", str(data_dirs[0]), *train_flags({key: value})])
        except _FlagRefused as exc:
            return f"[train] {key} = {value!r}: {exc}"
    for data in data_dirs:
        for plan, policy, compress, entry in configurations:
            if plan_refusal(plan, policy, compress):
                continue  # the study skips it
            where = "[train]" if not entry.name else f"[train] and variant {entry.name}'s train"
            try:
                args = parser.parse_args(["--data", str(data), *plan_flags(plan), "--sample", str(policy.sample),
                                          "--stale", str(policy.stale), "--compress", compress, *train_flags(train),
                                          *train_flags(dict(entry.train))])
            except _FlagRefused as exc:
                return f"{where}: {exc}"
            problem = check_arguments(args)
            if problem:
                shown = "" if compress == "none" else f" and compress {compress}"
                return f"{where} with plan {plan} and policy {policy.text}{shown}: {problem}"
    return None
