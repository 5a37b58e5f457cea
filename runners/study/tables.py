"""Checks of a study file's TOML values, shared by its parts (:mod:`runners.study.spec`,
:mod:`runners.study.datasets`): each raises :class:`StudyError` naming the field."""

from __future__ import annotations

from typing import Any


class StudyError(ValueError):
    """A study file that cannot be run; the message names the file and the field."""


def expect(where: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise StudyError(f"{where}: expected {what}, found {value!r}")
    return value


def int_list(where: str, value: Any, minimum: int) -> list[int]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(x, int) and not isinstance(x, bool) and x >= minimum for x in items):
        raise StudyError(f"{where}: expected a non-empty list of integers >= {minimum}, found {value!r}")
    return list(items)


def str_list(where: str, value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(x, str) and x for x in items):
        raise StudyError(f"{where}: expected a non-empty list of strings, found {value!r}")
    return list(items)


def unknown_keys(where: str, table: dict[str, Any], known: set[str]) -> None:
    extra = sorted(set(table) - known)
    if extra:
        raise StudyError(f"{where}: unknown field(s) {extra}; expected some of {sorted(known)}")
