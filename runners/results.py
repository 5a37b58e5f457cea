"""Results files: JSON lines kept by rank 0 and written under a temporary name, renamed when complete."""

from __future__ import annotations

import json
import os
import platform
import resource
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch


def temporary_beside(path: Path) -> Path:
    """Where a file is written before it is renamed to ``path`` (hidden, unique to this process)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def output_path_problem(path: str | Path, flag: str, what: str, example: str) -> str | None:
    """Why ``path`` cannot become the file ``what`` (named by ``flag``; a typical name ``example``) by a rename
    beside it; None if it can.

    Missing directories on the way are fine (the writers create them); the nearest existing one must be
    a writable directory, and ``path`` itself must not be a directory.
    """
    path = Path(path)
    if path.is_dir():
        return f"{flag} {path}: is a directory; expected the path of {what}, e.g. {path / example}"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{flag} {path}: {ancestor} is not a directory; expected the path of {what} in a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return (f"{flag} {path}: directory {ancestor} is not writable; expected the path of {what} "
                f"in a writable directory")
    return None


class ResultsWriter:
    """Keeps JSON lines in memory and writes them on :meth:`close`: to ``.path.tmp-PID``, renamed to ``path``.

    Nothing is on disk before :meth:`close`, so a run that fails, is interrupted or is killed (even by
    ``kill -9`` or another rank's ``MPI_Abort``) leaves no partial file; a failed write removes its
    temporary file. A results file is a few kilobytes per epoch.
    """

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._lines: list[str] | None = [] if self.path is not None else None

    def write(self, record: dict[str, Any]) -> None:
        if self._lines is not None:
            self._lines.append(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._lines is None or self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = temporary_beside(self.path)
        try:
            with open(temporary, "w") as handle:
                handle.writelines(self._lines)
            os.replace(temporary, self.path)
        finally:
            temporary.unlink(missing_ok=True)
        self._lines = None


def print_report(rank: int, text: str, result: dict[str, Any], as_json: bool) -> None:
    """Rank 0 prints a benchmark's table, then (``--json``) the whole result as the last line."""
    if rank != 0:
        return
    print(text, flush=True)
    if as_json:
        print(json.dumps(result), flush=True)


def spread(values: list[float]) -> dict[str, float]:
    """min / mean / max of one figure over ranks."""
    array = np.asarray(values, dtype=np.float64)
    return {"min": float(array.min()), "mean": float(array.mean()), "max": float(array.max())}


def peak_memory_bytes(device: torch.device) -> dict[str, int]:
    """Peak resident set of this process (and peak CUDA allocation when on a GPU)."""
    peak = {"rss": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
    if device.type == "cuda":
        peak["cuda"] = int(torch.cuda.max_memory_allocated(device))
    return peak


def environment(mpi: dict[str, str], world_size: int, threads: int, ranks_on_node: int) -> dict[str, Any]:
    """Where a run ran: versions, MPI library, ranks and threads, the node's CPU count (to spot
    oversubscription: ranks_on_node * threads_per_rank > cpu_count), and the network when
    ``sparse-dist emulate`` ran it (its ``SPARSE_DIST_NETWORK``; absent otherwise)."""
    network = os.environ.get("SPARSE_DIST_NETWORK")
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "platform": platform.platform(), "argv": sys.argv, "world_size": world_size,
            "threads_per_rank": threads, "cpu_count": os.cpu_count(), "ranks_on_node": ranks_on_node, **mpi,
            **({"network": json.loads(network)} if network else {})}
