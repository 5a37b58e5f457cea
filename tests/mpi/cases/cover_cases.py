"""The ``cover`` plan under mpiexec: exact in float64 at P = 1, 2, 3, 4 (and c = 2), its bytes as predicted.

One launch of 4 ranks runs every rank count on sub-communicators (ranks 0-1, 0-2, all four), each against
"one process": the same trainer on a communicator of one rank (every rank alone, the whole graph), in
float64 with the same seed. Row groups are uneven, and at P = 3 one is EMPTY (a rank with no rows, hence
empty blocks both ways). Graphs: a directed graph with isolated, in-only and out-only nodes (so ``Â`` is not
symmetric and owners learn their partial-sum entries at set-up) and Cora (symmetric pattern). GCN and SAGE,
owner-side dropout 0.5, layer 0 both ways (exchanged every epoch; fetched once as a halo). Checks:

* evaluation logits before training, every epoch's loss, the first step's weight gradients and the weights
  after the last epoch equal the one-process run (rtol 1e-9);
* every epoch's counted forward and backward bytes equal the byte model's with the plan's own pair counts,
  and no pair moves more rows than ``p2p`` would (``|C_ij| + |R_ij| <= |B_ij|``);
* with ``--compress int8`` the counted bytes equal the byte model's at the coded row size, and ``pipe:tau=1``
  trains (a stale partial sum): its bytes equal the exact path's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from case_report import finish  # noqa: E402
from datasets_for_tests import cora  # noqa: E402
from row_groups import local_graph  # noqa: E402
from static_input_cases import expected_epoch  # noqa: E402

from algorithms.train import TrainConfig, Trainer  # noqa: E402
from runners.perf.cost_model import ModelShape  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402
from sparse_dist.layout import RowLayout  # noqa: E402

EPOCHS = 3
RTOL, ATOL = 1e-9, 1e-12


def directed(n: int = 48, classes: int = 3, seed: int = 7) -> dict:
    """A directed graph: nodes 0-3 isolated, 4-7 in-only (no out-edges), 8-11 out-only (no in-edges)."""
    rng = np.random.default_rng(seed)
    a = (rng.random((n, n)) < 0.12).astype(np.float64)
    np.fill_diagonal(a, 0.0)
    a[0:4, :] = 0.0
    a[:, 0:4] = 0.0
    a[4:8, :] = 0.0          # rows: out-edges of a node (its row holds what it aggregates)
    a[:, 8:12] = 0.0
    a[4:8, 12] = 0.0
    a[20, 4:8] = 1.0         # someone points at the in-only nodes
    a[8:12, 13] = 1.0        # the out-only nodes point somewhere
    perm = rng.permutation(n)  # spread the special nodes over the row groups
    a = a[perm][:, perm]
    assert not np.array_equal(a, a.T)
    return {"adjacency": sp.csr_matrix(a), "features": rng.random((n, 7)), "labels": rng.integers(0, classes, n),
            "train": rng.random(n) < 0.5, "classes": classes}


def cora_data() -> dict:
    data = cora()
    return {"adjacency": sp.csr_matrix(data.adjacency, dtype=np.float64), "features": data.features,
            "labels": data.labels, "train": data.masks["train"] | data.masks["val"], "classes": data.num_classes}


def counts_for(n: int, ranks: int) -> list[int]:
    """Uneven row groups; at 3 the middle one is empty."""
    if ranks == 1:
        return [n]
    if ranks == 2:
        return [n // 3, n - n // 3]
    if ranks == 3:
        return [n // 2 - 3, 0, n - (n // 2 - 3)]
    return [n // 5, n // 4, n // 3, n - n // 5 - n // 4 - n // 3]


def run_one(comm, data: dict, counts: list[int], group: int, **config) -> dict:
    graph = local_graph(data, RowLayout.from_counts(counts), group, data["classes"], "cover")
    trainer = Trainer(comm, graph, TrainConfig(dtype="float64", epochs=EPOCHS, **config))
    out: dict = {"trainer": trainer}
    with torch.no_grad():
        out["logits"] = trainer.forward(training=False).detach().clone()
    out["losses"], out["records"] = [], []
    for epoch in range(EPOCHS):
        record = trainer.train_epoch()
        out["losses"].append(record["loss"])
        out["records"].append(record)
        if epoch == 0:
            out["grads"] = [p.grad.detach().clone() for p in trainer.parameters()]
    out["final"] = [p.detach().clone() for p in trainer.parameters()]
    return out


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL))


def compare(label: str, got: dict, want: dict, rows: slice, failures: list[str]) -> None:
    if not close(got["logits"], want["logits"][rows]):
        failures.append(f"{label}: logits differ by {(got['logits'] - want['logits'][rows]).abs().max():.2e}")
    for epoch, (a, b) in enumerate(zip(got["losses"], want["losses"])):
        if abs(a - b) > ATOL + RTOL * abs(b):
            failures.append(f"{label}: epoch {epoch + 1} loss {a!r} != one process {b!r}")
    for name, mine, theirs in (("gradient", got["grads"], want["grads"]), ("weight", got["final"], want["final"])):
        for k, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            if not close(a, b):
                failures.append(f"{label}: {name} {k} differs by {(a - b).abs().max():.2e}")


def check_bytes(label: str, trainer: Trainer, records: list[dict], training_shape: ModelShape,
                failures: list[str]) -> None:
    plan, matrix = trainer.spmm.plan, trainer.matrix
    if np.any(plan.pair_counts > matrix.boundary_counts):
        failures.append(f"{label}: cover rows {plan.pair_counts.tolist()} above p2p's {matrix.boundary_counts.tolist()}")
    want = expected_epoch(trainer, training_shape, training=True)
    rank = trainer.comm.rank
    for epoch, record in enumerate(records):
        for phase in ("forward", "backward"):
            got = (record["bytes"][phase]["sent"], record["bytes"][phase]["recv"])
            expect = tuple(int(x) for x in want[phase][rank])
            if got != expect:
                failures.append(f"{label}: epoch {epoch + 1} {phase} bytes {got} != predicted {expect}")


@dataclass
class Cell:
    """One configuration of the sweep (:func:`cells`) on this rank, with ``reference``: what the caller's
    reference run gave for the whole graph on one rank (made once per graph, model and layer-0 mode)."""

    name: str
    data: dict
    base: dict
    shape: ModelShape
    comm: Any
    counts: list[int]
    group: int
    rows: slice
    label: str
    replication: int
    reference: dict


def cells(comm, grids: tuple[tuple[int, int], ...],
          reference: Callable[[Any, dict, list[int], dict], dict], layers: int = 2) -> Iterator[Cell]:
    """The directed graph and Cora x GCN and SAGE x layer 0 exchanged every epoch or fetched once x ``grids``
    (ranks, c), on the sub-communicator of the first ``ranks`` ranks (every rank enters each split; the cells a
    rank is not part of are skipped), uneven row groups with an empty one at 3 (:func:`counts_for`).
    ``reference(alone, data, counts, base)`` runs the whole graph on ``alone``, a communicator of rank 0 only;
    every rank gets what it returned but its ``trainer`` (one run where each rank made its own copy). ``layers``:
    the model's (hidden width 16)."""
    alone = comm.split(comm.rank, 0)
    for name, data in (("directed", directed()), ("cora", cora_data())):
        n = data["adjacency"].shape[0]
        for model in ("gcn", "sage"):
            for input_exchange in ("per-epoch", "once"):
                base = dict(model=model, input_exchange=input_exchange, dropout_side="owner", layers=layers)
                made = reference(alone, data, [n], base) if comm.rank == 0 else {}
                whole = comm.allgather_object({k: v for k, v in made.items() if k != "trainer"})[0]
                widths = (data["features"].shape[1], *[16] * (layers - 1), data["classes"])
                shape = ModelShape(widths, model, itemsize=8, input_once=input_exchange == "once")
                for ranks, replication in grids:
                    sub = comm.split(0 if comm.rank < ranks else 1, comm.rank)
                    if comm.rank < ranks:
                        counts = counts_for(n, ranks // replication)
                        group = sub.rank // replication
                        lo, hi = RowLayout.from_counts(counts).row_range(group)
                        yield Cell(name, data, base, shape, sub, counts, group, slice(lo, hi),
                                   f"{name} {model} input={input_exchange} P={ranks} c={replication}", replication,
                                   whole)


def main() -> int:
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    assert comm.size == 4, "cover_cases.py runs on 4 ranks"
    failures: list[str] = []
    runs = 0
    grids = ((1, 1), (2, 1), (3, 1), (4, 1), (4, 2))
    for cell in cells(comm, grids, lambda alone, data, counts, base: run_one(alone, data, counts, 0, plan="p2p",
                                                                             **base)):
        got = run_one(cell.comm, cell.data, cell.counts, cell.group, plan="cover", replication=cell.replication,
                      **cell.base)
        compare(cell.label, got, cell.reference, cell.rows, failures)
        check_bytes(cell.label, got["trainer"], got["records"], cell.shape, failures)
        runs += 1
    # compression and pipe compose (Cora GCN at P = 4 only: they are about the messages, not the graph)
    data = cora_data()
    n = data["adjacency"].shape[0]
    counts = counts_for(n, 4)
    shape = ModelShape((data["features"].shape[1], 16, data["classes"]), input_once=False, itemsize=8)
    coded = run_one(comm, data, counts, comm.rank, plan="cover", input_exchange="per-epoch", compress="int8")
    check_bytes("cora gcn int8 P=4", coded["trainer"], coded["records"], shape, failures)
    exact = run_one(comm, data, counts, comm.rank, plan="cover", input_exchange="per-epoch")
    piped = run_one(comm, data, counts, comm.rank, plan="cover", input_exchange="per-epoch", stale="pipe:tau=1")
    for epoch, (a, b) in enumerate(zip(piped["records"], exact["records"])):
        for phase in ("forward", "backward"):
            if a["bytes"][phase] != b["bytes"][phase]:
                failures.append(f"cora gcn pipe:tau=1 P=4: epoch {epoch + 1} {phase} bytes {a['bytes'][phase]} "
                                f"!= exact {b['bytes'][phase]}")
    if abs(piped["losses"][0] - exact["losses"][0]) > ATOL + RTOL * abs(exact["losses"][0]):
        failures.append("cora gcn pipe:tau=1 P=4: the first epoch (exact by definition) differs")
    return finish(comm, failures, f"cover cases ({runs} runs on this rank)")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
