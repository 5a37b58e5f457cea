"""Exact evaluations on a cover plan of their own beside a sampled p2p training (``evaluation_plan="cover"``).

One launch of 4 ranks runs every rank count on sub-communicators (ranks 0-1, 0-2, all four) and c = 2 on all
four; row groups are uneven and at P = 3 one is EMPTY. Graphs: a directed graph with isolated, in-only and
out-only nodes (owners learn their partial-sum entries at set-up) and Cora. GCN and SAGE, layer 0 fetched once
(the evaluation's layer 0 is the kept product) and exchanged every epoch (it crosses the cover too), training
sampled with ``bns:keep=0.5`` (which the cover plan refuses in training). Checks, in float64:

* the evaluation's logits before training equal one process's exact forward (rtol 1e-9);
* training is the training plan's: every epoch's loss and forward/backward bytes, and the weights after the
  last epoch, bitwise those of the same run with ``evaluation_plan="same"``;
* after training, the evaluation's logits equal that run's evaluation (rtol 1e-9: the same weights, partial
  sums added in another order) and so do its metrics;
* an evaluation's counted bytes equal the byte model's for the cover plan at the evaluation's widths, with the
  evaluation plan's own pair counts, and never exceed the ``same`` run's (p2p's).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from case_report import finish  # noqa: E402
from cover_cases import Cell, cells, close  # noqa: E402
from row_groups import local_graph  # noqa: E402

from algorithms.train import TrainConfig, Trainer  # noqa: E402
from runners.perf.cost_model import ModelShape  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402
from sparse_dist.layout import RowLayout  # noqa: E402
from sparse_dist.predict import predict_spmm_bytes  # noqa: E402

EPOCHS = 3


def run_one(comm, data: dict, counts: list[int], group: int, **config) -> dict:
    """Logits and metrics of an evaluation before and after ``EPOCHS`` sampled epochs, the epochs' records and
    what building the run moved."""
    graph = local_graph(data, RowLayout.from_counts(counts), group, data["classes"], "evaluation-plan")
    trainer = Trainer(comm, graph, TrainConfig(dtype="float64", epochs=EPOCHS, sample="bns:keep=0.5", **config))
    out: dict = {"trainer": trainer, "setup": trainer.setup_bytes}
    with torch.no_grad():
        out["logits"] = trainer.forward(training=False).detach().clone()
    out["records"] = [trainer.train_epoch() for _ in range(EPOCHS)]
    out["final"] = [p.detach().clone() for p in trainer.parameters()]
    with torch.no_grad():
        out["after"] = trainer.forward(training=False).detach().clone()
    out["metrics"] = trainer.measured_evaluation()
    out["reference_trace"] = []
    with torch.no_grad():  # the exact reference of the next step (the guard's bias signal, the audit)
        out["reference"] = trainer.forward(training=True, bypass_policy=True,
                                           trace=out["reference_trace"]).detach().clone()
    out["eval_bytes"] = trainer.eval_bytes
    return out


def expected_evaluation(trainer: Trainer, shape: ModelShape) -> np.ndarray:
    """(sent, received) forward bytes per world rank of one evaluation on the evaluation's cover plan."""
    matrix, plan = trainer.matrix, trainer.evaluation_spmm.plan
    total = np.zeros((trainer.comm.size, 2), np.int64)
    for width in shape.evaluation_exchanges:
        total += predict_spmm_bytes(matrix.grid, matrix.layout, matrix.boundary_counts, matrix.union_sizes, "cover",
                                    width, shape.itemsize, pair_counts=plan.pair_counts)["forward"]
    return total


