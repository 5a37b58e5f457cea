"""Exactness contract: distributed training == the single-process reference (tests/support/reference_gcn.py).

For each dataset (a random directed graph; Cora), model (GCN, SAGE-mean)
and exchange plan, on this launch's P and c: the evaluation logits, the
first step's weight gradients, the losses of 5 epochs and the weights after
them must equal the plain-torch reference to float32 tolerance. Two input
modes: layer 0 exchanging ``dropout(X) W`` every epoch with owner-side
dropout (the classic path), and ``X``'s boundary rows fetched once (halo)
with receiver-side dropout on the later layers. Each plan runs each model in
both modes, one per dataset (GCN takes the first mode on the random graph
and the second on Cora, SAGE the other way round), so a launch stays at 4
runs per plan (12); tests/mpi/cases/static_input_cases.py covers the other combinations. The cover plan is
held to one process in float64 by its own launch (tests/mpi/cases/cover_cases.py: P = 1-4, c = 2, the halo,
both models), so it is left out here to keep the main test lane short. Shards are
written once per dataset by the pytest process (12 parts, random
partitioner, so every P in 1..4 and c = 2 merges parts).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from reference_gcn import Reference  # noqa: E402

from algorithms.train import TrainConfig, Trainer  # noqa: E402
from runners.data.shards import load_local_graph, read_meta  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402
from sparse_dist.plans import plan_class  # noqa: E402

PARITY_PLANS = ("dense-bcast", "sparse-bcast", "p2p")  # cover: tests/mpi/cases/cover_cases.py (float64)

EPOCHS = 5
RTOL, ATOL = 1e-4, 2e-5


def full_graph(directory: Path) -> dict[str, np.ndarray]:
    """The whole dataset in the shards' (partitioned) node order, read with plain numpy."""
    meta = read_meta(directory)
    parts = [np.load(directory / f"part-{i:05d}.npz") for i in range(meta["num_parts"])]
    n = meta["num_nodes"]
    adjacency = np.zeros((n, n))
    row = 0
    for part in parts:
        indptr, indices, data = part["indptr"], part["indices"], part["data"]
        for k in range(indptr.size - 1):
            adjacency[row, indices[indptr[k]:indptr[k + 1]]] += data[indptr[k]:indptr[k + 1]]
            row += 1
    cat = {key: np.concatenate([p[key] for p in parts]) for key in ("features", "labels", "train")}
    return {"adjacency": adjacency, **cat, "num_classes": meta["num_classes"]}


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    return bool(torch.allclose(got.detach().double(), want.detach().double(), rtol=RTOL, atol=ATOL))


MODES = (("per-epoch", "owner"), ("once", "receiver"))


@dataclass
class ReferenceRun:
    """What the single-process reference gives for one (dataset, model): every plan is compared with the same."""

    logits: torch.Tensor  # evaluation logits before training, all rows
    first_gradients: list[torch.Tensor]  # after epoch 1, in Reference.flat_parameters() order
    losses: list[float]
    final: list[torch.Tensor]  # parameters after EPOCHS epochs


def reference_run(data: dict, model: str) -> ReferenceRun:
    reference = Reference(data["adjacency"], data["features"], data["labels"], data["train"],
                          data["num_classes"], model)
    with torch.no_grad():
        logits = reference.forward(training=False)
    losses, first_gradients = [], []
    for epoch in range(EPOCHS):
        losses.append(reference.step())
        if epoch == 0:
            first_gradients = [p.grad.clone() for p in reference.flat_parameters()]
    return ReferenceRun(logits, first_gradients, losses, [p.detach().clone() for p in reference.flat_parameters()])


def check(comm, directory: Path, want: ReferenceRun, model: str, plan: str, replication: int, mode: tuple[str, str],
          failures: list[str]) -> None:
    label = f"{directory.name} {model} {plan} input={mode[0]} dropout-side={mode[1]} P={comm.size} c={replication}"
    graph = load_local_graph(comm, directory, comm.size // replication, replication)
    trainer = Trainer(comm, graph, TrainConfig(model=model, plan=plan, replication=replication, epochs=EPOCHS,
                                               input_exchange=mode[0], dropout_side=mode[1]))
    if (trainer.halo is not None) != (mode[0] == "once") or trainer.receiver_dropout != (mode[1] == "receiver"):
        failures.append(f"{label}: the trainer did not take the asked input mode")
    lo, hi = graph.layout.row_range(comm.rank // replication)

    with torch.no_grad():
        logits = trainer.forward(training=False)
    want_logits = want.logits[lo:hi]
    if not close(logits, want_logits):
        failures.append(f"{label}: forward logits differ by {(logits - want_logits).abs().max():.2e}")

    names, mine = [], []  # Reference.flat_parameters() order: per layer W, (Wn for SAGE), b
    for layer in range(trainer.model.num_layers):
        names.append(f"W{layer}")
        mine.append(trainer.model.weights[layer])
        if model == "sage":
            names.append(f"Wn{layer}")
            mine.append(trainer.model.neighbour_weights[layer])
        names.append(f"b{layer}")
        mine.append(trainer.model.biases[layer])
    for epoch in range(EPOCHS):
        got_loss, want_loss = trainer.train_epoch()["loss"], want.losses[epoch]
        if abs(got_loss - want_loss) > ATOL + RTOL * abs(want_loss):
            failures.append(f"{label}: epoch {epoch + 1} loss {got_loss:.7f} != reference {want_loss:.7f}")
        if epoch == 0:
            for name, parameter, theirs in zip(names, mine, want.first_gradients, strict=True):
                if not close(parameter.grad, theirs):
                    failures.append(f"{label}: gradient of {name} differs by "
                                    f"{(parameter.grad - theirs).abs().max():.2e}")
    for name, parameter, theirs in zip(names, mine, want.final, strict=True):
        if not close(parameter, theirs):
            failures.append(f"{label}: {name} after {EPOCHS} epochs differs by {(parameter - theirs).abs().max():.2e}")


def run(comm, directories: list[Path], replication: int) -> tuple[list[str], int]:
    """Every dataset x model x plan check of this launch (collective); the failures and the number of runs.
    The reference runs once per dataset and model: the plans are compared with the same run."""
    failures: list[str] = []
    runs = 0
    for index, directory in enumerate(directories):
        data = full_graph(directory)
        for model in ("gcn", "sage"):
            want = reference_run(data, model)
            for plan in PARITY_PLANS:
                mode = MODES[(index + (model == "sage")) % len(MODES)]
                if mode[1] == "receiver" and plan_class(plan).run_refusal(receiver_dropout=True):
                    mode = ("once", "owner")  # a plan that refuses receiver-side dropout (cover) keeps the halo
                check(comm, directory, want, model, plan, replication, mode, failures)
                runs += 1
    return failures, runs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("datasets", nargs="+", type=Path)
    parser.add_argument("--replication", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    failures, runs = run(comm, args.datasets, args.replication)
    for failure in failures:
        sys.stderr.write(f"[rank {comm.rank}] FAIL {failure}\n")
    ok = comm.all_true(not failures)
    if comm.rank == 0:
        print(f"training parity P={comm.size} c={args.replication}: {runs} runs, "
              f"{'all equal the reference' if ok else 'FAILURES'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
