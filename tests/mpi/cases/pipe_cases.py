"""Pipelined stale exchange (``pipe:tau=T[,gamma=G]``) under mpiexec.

On the random directed graph of static_input_cases.py laid out over this launch's row groups
(with P = 3 one row group is EMPTY, the others uneven):

* ``tau = 0`` is bitwise the exact path (every plan; and with BNS sampling, bitwise ``bns`` alone);
* ``tau = 1, 2`` (with and without ``gamma`` smoothing, owner- and receiver-side dropout, layer 0 exchanged
  per epoch or read from its halo, GCN and SAGE) equal the single-process simulation of T-stale boundary
  rows and gradients (tests/support/reference_pipe.py): 5 losses, the first step's gradients, the final weights;
  also where an evaluation comes between steps and the gradient flights are posted after it;
* each epoch's forward uses the flight of exactly epoch ``t - tau`` (epoch ``t`` in the first ``tau``):
  never an older one; and moves exactly the exact path's bytes (the byte model), with sampling the
  sampled path's bytes;
* a checkpoint taken with flights outstanding resumes to the uninterrupted run's weights, bitwise;
* the progress mode (tests, a probe thread, the MPI library alone) changes no number;
* an evaluation run beside the next step (p2p and sparse-bcast, pipe, sancus with layer 0 exchanged per epoch,
  bns with int8, GAT) gives bitwise the
  metrics and bytes of one after the step, and leaves the steps bitwise the same;
* at c = 1, psc's feature cache (psc_cases.py, which this launch runs too: one launch per rank count), and
  dgs: nodes = features = 1 bitwise the exact path, its explanation time booked apart.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from case_report import finish  # noqa: E402
from reference_pipe import PipelinedReference  # noqa: E402
from psc_cases import check_cache_budgets, check_exact_through_the_cache  # noqa: E402
from static_input_cases import C, close, expected_epoch, graph_data, local_graph  # noqa: E402

from algorithms.checkpoint import load_checkpoint, save_checkpoint  # noqa: E402
from algorithms.train import TrainConfig, Trainer  # noqa: E402
from runners.perf.cost_model import ModelShape  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402
from sparse_dist.exchange import ExchangeContext  # noqa: E402
from sparse_dist.layout import Grid, RowLayout  # noqa: E402
from sparse_dist.plans import PLAN_NAMES  # noqa: E402

EPOCHS = 5
RTOL, ATOL = 1e-4, 2e-5
COUNTS = {1: [23], 2: [11, 12], 3: [9, 0, 14], 4: [5, 7, 0, 11]}  # rows per row group: uneven, one empty

# (plan, model, layers, tau, gamma, input exchange, dropout side)
SIMULATED = [
    ("p2p", "gcn", 2, 1, 0.0, "per-epoch", "owner"),
    ("p2p", "gcn", 3, 2, 0.0, "per-epoch", "owner"),
    ("p2p", "gcn", 2, 1, 0.0, "once", "receiver"),
    ("p2p", "gcn", 3, 1, 0.5, "per-epoch", "owner"),
    ("p2p", "sage", 2, 2, 0.0, "per-epoch", "owner"),
    ("sparse-bcast", "gcn", 3, 1, 0.0, "per-epoch", "owner"),
    ("sparse-bcast", "gcn", 2, 2, 0.0, "once", "receiver"),
    ("dense-bcast", "gcn", 2, 2, 0.0, "per-epoch", "owner"),
    ("dense-bcast", "gcn", 3, 1, 0.5, "once", "receiver"),
]


def trainer_for(comm, data: dict, layout: RowLayout, replication: int, **config) -> Trainer:
    return Trainer(comm, local_graph(data, layout, comm.rank // replication),
                   TrainConfig(replication=replication, epochs=EPOCHS, **config))


def check_tau_zero(comm, data: dict, layout: RowLayout, replication: int, failures: list[str]) -> None:
    """``tau = 0`` goes through the pipelined strategy (all parts posted at once) and is bitwise the exact path."""
    runs = [(plan, "none") for plan in PLAN_NAMES] + [("p2p", "bns:p=0.5"), ("sparse-bcast", "bns:p=0.5,side=owner")]
    for plan, sample in runs:
        results = []
        for stale in ("none", "pipe:tau=0"):
            trainer = trainer_for(comm, data, layout, replication, plan=plan, sample=sample, stale=stale,
                                  input_exchange="per-epoch")
            losses = [trainer.train_epoch()["loss"] for _ in range(EPOCHS)]
            results.append((losses, [p.detach().clone() for p in trainer.parameters()]))
        (exact_losses, exact_weights), (pipe_losses, pipe_weights) = results
        if exact_losses != pipe_losses or not all(torch.equal(a, b) for a, b in zip(exact_weights, pipe_weights)):
            failures.append(f"{plan} sample={sample} P={comm.size}: pipe:tau=0 is not bitwise the same run "
                            f"(losses {pipe_losses} vs {exact_losses})")


def check_simulated(comm, data: dict, layout: RowLayout, replication: int, failures: list[str]) -> None:
    grid_groups = layout.owner_of(np.arange(layout.n_rows))
    lo, hi = layout.row_range(comm.rank // replication)
    for index, (plan, model, layers, tau, gamma, input_exchange, side) in enumerate(SIMULATED):
        stale = f"pipe:tau={tau}" + (f",gamma={gamma}" if gamma else "")
        label = f"{plan} {model} L={layers} {stale} input={input_exchange} side={side} P={comm.size} c={replication}"
        trainer = trainer_for(comm, data, layout, replication, plan=plan, model=model, layers=layers, stale=stale,
                              input_exchange=input_exchange, dropout_side=side)
        reference = PipelinedReference(data["adjacency"].toarray(), data["features"], data["labels"], data["train"], C,
                                       model, layers=layers, groups=grid_groups, tau=tau, gamma=gamma,
                                       input_once=input_exchange == "once", receiver=side == "receiver")
        dims = tuple(trainer.model.dims)
        shape = ModelShape(dims, kind=model, input_once=input_exchange == "once", receiver_dropout=side == "receiver")
        strategy = trainer.spmm.strategy
        for epoch in range(EPOCHS):
            # half the configurations evaluate after every other step: their gradient flights wait for the
            # evaluation's forward, and must still carry the same values and be booked to their step
            evaluated = index % 2 == 1 and epoch % 2 == 0
            record = trainer.train_epoch(evaluation_follows=evaluated)
            returned = {phase: dict(sides) for phase, sides in record["bytes"].items()}
            if evaluated:
                trainer.evaluate()
            if record["bytes"] != returned:
                failures.append(f"{label}: epoch {epoch + 1}'s bytes changed after its record was returned")
            want = reference.step()
            if abs(record["loss"] - want) > ATOL + RTOL * abs(want):
                failures.append(f"{label}: epoch {epoch + 1} loss {record['loss']:.7f} != simulation {want:.7f}")
            if epoch == 0:
                mine, theirs = trainer.parameters(), [p for layer in reference.params for p in layer]
                if not all(close(a.grad, b.grad) for a, b in zip(mine, theirs)):
                    failures.append(f"{label}: first-step gradients differ from the simulation")
            oldest = epoch - tau if epoch >= tau else epoch
            for layer in range(1 if input_exchange == "once" else 0, layers):
                used = strategy.used(ExchangeContext(epoch, layer, True)).epoch
                if used != oldest:
                    failures.append(f"{label}: epoch {epoch} layer {layer} used the rows of epoch {used}, "
                                    f"expected {oldest}")
            predicted = expected_epoch(trainer, shape, training=True)
            for phase in ("forward", "backward"):
                got = (record["bytes"][phase]["sent"], record["bytes"][phase]["recv"])
                want_bytes = tuple(int(x) for x in predicted[phase][comm.rank])
                if got != want_bytes:
                    failures.append(f"{label}: epoch {epoch + 1} {phase} bytes {got} != exact path's {want_bytes}")
        if not all(close(a, b) for a, b in zip(trainer.parameters(), [p for l in reference.params for p in l])):
            failures.append(f"{label}: weights after {EPOCHS} epochs differ from the simulation")
        kept = tau * sum(1 + backward for _, backward in shape.exchanges)
        if strategy.outstanding() != kept:
            failures.append(f"{label}: {strategy.outstanding()} flights kept, expected {kept} ({tau} per exchange)")
        trainer.close()  # the run ends: every kept flight completes, and stays kept
        flights = [flight for _, flight in strategy.kept_flights()]
        if strategy.outstanding() != kept or not all(f.progress() for f in flights):
            failures.append(f"{label}: after close(), {sum(not f.progress() for f in flights)} of "
                            f"{len(flights)} kept flights still pending (or the count changed)")


def check_sampled_bytes(comm, data: dict, layout: RowLayout, replication: int, failures: list[str]) -> None:
    """With BNS, a pipelined run's forward in epoch ``t`` sends what the unpipelined sampled run sends (epoch
    ``t``'s sample), and its backward returns the gradients of the rows it used (epoch ``t - tau``'s sample)."""
    tau, traffic = 2, {}
    for stale in ("none", f"pipe:tau={tau}"):
        trainer = trainer_for(comm, data, layout, replication, plan="p2p", sample="bns:p=0.5", stale=stale,
                              input_exchange="per-epoch", layers=3)
        records = [trainer.train_epoch() for _ in range(EPOCHS)]
        trainer.close()
        traffic[stale] = [{phase: (r["bytes"][phase]["sent"], r["bytes"][phase]["recv"]) for phase in
                           ("forward", "backward")} for r in records]
        if not all(np.isfinite(r["loss"]) for r in records):
            failures.append(f"bns + {stale}: non-finite loss")
    alone, piped = traffic["none"], traffic[f"pipe:tau={tau}"]
    for epoch in range(EPOCHS):
        source = epoch - tau if epoch >= tau else epoch
        want = {"forward": alone[epoch]["forward"], "backward": alone[source]["backward"]}
        if piped[epoch] != want:
            failures.append(f"bns:p=0.5 + pipe:tau={tau} P={comm.size} epoch {epoch}: bytes {piped[epoch]} != {want}")


def check_resume(comm, data: dict, layout: RowLayout, replication: int, failures: list[str]) -> None:
    """A checkpoint taken with flights outstanding (and averages under way), written to files and loaded into a
    new trainer, continues to the same weights, bitwise, as the uninterrupted run."""
    configs = [dict(plan=plan, stale="pipe:tau=2,gamma=0.5", input_exchange="per-epoch", layers=3)
               for plan in ("p2p", "dense-bcast")]
    if replication == 1:  # psc: probabilities agreed at epochs 2 and 4, flights sampled under both
        configs.append(dict(plan="p2p", sample="psc:budget=0.5,every=2", stale="pipe:tau=2", layers=3,
                            input_exchange="per-epoch"))
    for config in configs:
        plan = config["plan"]
        whole = trainer_for(comm, data, layout, replication, **config)
        for epoch in range(EPOCHS):
            whole.train_epoch()
            if epoch == 2:
                whole.close()  # completing the outstanding flights early changes nothing that follows
        whole.close()
        first = trainer_for(comm, data, layout, replication, **config)
        for _ in range(3):
            first.train_epoch()
        with tempfile.TemporaryDirectory() as directory:
            save_checkpoint(Path(directory) / "run.ckpt", first.state())
            save_checkpoint(Path(directory) / "run.ckpt.rank", first.policy_state())
            resumed = trainer_for(comm, data, layout, replication, **config)
            resumed.load_state(load_checkpoint(Path(directory) / "run.ckpt"))
            resumed.load_policy_state(load_checkpoint(Path(directory) / "run.ckpt.rank"))
        for _ in range(EPOCHS - 3):
            resumed.train_epoch()
        first.close()
        resumed.close()
        if not all(torch.equal(a, b) for a, b in zip(whole.parameters(), resumed.parameters())):
            failures.append(f"{plan} {config} P={comm.size}: resumed at epoch 3 with flights outstanding, "
                            f"the weights differ from the uninterrupted run")


def check_dgs_training(comm, data: dict, layout: RowLayout, failures: list[str]) -> None:
    """dgs with nodes = features = 1 (explaining every 2 epochs) is bitwise the exact path; with nodes = 0.5 its
    explanation epochs book ``explain`` time, and its forward exchanges never exceed the exact path's."""
    runs = {}
    for sample in ("none", "dgs:nodes=1,features=1,every=2,steps=3", "dgs:nodes=0.5,features=0.5,every=2,steps=3"):
        trainer = trainer_for(comm, data, layout, 1, plan="p2p", sample=sample, layers=3, input_exchange="once")
        records = [trainer.train_epoch() for _ in range(EPOCHS)]
        runs[sample] = ([r["loss"] for r in records], [p.detach().clone() for p in trainer.parameters()], records)
    (exact_losses, exact_weights, exact_records), (one_losses, one_weights, one_records) = list(runs.values())[:2]
    if exact_losses != one_losses or not all(torch.equal(a, b) for a, b in zip(exact_weights, one_weights)):
        failures.append(f"dgs nodes=features=1 P={comm.size}: not bitwise the exact path ({one_losses} vs {exact_losses})")
    half = runs["dgs:nodes=0.5,features=0.5,every=2,steps=3"][2]
    explained = [r["time"]["explain"] for r in half if r["epoch"] in (3, 5)]  # epochs 2 and 4 explain
    if not explained or min(explained) <= 0 or any(r["time"]["explain"] for r in half if r["epoch"] in (1, 2, 4)):
        failures.append(f"dgs P={comm.size}: explain time {[r['time'].get('explain') for r in half]} not booked "
                        f"on the explanation epochs only")
    if any(a["bytes"]["forward"]["recv"] > b["bytes"]["forward"]["recv"] for a, b in zip(half, exact_records)):
        failures.append(f"dgs nodes=0.5 P={comm.size}: a forward received more than the exact path's")


