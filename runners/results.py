"""Results files: JSON lines written by rank 0 under a temporary name, renamed when complete."""

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


class ResultsWriter:
    """Appends JSON lines to ``.path.tmp-PID`` and renames it to ``path`` on :meth:`close`."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._temporary = None
        self._handle = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._temporary = temporary_beside(self.path)
            self._handle = open(self._temporary, "w")

    def write(self, record: dict[str, Any]) -> None:
        if self._handle is not None:
            self._handle.write(json.dumps(record) + "\n")
            self._handle.flush()

    def close(self) -> None:
        if self._handle is not None and self.path is not None and self._temporary is not None:
            self._handle.close()
            os.replace(self._temporary, self.path)
            self._handle = None


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
    """Where a run ran: versions, MPI library, ranks and threads, and the node's CPU count (to spot
    oversubscription: ranks_on_node * threads_per_rank > cpu_count)."""
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "platform": platform.platform(), "argv": sys.argv, "world_size": world_size,
            "threads_per_rank": threads, "cpu_count": os.cpu_count(), "ranks_on_node": ranks_on_node, **mpi}
