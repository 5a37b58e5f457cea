"""A late rank shows in its partners' waits, not in their own exchange time, and not in its own wait.

The last rank is made late on purpose (test-only: it sleeps before it posts; no library code knows of it):

* collectives: after a barrier the late rank sleeps ``DELAY`` before each kind of exchange (alltoallv, a
  broadcast from it, a reduce and a gather to rank 0, an allreduce) while the others post at once. Every rank
  whose part depends on the late one books at least ``FLOOR * DELAY`` as ``wait_seconds`` and less than
  ``CEILING * DELAY`` as its own seconds (total less wait); the late rank's wait stays under ``CEILING * DELAY``.
* training: the late rank sleeps ``DELAY`` before each step's forward (before its first exchange) for every plan
  in ``PLANS``; over the checked steps, the others' ``exchange_wait`` holds the delay and their ``exchange``
  does not, the late rank's ``exchange_wait`` stays near zero, and every rank's parts add up to its ``total``.

Bounds are loose (a shared machine: 2 cores, other jobs) but the delay is many times the exchanges' own time.
Prints each rank's seconds (``WAITS ...`` lines) so a failure shows the numbers.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from case_report import finish  # noqa: E402
from row_groups import local_graph  # noqa: E402

from algorithms.train import TrainConfig, Trainer  # noqa: E402
from sparse_dist.comm import Communicator, run_or_abort, world  # noqa: E402
from sparse_dist.layout import RowLayout  # noqa: E402

DELAY = 0.4        # seconds the late rank sleeps before it posts
FLOOR = 0.6        # a dependent rank's wait is at least this share of the delay
CEILING = 0.3      # an own time, and the late rank's wait, stay under this share of it
STEPS = 2          # checked training steps (after one warm-up step, on time)
PLANS = ("p2p", "sparse-bcast", "dense-bcast")


def graph(n: int = 120, degree: int = 6, classes: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    """A small random undirected graph (every row group exchanges with every other at P <= 3)."""
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), degree)
    adjacency = sp.csr_matrix((np.ones(rows.size), (rows, rng.integers(0, n, rows.size))), shape=(n, n))
    adjacency = ((adjacency + adjacency.T) > 0).astype(np.float64).tocsr()
    return {"adjacency": adjacency, "features": rng.random((n, 8)).astype(np.float32),
            "labels": rng.integers(0, classes, n), "train": rng.random(n) < 0.5}


def say(line: str) -> None:
    """One line in one write (ranks share the pipe)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def timed(comm: Communicator, phase: str, late: bool, post: Callable[[], None]) -> tuple[float, float]:
    """``(own, wait)`` seconds this rank books under ``phase`` for one exchange the late rank posts ``DELAY``
    after the others (aligned by a barrier first)."""
    comm.barrier()
    before = comm.stats.counter(phase)
    seconds, waited = before.seconds, before.wait_seconds
    if late:
        time.sleep(DELAY)
    post()
    after = comm.stats.counter(phase)
    wait = after.wait_seconds - waited
    return after.seconds - seconds - wait, wait


def check_collectives(comm: Communicator, failures: list[str]) -> None:
    """Each herald kind: the ranks that depend on the late one wait for it; nobody's own time holds the delay."""
    late_rank = comm.size - 1
    late = comm.rank == late_rank
    rows = torch.ones(2 * comm.size, 4)
    received = torch.zeros_like(rows)
    piece = torch.ones(3)
    gathered = torch.zeros(3 * comm.size) if comm.rank == 0 else None
    kinds: dict[str, tuple[Callable[[], None], bool]] = {  # name: (post and complete it, this rank depends on late)
        "alltoallv": (lambda: comm.alltoallv(rows, [2] * comm.size, received, [2] * comm.size, "forward"), True),
        "broadcast from the late rank": (lambda: comm.bcast_(piece, late_rank, "forward"), True),
        "reduce to rank 0": (lambda: comm.ireduce(None if comm.rank == 0 else piece,
                                                  piece if comm.rank == 0 else None, 0, "backward").wait(),
                             comm.rank == 0),
        "gather to rank 0": (lambda: comm.igather_(None if comm.rank == 0 else piece, gathered, 0,
                                                   "backward").wait(), comm.rank == 0),
        "allreduce": (lambda: comm.allreduce_(piece, "grad_allreduce"), True),
    }
    phases = {"alltoallv": "forward", "broadcast from the late rank": "forward", "reduce to rank 0": "backward",
              "gather to rank 0": "backward", "allreduce": "grad_allreduce"}
    for name, (post, depends) in kinds.items():
        own, wait = timed(comm, phases[name], late, post)
        say(f"WAITS P={comm.size} rank {comm.rank}{' (late)' if late else ''} {name}: own {own:.4f} s, "
            f"wait {wait:.4f} s")
        if late and wait >= CEILING * DELAY:
            failures.append(f"{name}: the late rank waited {wait:.3f} s (expected near 0; delay {DELAY} s)")
        if not late and depends and wait < FLOOR * DELAY:
            failures.append(f"{name}: waited {wait:.3f} s for a rank {DELAY} s late (expected >= {FLOOR * DELAY})")
        if not late and own >= CEILING * DELAY:
            failures.append(f"{name}: own time {own:.3f} s holds the partner's delay of {DELAY} s")


def check_training(comm: Communicator, failures: list[str]) -> None:
    """Per plan: the step records of a run whose last rank starts each forward ``DELAY`` late."""
    data = graph()
    layout = RowLayout.balanced(data["adjacency"].shape[0], comm.size)
    late = comm.rank == comm.size - 1
    total_delay = DELAY * STEPS
    for plan in PLANS:
        trainer = Trainer(comm, local_graph(data, layout, comm.rank, 3, "waits"),
                          TrainConfig(plan=plan, hidden=8, layers=2, epochs=STEPS + 1, input_exchange="per-epoch"))
        forward = trainer.forward

        def late_forward(training: bool, **kwargs) -> torch.Tensor:
            if training:
                time.sleep(DELAY)  # before the step's first exchange
            return forward(training, **kwargs)

        trainer.train_epoch()  # warm-up, on time: first touches, lazy transposes
        trainer.forward = late_forward if late else forward
        records = [trainer.train_epoch() for _ in range(STEPS)]
        trainer.close()
        times = {key: sum(r["time"][key] for r in records) for key in records[0]["time"]}
        say(f"WAITS P={comm.size} rank {comm.rank}{' (late)' if late else ''} {plan} over {STEPS} steps: "
            + ", ".join(f"{key} {value:.4f}" for key, value in times.items()))
        for record in records:
            parts = [value for key, value in record["time"].items() if key != "total"]
            if min(parts) < 0 or sum(parts) > record["time"]["total"] + 1e-6:
                failures.append(f"{plan}: parts {record['time']} do not add up to the total")
        if late and times["exchange_wait"] >= CEILING * total_delay:
            failures.append(f"{plan}: the late rank's exchange_wait {times['exchange_wait']:.3f} s (expected near 0)")
        if not late and times["exchange_wait"] < FLOOR * total_delay:
            failures.append(f"{plan}: exchange_wait {times['exchange_wait']:.3f} s for a rank {total_delay:.2f} s "
                            f"late over {STEPS} steps")
        if not late and times["exchange"] >= CEILING * total_delay:
            failures.append(f"{plan}: own exchange {times['exchange']:.3f} s holds the late rank's delay")


def main() -> int:
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    failures: list[str] = []
    check_collectives(comm, failures)
    check_training(comm, failures)
    return finish(comm, failures, f"waits P={comm.size} ({len(PLANS)} plans, {STEPS} steps, delay {DELAY} s)")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