def check_progress_modes(comm, data: dict, layout: RowLayout, replication: int, failures: list[str]) -> None:
    """How flights progress (tests, a probe thread, or the MPI library alone) changes no number: bitwise the
    same losses and weights."""
    results = {}
    for progress in ("test", "thread", "none", "auto"):
        trainer = trainer_for(comm, data, layout, replication, plan="p2p", stale="pipe:tau=1", layers=3,
                              input_exchange="per-epoch", progress=progress)
        if progress == "auto" and trainer.progress_mode != "test":  # every rank of this launch is on one node
            failures.append(f"--progress auto on one node resolved to {trainer.progress_mode}, not test")
        losses = [trainer.train_epoch()["loss"] for _ in range(EPOCHS)]
        results[progress] = (losses, [p.detach().clone() for p in trainer.parameters()])
        if (trainer.progress_thread is not None) != (trainer.progress_mode == "thread"):
            failures.append(f"--progress {progress}: a progress thread {'missing' if progress == 'thread' else 'ran'}")
        trainer.close()
    base_losses, base_weights = results["test"]
    for progress, (losses, weights) in results.items():
        if losses != base_losses or not all(torch.equal(a, b) for a, b in zip(weights, base_weights)):
            failures.append(f"pipe:tau=1 --progress {progress} P={comm.size}: not bitwise the --progress test run")


