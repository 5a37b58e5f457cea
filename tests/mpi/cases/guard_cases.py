"""The accuracy guard under mpiexec (algorithms.training.guard), on Cora cut into 4 random parts (75% of the
entries cross parts) at a high learning rate, where pipelined staleness falls:

* unguarded, ``pipe:tau=1`` ends far below exact; guarded (the default), within half a point of exact;
* where the signals are the same at every P (``pipe:tau=0`` is the exact path, so its losses and accuracies
  are exact training's, which a tight ``drop`` makes the guard act on), its decisions (epoch, from, to,
  restored epoch) are the same at P = 1, 2 and 4 (this launch runs P = 4 on all ranks, P = 2 on ranks 0-1
  and P = 1 on rank 0), and a checkpoint written at P = 4 after its first decision resumes at P = 2 to
  the same decisions;
* a checkpoint taken after the first tightening, and one taken between an agreed fall and its tightening,
  resume to the uninterrupted run's weights and decisions bitwise at the same P;
* ``guard = off`` gives bitwise the weights of a guard that watches but never acts (it observes only).

Run: ``mpiexec -n 4 python tests/mpi/cases/guard_cases.py DATA`` (DATA: 4 parts).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from case_report import finish  # noqa: E402
from guard_runs import train, trainer, trains_on_alike, weights  # noqa: E402

from algorithms.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from algorithms.train import Trainer  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402

EPOCHS = 60
FALLING = dict(stale="pipe:tau=1", lr=0.05, epochs=EPOCHS)
EXACT_SIGNALS = dict(stale="pipe:tau=0", lr=0.05, epochs=EPOCHS, guard_drop=0.01, guard_patience=2, guard_noise=0.0,
                     guard_settle=0.0)  # thresholds as given: exact training's swings make the guard act


def decisions(run: Trainer) -> list[tuple]:
    return [(d["epoch"], d["from"], d["to"], d["restored_epoch"]) for d in run.guard.state.decisions]


def check_rescue(comm, data: str, failures: list[str]) -> tuple[list[tuple], list[torch.Tensor]]:
    """Exact, unguarded and guarded at this launch's P; returns the guarded run's decisions and weights."""
    finals = {}
    for name, config in (("exact", dict(lr=0.05, epochs=EPOCHS)), ("off", {**FALLING, "guard": "off"}),
                         ("guarded", FALLING)):
        run = trainer(comm, data, **config)
        finals[name] = train(run, EPOCHS)["test_acc"]
        if name == "guarded":
            guarded, final = decisions(run), weights(run)
        run.close()
    if comm.rank == 0:
        print(f"RESCUE P={comm.size} test_acc exact {finals['exact']:.4f} unguarded {finals['off']:.4f} "
              f"guarded {finals['guarded']:.4f}; decisions {guarded}", flush=True)
    if not finals["off"] < finals["exact"] - 0.02:
        failures.append(f"unguarded pipe did not fall here ({finals['off']:.4f} vs exact {finals['exact']:.4f}): "
                        f"the case no longer tests the guard")
    if not finals["guarded"] >= finals["exact"] - 0.005:
        failures.append(f"guarded pipe ends {finals['guarded']:.4f}, more than half a point below exact "
                        f"{finals['exact']:.4f}")
    if not guarded:
        failures.append("the guard took no decision")
    return guarded, final


def check_same_decisions_at_every_p(world_comm, data: str, failures: list[str]) -> None:
    """``pipe:tau=0`` (exact signals) at P = 4, 2 (ranks 0-1) and 1 (rank 0), each run once while the other ranks
    wait; then P = 4's state after its first decision resumed at P = 2. Rank 0 compares."""
    found = {}
    for size in (4, 2, 1):
        comm = world_comm.split(int(world_comm.rank < size), world_comm.rank)  # the first ``size`` ranks
        if world_comm.rank < size:
            run = trainer(comm, data, **EXACT_SIGNALS)
            train(run, EPOCHS)
            found[size] = decisions(run)
            run.close()
        comm.free()
    if world_comm.rank == 0:
        print(f"SAME P=4,2,1 decisions {found}", flush=True)
        for size in (2, 1):
            if found[size] != found[4]:
                failures.append(f"P={size}: decisions {found[size]} differ from P=4's {found[4]}")
    if not found[4]:
        failures.append("pipe:tau=0 with a tight drop: the guard took no decision (the check tests nothing)")
        return
    with tempfile.TemporaryDirectory() as scratch:
        directory = world_comm.allgather_object(scratch)[0]  # rank 0's (one machine: every rank sees it)
        first = trainer(world_comm, data, **EXACT_SIGNALS)
        train(first, found[4][0][0] + 1)
        if world_comm.rank == 0:
            save_checkpoint(Path(directory) / "p4.ckpt", first.state())
        first.close()
        world_comm.barrier()
        half = world_comm.split(int(world_comm.rank < 2), world_comm.rank)
        if world_comm.rank < 2:
            resumed = trainer(half, data, **EXACT_SIGNALS)
            resumed.load_state(load_checkpoint(Path(directory) / "p4.ckpt"))
            train(resumed, EPOCHS)
            if decisions(resumed) != found[4]:
                failures.append(f"P=4's state resumed at P=2: decisions {decisions(resumed)} != {found[4]}")
            resumed.close()
        half.free()
        world_comm.barrier()