def same_evaluations_and_training(label: str, got: dict, same: dict, alone: dict, rows: slice,
                                  failures: list[str]) -> None:
    """What every evaluation plan keeps: logits before training equal one process's, training is the same-plan
    run's bitwise (losses, bytes, final weights), the evaluation after it equals that run's (logits to rounding,
    metrics), and so does the exact reference of the next step (every layer, with its dropout masks)."""
    if not close(got["logits"], alone["logits"][rows]):
        failures.append(f"{label}: logits before training differ from one process by "
                        f"{(got['logits'] - alone['logits'][rows]).abs().max():.2e}")
    for epoch, (a, b) in enumerate(zip(got["records"], same["records"], strict=True)):
        if a["loss"] != b["loss"]:
            failures.append(f"{label}: epoch {epoch + 1} loss {a['loss']!r} != the same-plan run's {b['loss']!r}")
        for phase in ("forward", "backward"):
            if a["bytes"][phase] != b["bytes"][phase]:
                failures.append(f"{label}: epoch {epoch + 1} {phase} bytes {a['bytes'][phase]} != the same-plan "
                                f"run's {b['bytes'][phase]}")
    for k, (a, b) in enumerate(zip(got["final"], same["final"], strict=True)):
        if not torch.equal(a, b):
            failures.append(f"{label}: weight {k} after training differs from the same-plan run's")
    if not close(got["after"], same["after"]):
        failures.append(f"{label}: logits after training differ by {(got['after'] - same['after']).abs().max():.2e}")
    if got["metrics"] != same["metrics"]:
        failures.append(f"{label}: metrics {got['metrics']} != the same-plan run's {same['metrics']}")
    for layer, (a, b) in enumerate(zip(got["reference_trace"], same["reference_trace"], strict=True)):
        if not close(a, b):
            failures.append(f"{label}: the exact reference's layer {layer} differs from the same-plan run's by "
                            f"{(a - b).abs().max():.2e}")


def check(label: str, got: dict, same: dict, alone: dict, rows: slice, shape: ModelShape,
          failures: list[str]) -> None:
    trainer = got["trainer"]
    if trainer.evaluation_spmm is trainer.spmm or trainer.evaluation_spmm.plan.name != "cover":
        failures.append(f"{label}: the evaluation has no cover plan of its own")
        return
    same_evaluations_and_training(label, got, same, alone, rows, failures)
    rank = trainer.comm.rank
    counted = (got["eval_bytes"]["forward"]["sent"], got["eval_bytes"]["forward"]["recv"])
    want = tuple(int(x) for x in expected_evaluation(trainer, shape)[rank])
    if counted != want:
        failures.append(f"{label}: an evaluation moved {counted} bytes, the cover's byte model says {want}")
    p2p = (same["eval_bytes"]["forward"]["sent"], same["eval_bytes"]["forward"]["recv"])
    if counted[0] > p2p[0] or counted[1] > p2p[1]:
        failures.append(f"{label}: the cover evaluation moved {counted} bytes, more than p2p's {p2p}")
    if got["eval_bytes"]["backward"]["sent"] or got["eval_bytes"]["backward"]["recv"]:
        failures.append(f"{label}: an evaluation sent backward bytes {got['eval_bytes']['backward']}")


def against_same_plan(comm, evaluation_plan: str, check_cell: Callable[[Cell, dict, dict, list[str]], None],
                      layers: int = 2) -> tuple[list[str], int]:
    """Every cell of :func:`cover_cases.cells` at P = 2, 3 (an empty group), 4 and c = 2: the run evaluated on
    ``evaluation_plan`` and the same run evaluated on its own plan, handed to ``check_cell(cell, got, same,
    failures)``; the failures and this rank's runs."""
    failures: list[str] = []
    runs = 0
    for cell in cells(comm, ((2, 1), (3, 1), (4, 1), (4, 2)),
                      lambda alone, data, counts, base: run_one(alone, data, counts, 0, **base), layers=layers):
        same = run_one(cell.comm, cell.data, cell.counts, cell.group, replication=cell.replication, **cell.base)
        got = run_one(cell.comm, cell.data, cell.counts, cell.group, replication=cell.replication,
                      evaluation_plan=evaluation_plan, **cell.base)
        check_cell(cell, got, same, failures)
        runs += 1
    return failures, runs


def main() -> int:
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    assert comm.size == 4, "evaluation_plan_cases.py runs on 4 ranks"
    failures, runs = against_same_plan(comm, "cover", lambda cell, got, same, failures: check(
        cell.label, got, same, cell.reference, cell.rows, cell.shape, failures))
    return finish(comm, failures, f"evaluation plan cases ({runs} runs on this rank)")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
