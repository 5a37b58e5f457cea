"""The table of policy names: which name builds which policy, from which typed parameters.

Imports no policy (a policy module declares its :class:`PolicyKind` entries and :mod:`algorithms.policies`
registers them, explicitly, in one place), so a policy module may import this one without a circle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

AXES: tuple[str, ...] = ("sample", "stale")
AXIS_WORD = {"sample": "sampling", "stale": "staleness"}


@dataclass(frozen=True)
class PolicyKind:
    """One registered policy name: its axis, its parameters (name -> type) and how to build it."""

    name: str
    axis: str                                  # "sample" or "stale"
    params: dict[str, Callable[[str], Any]]
    build: Callable[..., Any]                  # build(seed=..., **params) for samplers, build(**params) for rules
    form: str                                  # the accepted form, for error messages

    def parse_params(self, text: str, spec: str) -> dict[str, Any]:
        """``key=value,...`` -> typed values; a key this kind does not take, or a value of the wrong type, is
        refused with the spec and the accepted form."""
        values: dict[str, Any] = {}
        for item in filter(None, (piece.strip() for piece in text.split(","))):
            key, sep, value = item.partition("=")
            if not sep or key not in self.params:
                raise ValueError(f"policy {spec!r}: unknown parameter {item!r}; expected {self.form}")
            try:
                values[key] = self.params[key](value)
            except ValueError:
                raise ValueError(f"policy {spec!r}: {key}={value!r} is not a {self.params[key].__name__}") from None
        return values


KINDS: dict[str, dict[str, PolicyKind]] = {axis: {} for axis in AXES}
"""Axis -> name -> kind, in registration order (the order of the accepted forms in messages)."""


def register(kind: PolicyKind) -> None:
    """Make ``--sample NAME:...`` (axis ``sample``) or ``--stale NAME:...`` (axis ``stale``) build ``kind``."""
    if kind.axis not in KINDS:
        raise ValueError(f"policy {kind.name!r}: axis must be one of {AXES}, got {kind.axis!r}")
    KINDS[kind.axis][kind.name] = kind


def register_sampler(name: str, build: Callable[..., Any], params: dict[str, Callable[[str], Any]],
                     form: str) -> None:
    """Make ``--sample NAME:key=value,...`` build ``build(seed=RUN_SEED, **typed_params)``.

    ``params`` maps each accepted key to its type (a callable from the text); ``form`` is the accepted
    form shown in errors, e.g. ``"bns:keep=K[,side=receiver|owner]"``.
    """
    register(PolicyKind(name, "sample", params, build, form))


def register_staleness(name: str, build: Callable[..., Any], params: dict[str, Callable[[str], Any]],
                       form: str) -> None:
    """Make ``--stale NAME:key=value,...`` build ``build(**typed_params)`` (see :func:`register_sampler`)."""
    register(PolicyKind(name, "stale", params, build, form))


def flag(value: str) -> bool:
    """A ``0``/``1`` parameter (e.g. ``skip_backward=1``)."""
    if value not in ("0", "1"):
        raise ValueError(value)
    return value == "1"


flag.__name__ = "0 or 1"