ALONGSIDE = [
    {"plan": "p2p"},
    {"plan": "p2p", "stale": "pipe:tau=1", "progress": "thread"},
    {"plan": "sparse-bcast", "stale": "sancus-e:eps=1", "input_exchange": "per-epoch"},
    {"plan": "p2p", "sample": "bns:keep=0.5", "compress": "int8,feedback"},
    {"plan": "p2p", "model": "gat"},
]
ALONGSIDE_EPOCHS = 3  # two evaluations beside a step, and the steps around them


def _keep_evaluation_logits(trainer: Trainer) -> list[torch.Tensor]:
    """The logits of every evaluation forward ``trainer`` makes from now on (its forward wrapped)."""
    kept: list[torch.Tensor] = []
    forward = trainer.forward

    def keeping(training: bool, **options) -> torch.Tensor:
        logits = forward(training, **options)
        if not training:
            kept.append(logits.detach().clone())
        return logits

    trainer.forward = keeping
    return kept


def check_evaluation_alongside(comm, data: dict, layout: RowLayout, replication: int, failures: list[str]) -> None:
    """An evaluation run in turns beside the next step (``overlap_evaluation``) gives bitwise the logits, metrics
    and bytes of :meth:`Trainer.evaluate` after the step, and changes nothing of the steps: losses, step bytes
    and final weights bitwise those of a run that evaluates after each step."""
    for settings in ALONGSIDE:
        label = f"evaluation alongside {settings} P={comm.size} c={replication}"
        after = trainer_for(comm, data, layout, replication, layers=3, **settings)
        beside = trainer_for(comm, data, layout, replication, layers=3, overlap_evaluation=True, **settings)
        logits_after, logits_beside = _keep_evaluation_logits(after), _keep_evaluation_logits(beside)
        expected: tuple[dict, dict] | None = None
        for epoch in range(ALONGSIDE_EPOCHS):
            mine = beside.train_epoch(evaluate_alongside=expected is not None)
            theirs = after.train_epoch()
            if expected is not None and (mine["evaluation"], beside.eval_bytes) != expected:
                failures.append(f"{label}: epoch {epoch}'s evaluation beside the next step gave "
                                f"{mine['evaluation']} moving {beside.eval_bytes}, after the step {expected}")
            if (mine["loss"], mine["bytes"]) != (theirs["loss"], theirs["bytes"]):
                failures.append(f"{label}: step {epoch + 1} loss/bytes {mine['loss']} {mine['bytes']} != "
                                f"{theirs['loss']} {theirs['bytes']}")
            expected = (after.evaluate(), after.eval_bytes)
        if not all(torch.equal(a, b) for a, b in zip(beside.parameters(), after.parameters())):
            failures.append(f"{label}: final weights differ")
        if len(logits_beside) != ALONGSIDE_EPOCHS - 1 or not all(torch.equal(a, b)
                                                                 for a, b in zip(logits_beside, logits_after)):
            failures.append(f"{label}: {len(logits_beside)} evaluations beside a step, logits not bitwise those after")
        beside.close()
        after.close()


def run(comm, replication: int) -> list[str]:
    """This rank's failures of every check above (collective)."""
    layout = RowLayout.from_counts(COUNTS[Grid(comm.size, replication).groups])
    data = graph_data()
    failures: list[str] = []
    check_tau_zero(comm, data, layout, replication, failures)
    check_simulated(comm, data, layout, replication, failures)
    check_sampled_bytes(comm, data, layout, replication, failures)
    check_resume(comm, data, layout, replication, failures)
    check_progress_modes(comm, data, layout, replication, failures)
    check_evaluation_alongside(comm, data, layout, replication, failures)
    if replication == 1:  # psc and dgs sample each receiver's edges: 1D only
        check_exact_through_the_cache(comm, data, layout, failures)
        check_cache_budgets(comm, data, layout, failures)
        check_dgs_training(comm, data, layout, failures)
    return failures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replication", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    return finish(comm, run(comm, args.replication), f"pipelined exchange P={comm.size} c={args.replication}")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
