"""Time the accuracy guard's own work per evaluation against the training step (docs/results.md, the guard).

Run under MPI from the repository root, e.g.::

    PYTHONPATH=. mpiexec -n 2 .venv/bin/python docs/guard_cost.py DATA pipe:tau=1 150

It trains as ``train`` does (a step told that an evaluation follows, then that evaluation) with the policy given
(``exact``, one axis, or both joined by ``+``, as studies write it), wraps ``Guard.note_metrics`` (the kept copy
of a new best) and ``Guard.agree`` (the one allgather) in timers, and prints, from rank 0, the median over the
epochs after the first five of each and of the step.

The step is the record's ``time.total``, the slowest rank's: the forward, the loss, the backward, the gradient
allreduce, the optimiser and a policy's per-epoch work (dgs' explanation where due). ``train_epoch`` told
``evaluation_follows`` also runs the next evaluation's exact forward and counts and then posts the gradient
flights a pipelined rule held (:mod:`sparse_dist.lifecycle`); the record leaves both out of its time, so the
step is compared without them. The guard's work runs in ``evaluate()``, after the step.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from algorithms.policies import PolicySpec
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
    spec = PolicySpec.parse(policy)
    run = Trainer(comm, load_local_graph(comm, data, comm.size, 1),
                  TrainConfig(epochs=epochs, sample=spec.sample, stale=spec.stale))
    steps = []
    for _ in range(epochs):
        steps.append(run.train_epoch(evaluation_follows=True)["time"]["total"])  # the step alone
        run.evaluate()
    run.close()
    slowest = np.max(comm.allgather_object(steps), axis=0)  # collective: every rank's steps
    if comm.rank == 0:
        note, agree = (1e3 * np.array(spent[name][WARM_EPOCHS:]) for name in ("note_metrics", "agree"))
        step = 1e3 * np.median(slowest[WARM_EPOCHS:])
        guard = np.median(note + agree) if note.size else 0.0
        print(f"{policy} P={comm.size}: guard {'on' if run.guard.on else 'off'}, per evaluation median "
              f"{guard:.3f} ms (kept copy {np.median(note) if note.size else 0:.3f}, agreement "
              f"{np.median(agree) if agree.size else 0:.3f}); step median {step:.2f} ms (the slowest rank's); "
              f"{100 * guard / step:.2f}% of it", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
