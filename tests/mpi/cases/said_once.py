"""Errors several ranks raise at an agreed point are said once (argv[1]: ``same``, ``distinct`` or ``internal``).

``same``: every rank finds the same problem; ``distinct``: rank r says ``part r % 7 is damaged`` (at P=8 seven
distinct messages, more than the five shown). Raised through ``comm.raise_if_any`` as a user error, except for
``internal``: the same problem as a RuntimeError, which is not one (its traceback is shown, once).
"""

from __future__ import annotations

import sys

from sparse_dist.comm import run_or_abort, world


def main() -> int:
    comm = world(gpu_aware="off")
    if sys.argv[1] in ("same", "internal"):
        problem = "data/meta.json: 4 parts cannot be split over the row groups"
    else:
        problem = f"part {comm.rank % 7} is damaged"
    comm.raise_if_any(problem, RuntimeError if sys.argv[1] == "internal" else ValueError)
    return 0


if __name__ == "__main__":
    sys.exit(run_or_abort(main, user_errors=(ValueError,), prog="case"))
