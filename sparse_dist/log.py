"""Rank-aware logging: every record carries the MPI rank that wrote it.

Library code logs through :func:`get_logger` and never prints. The rank is
set by the communicator facade once MPI is up (:func:`set_rank`); before that
it is read from the launcher's environment (MPICH/Hydra, Open MPI, Slurm).
"""

from __future__ import annotations

import logging
import os

_RANK_ENV_VARS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
_state = {"rank": None}


def _rank_from_env() -> int | None:
    for name in _RANK_ENV_VARS:
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return None


def set_rank(rank: int) -> None:
    """Record this process's world rank for all later log records."""
    _state["rank"] = rank


def current_rank() -> int | None:
    """The world rank if known (set by the facade or from the launcher), else None."""
    return _state["rank"] if _state["rank"] is not None else _rank_from_env()


class _RankFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        rank = current_rank()
        record.rank = "-" if rank is None else str(rank)
        return True


def get_logger(name: str) -> logging.Logger:
    """A logger under the ``sparse_dist`` hierarchy whose records carry ``rank``."""
    logger = logging.getLogger(name if name.startswith("sparse_dist") else f"sparse_dist.{name}")
    if not any(isinstance(f, _RankFilter) for f in logger.filters):
        logger.addFilter(_RankFilter())
    return logger


def configure(level: str | int = "WARNING") -> None:
    """Send ``sparse_dist`` records to stderr as ``[rank R] LEVEL name: message``.

    Called by the command-line entry point, never by library code.
    """
    root = logging.getLogger("sparse_dist")
    root.setLevel(level if isinstance(level, int) else level.upper())
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.addFilter(_RankFilter())
        handler.setFormatter(logging.Formatter("[rank %(rank)s] %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