def resumed_copy(comm, data: str, first: Trainer, directory: str) -> Trainer:
    """A new trainer from ``first``'s checkpoint (replicated state, and this rank's policy state)."""
    path = Path(directory) / f"guard-{comm.size}.ckpt"
    if comm.rank == 0:
        save_checkpoint(path, first.state())
    rank_path = Path(directory) / f"guard-{comm.size}.rank{comm.rank}"
    save_checkpoint(rank_path, first.policy_state())
    comm.barrier()
    resumed = trainer(comm, data, **FALLING)
    resumed.load_state(load_checkpoint(path))
    if resumed.has_policy_state:
        resumed.load_policy_state(load_checkpoint(rank_path))
    return resumed


def check_resume(world_comm, data: str, expected: list[tuple], final: list[torch.Tensor],
                 failures: list[str]) -> None:
    """Stop the guarded run and resume it from its checkpoint: the uninterrupted ``expected`` and ``final``."""
    first_epoch = expected[0][0]
    with tempfile.TemporaryDirectory() as scratch:
        directory = world_comm.allgather_object(scratch)[0]  # rank 0's (one machine: every rank sees it)
        # after the first tightening; and with a fall agreed but not yet applied (the epoch before it)
        for stop in (first_epoch + 2, first_epoch - 1):
            first = trainer(world_comm, data, **FALLING)
            train(first, stop)
            due = first.guard.due
            resumed = resumed_copy(world_comm, data, first, directory)
            first.close()
            if resumed.guard.due != due:
                failures.append(f"resume at epoch {stop}: an agreed fall was not carried")
            failures += trains_on_alike(resumed, EPOCHS, decisions, expected, final, f"resume at epoch {stop}")
            resumed.close()
        world_comm.barrier()


def check_off_is_watching_only(comm, data: str, failures: list[str]) -> None:
    runs = []
    for guard in (dict(guard="off"), dict(guard="auto", guard_drop=0.99, guard_sharp=0.995, guard_patience=1000,
                                              guard_loss_rise=100.0)):
        run = trainer(comm, data, **{**FALLING, "epochs": 30}, **guard)
        train(run, 30)
        runs.append(weights(run))
        if decisions(run):
            failures.append(f"{guard}: the guard acted")
        run.close()
    if not all(torch.equal(a, b) for a, b in zip(*runs)):
        failures.append("guard off and a guard that only watches give different weights")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = world()
    failures: list[str] = []
    expected, final = check_rescue(comm, args.data, failures)
    if expected:
        check_resume(comm, args.data, expected, final, failures)
    if comm.size == 4:
        check_same_decisions_at_every_p(comm, args.data, failures)
    check_off_is_watching_only(comm, args.data, failures)
    return finish(comm, failures, f"guard cases P={comm.size}")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
