"""The guard's bias signal under mpiexec (algorithms.training.bias), at P = 2 on a graph whose labels travel across
the cut (tests/support/datasets_for_tests.py: ``across_halves``, the halves being the two parts).

The policy is biased on purpose and registered here only (tests/support/biased_policy.py): ``drop-fixed:drop=0.75``
leaves out the same three quarters of the boundary rows every epoch, unscaled. At lr 0.01 over 200 epochs (seed 1)
it never falls (the guard's first signal takes no decision) and ends far below exact; the bias signal, reading
the audit's exact forward every 8 epochs (fixed here: the chosen interval depends on timing), tightens it to
exact and the run ends within half a point of exact. Each premise is checked, so that a change that makes the
policy fall (or end high) fails here by name rather than passing without testing the signal. Also:

* a run stopped while strikes are counted resumes from its checkpoint to the uninterrupted run's decisions and
  weights, bitwise;
* without ``--audit-every`` the guard prices its interval from the exact evaluation after step 2 (no reading of
  its own to measure), and chooses again after every reading from the readings' mean and the budget left: a
  rung of its ladder (1, 2, 3, 4, 6, 8, 12, ...), recorded, and the references run at those epochs until the
  signal has tightened the policy to exact.

Run: ``mpiexec -n 2 python tests/mpi/cases/bias_cases.py DATA`` (DATA: 2 parts).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from biased_policy import register_biased_policy  # noqa: E402
from case_report import finish  # noqa: E402
from guard_runs import train, trainer, trains_on_alike, weights  # noqa: E402

from algorithms.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402

EPOCHS = 200
BASE = dict(lr=0.01, epochs=EPOCHS, seed=1)
BIASED = dict(BASE, sample="drop-fixed:drop=0.75", audit_every=8)
HALF_A_POINT = 0.005


def check_caught(comm, data: str, failures: list[str]) -> tuple[list[dict], list[torch.Tensor]]:
    """Exact, the old rule alone and both rules; returns the guarded run's decisions and final weights."""
    finals, decided = {}, {}
    for name, config in (("exact", BASE), ("old rule", dict(BIASED, guard_bias="off")), ("both rules", BIASED)):
        run = trainer(comm, data, **config)
        finals[name] = train(run, EPOCHS)["test_acc"]
        decided[name] = list(run.guard.state.decisions)
        final = weights(run)
        run.close()
    if comm.rank == 0:
        said = [(d["epoch"], d["to"], d["reason"]) for d in decided["both rules"]]
        print(f"CAUGHT test_acc exact {finals['exact']:.4f} old rule {finals['old rule']:.4f} both rules "
              f"{finals['both rules']:.4f}; decisions {said}", flush=True)
    if decided["old rule"]:
        failures.append(f"the old rule alone acted ({decided['old rule']}): the policy falls here, so the case no "
                        f"longer tests the bias signal")
    if not finals["old rule"] < finals["exact"] - HALF_A_POINT:
        failures.append(f"the biased policy ends {finals['old rule']:.4f}, not below exact {finals['exact']:.4f}: "
                        f"the case no longer tests the bias signal")
    if not decided["both rules"] or "exact on the same weights" not in decided["both rules"][0]["reason"]:
        failures.append(f"the bias signal did not tighten the biased policy: {decided['both rules']}")
    if not finals["both rules"] >= finals["exact"] - HALF_A_POINT:
        failures.append(f"caught, the biased policy ends {finals['both rules']:.4f}, more than half a point below "
                        f"exact {finals['exact']:.4f}")
    return decided["both rules"], final


def check_resume(comm, data: str, expected: list[dict], final: list[torch.Tensor], failures: list[str]) -> None:
    """Stop the guarded run while its strikes are counted (before its first decision), resume: bitwise the same."""
    stop = expected[0]["epoch"] - 3
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(comm.allgather_object(scratch)[0])  # rank 0's (one machine: every rank sees it)
        first = trainer(comm, data, **BIASED)
        train(first, stop)
        strikes = first.guard.state.bias_strikes
        if comm.rank == 0:
            save_checkpoint(directory / "bias.ckpt", first.state())
        first.close()
        comm.barrier()
        resumed = trainer(comm, data, **BIASED)
        resumed.load_state(load_checkpoint(directory / "bias.ckpt"))
        if resumed.guard.state.bias_strikes != strikes or not strikes:
            failures.append(f"resume at epoch {stop}: bias strikes {resumed.guard.state.bias_strikes}, the run "
                            f"had {strikes} (the check wants some)")
        failures += trains_on_alike(resumed, EPOCHS, lambda run: run.guard.state.decisions, expected, final,
                                    f"resume at epoch {stop}")
        resumed.close()
        comm.barrier()


def check_chosen_interval(comm, data: str, failures: list[str]) -> None:
    """Without --audit-every: no reading before the exact evaluation after step 2 prices the interval; then
    references at its multiples, the interval chosen again after each reading (from the readings' mean and the
    budget left), each interval on the ladder (or beyond the run's 40 epochs, where the budget is spent)."""
    run = trainer(comm, data, **{**BIASED, "audit_every": 0, "epochs": 40})
    read: list[tuple[int, int]] = []  # (epoch, the interval chosen after its reading)
    priced = 0  # the interval the evaluation after step 2 chose
    while run.epoch < 40:
        record = run.train_epoch(evaluation_follows=True)
        run.evaluate()
        if run.epoch == 2:
            priced = run.guard.state.reference_every
        if "guard_reference" in record:
            read.append((record["epoch"], record["guard_reference"]["every"]))
    if not priced:
        failures.append("the evaluation after step 2 chose no interval for the bias signal")
    # once the signal has tightened the policy to exact (the decision names the first epoch trained exact), no
    # reference is needed: how many strikes fit in 40 epochs depends on the chosen intervals, hence on timing
    exact_from = next((d["epoch"] for d in run.guard.state.decisions if d["to"] == "exact"), 41)
    run.close()
    if comm.rank == 0:
        print(f"INTERVAL priced {priced} after step 2, chose {[every for _, every in read]}; references after "
              f"epochs {[e for e, _ in read]}; exact from epoch {exact_from}", flush=True)
    expected, epoch = [], 2
    for every in [priced] + [every for _, every in read]:
        epoch = (epoch // every + 1) * every if every else 41  # the next multiple after the last reading
        if epoch >= min(exact_from, 41):
            break
        expected.append(epoch)
    rungs = {rung for power in (1 << k for k in range(20)) for rung in (power, 3 * power // 2)}
    odd = [every for every in [priced] + [every for _, every in read] if every not in rungs and every <= 40]
    if odd or [e for e, _ in read] != expected:
        failures.append(f"chosen intervals {[every for _, every in read]}: references after "
                        f"{[e for e, _ in read]}, expected {expected}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    args = parser.parse_args()
    torch.set_num_threads(1)
    register_biased_policy()
    comm = world()
    failures: list[str] = []
    expected, final = check_caught(comm, args.data, failures)
    if expected:
        check_resume(comm, args.data, expected, final, failures)
    check_chosen_interval(comm, args.data, failures)
    return finish(comm, failures, f"bias cases P={comm.size}")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
