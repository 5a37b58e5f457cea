"""Where a GPU epoch goes, kernel by kernel: ``sparse-dist bench train`` with three of each side's epochs (the peer's,
then sparse-dist's) under ``torch.profiler`` before its timed ones, the top CUDA kernels of each printed as a table
(figures of docs/results.md, "On a GPU (NVIDIA H200, 2026-12-04)"). Takes ``bench train``'s flags.

    mpiexec -n 1 .venv/bin/python docs/gpu_epoch_profile.py --data DIR --device cuda --hidden 256 --layers 3 \\
        --warmup 2 --epochs 3 --peer pyg
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import torch

import runners.bench.train as bench_train

_timed_epochs = bench_train.time_epochs
_sides: list[str] = []


def _wait() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _profiled(step: Callable[[], Any], device: torch.device, warmup: int, epochs: int,
              barrier: Callable[[], None]) -> dict[str, Any]:
    """``bench train``'s ``time_epochs``, after ``warmup`` epochs and three profiled ones."""
    for _ in range(warmup):
        step()
    _wait()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(3):
            step()
        _wait()
    side = "the peer" if not _sides else "sparse-dist"
    _sides.append(side)
    order = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    print(f"===== {side}: 3 epochs profiled =====\n"
          f"{profile.key_averages().table(sort_by=order, row_limit=22, max_name_column_width=70)}", flush=True)
    return _timed_epochs(step, device, 0, epochs, barrier)


if __name__ == "__main__":
    bench_train.time_epochs = _profiled
    from runners.cli import main
    sys.exit(main(["bench", "train", *sys.argv[1:]]))
