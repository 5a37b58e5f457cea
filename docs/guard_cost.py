"""Time the accuracy guard's own work per evaluation against the training step (docs/results.md, the guard).

Run under MPI from the repository root, e.g.::

    PYTHONPATH=. mpiexec -n 2 .venv/bin/python docs/guard_cost.py DATA pipe:tau=1 150

It trains as ``train`` does (a step, then the evaluation) with the policy given (``pipe:...``/``sancus-...`` on
the staleness axis, anything else on the sampling axis, ``exact`` for none), wraps ``Guard.note_metrics`` (the
kept copy of a new best) and ``Guard.agree`` (the one allgather) in timers, and prints, from rank 0, the median
over the epochs after the first five of each and of the step.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from algorithms.train import TrainConfig, Trainer
from algorithms.training.guard import Guard
from runners.data.shards import load_local_graph
from sparse_dist.comm import world

WARM_EPOCHS = 5


def timed(spent: list[float], method: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = method(*args, **kwargs)
        spent.append(time.perf_counter() - start)
        return result
    return wrapper


def main(data: str, policy: str, epochs: int) -> None:
    comm = world()
    spent: dict[str, list[float]] = {"note_metrics": [], "agree": []}
    for name, times in spent.items():
        setattr(Guard, name, timed(times, getattr(Guard, name)))
    axis = ("stale" if policy.startswith(("pipe", "sancus")) else "sample") if policy != "exact" else None
    run = Trainer(comm, load_local_graph(comm, data, comm.size, 1),
                  TrainConfig(epochs=epochs, **({axis: policy} if axis else {})))
    steps = []
    for _ in range(epochs):
        start = time.perf_counter()
        run.train_epoch(evaluation_follows=True)
        steps.append(time.perf_counter() - start)
        run.evaluate()
    run.close()
    if comm.rank == 0:
        note, agree = (1e3 * np.array(spent[name][WARM_EPOCHS:]) for name in ("note_metrics", "agree"))
        step = 1e3 * np.median(steps[WARM_EPOCHS:])
        guard = np.median(note + agree) if note.size else 0.0
        print(f"{policy} P={comm.size}: guard {'on' if run.guard.on else 'off'}, per evaluation median "
              f"{guard:.3f} ms (kept copy {np.median(note) if note.size else 0:.3f}, agreement "
              f"{np.median(agree) if agree.size else 0:.3f}); step median {step:.2f} ms; "
              f"{100 * guard / step:.2f}% of it", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
