"""Typed argparse parsers: each refuses a value outside its range with the range in the message.

A leaf module (standard library only), so every command, the study loader and the tests share one
set of rules. argparse prefixes the flag: ``argument --lr: must be a finite number > 0, got nan``.
The launcher's world size (:func:`launcher_world_size`) lets ``--replication`` be checked against P
before MPI starts. A renamed flag keeps its old spelling for one release (:func:`add_renamed`): the old
name still works and says its new name in one line (docs/reference/names.md has the renames).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Any, Callable

_WORLD_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS",
                         "SLURM_NTASKS")
"""Where launchers announce P: MPICH/Intel MPI (hydra), Open MPI, MVAPICH, then srun's step (its task count
before the job's, which a step may use only part of)."""
_RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")


def launcher_rank() -> int:
    """This process's rank as the launcher (mpiexec, srun) announced it, before MPI starts; 0 if none did."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def launcher_world_size() -> int | None:
    """The number of ranks the launcher (mpiexec, srun) started, read before MPI starts.

    1 when no launcher announced a rank (a plain ``python`` run is a singleton); None when a rank was
    announced but no size (an unknown launcher: the size is then checked once MPI has started).
    """
    for name in _WORLD_SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    if any(os.environ.get(name, "").isdigit() for name in _RANK_VARIABLES):
        return None
    return 1


def _shown(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _bound_text(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {_shown(low)}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {_shown(high)}")
    return " and ".join(parts)


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer in ``[low, high]`` (either end may be open-ended: None)."""
    wanted = "an integer" + (f" {_bound_text(low, high, False, False)}" if low is not None or high is not None
                             else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its own messages
    return parse


def at_least(low: int) -> Callable[[str], int]:
    """argparse type: an integer ``>= low``."""
    return integer(low)


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number in the interval given (``low_open``: ``> low``; ``high_open``: ``< high``)."""
    bounds = _bound_text(low, high, low_open, high_open)
    wanted = "a finite number" + (f" {bounds}" if bounds else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        below = low is not None and (value <= low if low_open else value < low)
        above = high is not None and (value >= high if high_open else value > high)
        if not math.isfinite(value) or below or above:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {value:g}")
        return value

    parse.__name__ = "number"
    return parse


positive = number(0.0, low_open=True)
"""A finite number > 0 (learning rate, bandwidth)."""

non_negative = number(0.0)
"""A finite number >= 0 (weight decay, clip bound, thresholds)."""

probability = number(0.0, 1.0, high_open=True)
"""A dropout-style probability in ``[0, 1)`` (1 would drop everything)."""

fraction = number(0.0, 1.0)
"""A share in ``[0, 1]``."""

seed = integer(0, 2 ** 63 - 1)
"""A random seed (NumPy's SeedSequence refuses negative ones)."""


def int_list(low: int) -> Callable[[str], list[int]]:
    """argparse type: comma-separated integers, each ``>= low`` (e.g. ``--ranks 64,256,1024``)."""
    def parse(text: str) -> list[int]:
        items = [item.strip() for item in text.split(",")]
        try:
            values = [int(item) for item in items]
        except ValueError:
            values = []
        if not values or min(values) < low:
            raise argparse.ArgumentTypeError(f"must be comma-separated integers >= {low}, e.g. 64,256; got {text!r}")
        return values

    parse.__name__ = "int_list"
    return parse


def replication_problem(replication: int, world_size: int | None) -> str | None:
    """Why a 1.5D replication factor ``c`` cannot run on ``world_size`` ranks (None: it can, or P is unknown)."""
    if world_size is None or world_size % replication == 0:
        return None
    divisors = [c for c in range(1, world_size + 1) if world_size % c == 0]
    return (f"argument --replication: must divide the number of ranks P={world_size}, got {replication} "
            f"(divisors of {world_size}: {', '.join(map(str, divisors))})")


_NOTED: set[str] = set()
"""Lines already said in this process (a study check parses the same table many times)."""


def deprecation_notice(prog: str, old: str, new: str) -> None:
    """One line on stderr saying that ``old`` is now ``new`` (:func:`say_once`)."""
    say_once(f"{prog}: warning: {old} is deprecated, use {new} (the old name goes in the next release)")


def say_once(line: str) -> None:
    """``line`` on stderr once per process, from launcher rank 0 only (every rank parses the same command
    line, as :class:`runners.cli._Parser` says its errors)."""
    if line in _NOTED or launcher_rank() != 0:
        return
    _NOTED.add(line)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class _RenamedFlag(argparse.Action):
    """The old spelling of a renamed flag: stores into the new flag's ``dest`` and says the new name."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        deprecation_notice(parser.prog, option_string or self.option_strings[0], self.new)
        setattr(namespace, self.dest, values)


def add_renamed(parser: argparse.ArgumentParser, new: str, old: str, **kwargs: Any) -> argparse.Action:
    """``parser.add_argument(new, **kwargs)``, plus ``old`` that parses the same way into the same ``dest``
    and prints :func:`deprecation_notice` when used (listed in ``--help`` as the old name for this release,
    as Python 3.13's ``deprecated=True`` does). Returns the new flag's action."""
    action = parser.add_argument(new, **kwargs)
    parser.add_argument(old, dest=action.dest, action=_RenamedFlag, new=new, type=kwargs.get("type"),
                        choices=kwargs.get("choices"), metavar=action.metavar, default=argparse.SUPPRESS,
                        help=f"deprecated: the old name of {new}, which it sets (default: {new}'s)")
    return action
