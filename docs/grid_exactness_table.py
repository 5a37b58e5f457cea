"""The process grid's exactness table: every grid of the exactness cases against one process, largest differences.

Runs ``tests/mpi/cases/grid_cases.py`` under mpiexec with ``GRID_CASES_REPORT`` set (float64, then float32: the
grid in that dtype, the reference in float64) at 4 and 8 ranks, the grids of ``tests/mpi/test_grid.py``, and prints
one markdown row per model, graph, grid and dtype: the largest relative difference of a step's loss, of a first
step's gradient and of a weight after 3 Adam steps (over the reference parameter's largest magnitude), the largest
over the grid's ranks. GCN and SAGE, 3 layers of width 10; the directed graph aggregates layer 0 once, Cora
drops every layer's input (p = 0.5). Run from the repository root::

    PATH=.venv/bin:$PATH .venv/bin/python docs/grid_exactness_table.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAUNCHES = ((4, ["1,1,1", "2,1,1", "1,2,1", "1,1,2", "1,1,3", "2,2,1", "1,2,2", "4,1,1", "1,4,1", "1,1,4"]),
            (8, ["2,2,2", "4,2,1", "1,1,8", "3,2,1", "1,2,3"]))


def rows(ranks: int, grids: list[str], dtype: str) -> list[list[str]]:
    """The EXACTNESS lines of one launch, split into fields."""
    env = dict(os.environ, GRID_CASES_REPORT=dtype)
    done = subprocess.run(["mpiexec", "-n", str(ranks), sys.executable, str(ROOT / "tests/mpi/cases/grid_cases.py"),
                           *grids], env=env, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        raise SystemExit(f"grid_cases.py at {ranks} ranks ({dtype}) failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("EXACTNESS ")]


def main() -> int:
    print("| model | graph | grid | dtype | dropout | loss | gradient | weight |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype in ("float64", "float32"):
        for ranks, grids in LAUNCHES:
            for kind, graph, grid, kept, dropout, loss, gradient, weight in rows(ranks, grids, dtype):
                values = [field.split("=", 1)[1] for field in (dropout, loss, gradient, weight)]
                print(f"| {kind} | {graph} | {grid.replace(',', 'x')} | {kept} | " + " | ".join(values) + " |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
