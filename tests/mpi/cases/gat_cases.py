"""GAT over the distributed exchange, under mpiexec, against the independent reference (tests/support/reference_gat.py).

A random directed graph (isolated nodes, a few existing self-loops) is laid out over this
launch's row groups, uneven, with an EMPTY row group at P = 3. With input dropout 0.5 and
attention dropout 0.5, 3 heads in the hidden layer and 2 averaged output heads, for every plan:

* exactness in one of two input modes, (per-epoch, owner-side dropout) or (X's halo once,
  receiver-side dropout), alternating with the plan and the launch so that the launches
  P = 1..4 and c = 2 give every plan both: evaluation logits before training, the first step's
  gradients of every parameter, 5 epochs of losses and the weights after them equal the reference;
* bytes: every training epoch's and the evaluation's forward and backward bytes equal one gather
  per layer of ``K F' + K`` columns (``[Z | s]``; under receiver-side dropout the layer input),
  its scatter, nothing for a layer read from the halo, and on the 1.5D grid the replica
  allreduces (row maxima, ``[N | D]``, the gradients of the replica-partial inputs);
With ``--policies``:

* sampling: with ``bns:p=0.5,side=owner`` (p2p, sparse-bcast) owner-side and receiver-side dropout
  give the same losses (same sample, the same masks, two exchange forms);
* staleness: with ``sancus-e:eps=1`` (dense-bcast) the second epoch's forward moves less than the
  first, losses stay finite;
* pipelining (p2p, dense-bcast): ``pipe:tau=0`` is bitwise the exact run; ``pipe:tau=1`` is exact in
  its first epoch, then every layer uses the previous epoch's flight (the losses part from the exact
  run's), at the exact run's bytes;
* compression (p2p, c = 1): ``bf16`` sends exactly half of the exact run's forward and backward
  bytes, with losses within 1% of the exact run's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from case_report import finish  # noqa: E402
from reference_gat import GATReference  # noqa: E402
from row_groups import check_loss, close  # noqa: E402
from row_groups import local_graph as row_graph  # noqa: E402

from algorithms.train import LocalGraph, TrainConfig, Trainer  # noqa: E402
from sparse_dist.accounting import ring_allreduce_bytes  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402
from sparse_dist.exchange import ExchangeContext  # noqa: E402
from sparse_dist.layout import Grid, RowLayout  # noqa: E402
from sparse_dist.plans import PLAN_NAMES, plan_class  # noqa: E402
from sparse_dist.predict import predict_spmm_bytes  # noqa: E402

N, F_IN, C, EPOCHS = 30, 6, 3, 5
HIDDEN, HEADS, OUTPUT_HEADS = 4, 3, 2
RTOL, ATOL = 1e-4, 2e-5  # as row_groups.close and check_loss
COUNTS = {1: [30], 2: [13, 17], 3: [11, 0, 19], 4: [6, 9, 4, 11]}
MODES = (("per-epoch", "owner"), ("once", "receiver"))  # each launch gives each plan one (P=1..4, c=2: both)
SETTINGS = dict(hidden=HIDDEN, heads=HEADS, output_heads=OUTPUT_HEADS, dropout=0.5, attention_dropout=0.5)


def graph_data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    adjacency = sp.random(N, N, density=0.12, format="lil", random_state=rng)
    for node in (2, 17):                      # isolated: no in-edges, no out-edges
        adjacency[node, :] = 0
        adjacency[:, node] = 0
    for node in (0, 9, 20):                   # existing loops (removed, then one added, as GATConv)
        adjacency[node, node] = 1.0
    adjacency = sp.csr_matrix(adjacency)
    adjacency.data[:] = 1.0
    return {"adjacency": adjacency, "features": rng.random((N, F_IN)).astype(np.float32),
            "labels": rng.integers(0, C, N), "train": rng.random(N) < 0.6}


def local_graph(data: dict, layout: RowLayout, group: int) -> LocalGraph:
    return row_graph(data, layout, group, C, "gat-directed")


def expected_bytes(trainer: Trainer, training: bool) -> dict[str, np.ndarray]:
    """Forward/backward bytes (sent, received) of this rank in one epoch (or evaluation), from the layer shapes."""
    matrix, comm = trainer.matrix, trainer.comm
    grid, itemsize = matrix.grid, 4
    g, r, c = grid.group_of(comm.rank), grid.replica_of(comm.rank), grid.replication
    n = matrix.layout.count(g)
    receiver = trainer.receiver_dropout and training
    out = {"forward": np.zeros(2, np.int64), "backward": np.zeros(2, np.int64)}
    for index, layer in enumerate(trainer.model.layers):
        if index == 0 and trainer.halo is not None:
            continue
        width = layer.fan_in if receiver else layer.heads * layer.head_width + layer.heads
        volume = predict_spmm_bytes(grid, matrix.layout, matrix.boundary_counts, matrix.union_sizes,
                                    trainer.config.plan, width, itemsize)
        forward, backward = volume["forward"][comm.rank].copy(), volume["backward"][comm.rank].copy()
        if c > 1:  # the SpMM's own replica completion is not what attention does: replace it
            forward -= ring_allreduce_bytes(n * width, c, r, itemsize)
            if r == grid.replica_for_block(g):
                backward[0] -= n * width * itemsize * (c - 1)
            else:
                backward[1] -= n * width * itemsize
            forward += ring_allreduce_bytes(n * layer.heads, c, r, itemsize)  # row maxima
            forward += ring_allreduce_bytes(n * (layer.heads * layer.head_width + layer.heads), c, r, itemsize)
            partial = layer.weight.numel() + layer.att_src.numel() + layer.att_dst.numel()
            partial += n * layer.fan_in if index > 0 else 0                     # the layer input's gradient
            backward += ring_allreduce_bytes(partial, c, r, itemsize)
        out["forward"] += forward
        if training and (index > 0 or not receiver):
            out["backward"] += backward
    return out


def traffic(record_bytes: dict) -> dict[str, tuple[int, int]]:
    return {phase: (record_bytes[phase]["sent"], record_bytes[phase]["recv"]) for phase in ("forward", "backward")}


def check_exact(comm, data: dict, layout: RowLayout, replication: int, failures: list[str]) -> int:
    group = comm.rank // replication
    lo, hi = layout.row_range(group)
    runs = 0
    for index, plan in enumerate(p for p in PLAN_NAMES if not plan_class(p).run_refusal(attention=True)):
        for input_exchange, side in [MODES[(index + comm.size + replication) % len(MODES)]]:
            label = f"{plan} input={input_exchange} side={side} P={comm.size} c={replication}"
            trainer = Trainer(comm, local_graph(data, layout, group),
                              TrainConfig(model="gat", plan=plan, replication=replication, epochs=EPOCHS,
                                          input_exchange=input_exchange, dropout_side=side, **SETTINGS))
            reference = GATReference(data["adjacency"].toarray(), data["features"], data["labels"], data["train"],
                                     C, hidden=HIDDEN, heads=HEADS, output_heads=OUTPUT_HEADS, dropout=0.5,
                                     attention_dropout=0.5)
            with torch.no_grad():
                logits = trainer.forward(training=False)
                want_logits = reference.forward(training=False)[lo:hi]
            if not close(logits, want_logits):
                failures.append(f"{label}: evaluation logits differ by {(logits - want_logits).abs().max():.2e}")
            names = ("W", "a_src", "a_dst", "b")
            pairs = [(f"{name}{layer}", mine, theirs) for layer in range(trainer.model.num_layers)
                     for name, mine, theirs in zip(names, trainer.model.layer_parameters(layer),
                                                   reference.params[layer])]
            for epoch in range(EPOCHS):
                record = trainer.train_epoch()
                check_loss(failures, label, epoch, record["loss"], reference.step())
                if epoch == 0:
                    for name, mine, theirs in pairs:
                        if not close(mine.grad, theirs.grad):
                            failures.append(f"{label}: gradient of {name} differs by "
                                            f"{(mine.grad - theirs.grad).abs().max():.2e}")
                want_bytes = expected_bytes(trainer, training=True)
                for phase, got in traffic(record["bytes"]).items():
                    if got != tuple(int(x) for x in want_bytes[phase]):
                        failures.append(f"{label}: epoch {epoch + 1} {phase} bytes {got} != "
                                        f"{tuple(want_bytes[phase])}")
            for name, mine, theirs in pairs:
                if not close(mine, theirs):
                    failures.append(f"{label}: {name} after {EPOCHS} epochs differs by "
                                    f"{(mine - theirs).abs().max():.2e}")
            trainer.evaluate()
            got = traffic(trainer.eval_bytes)["forward"]
            want_eval = tuple(int(x) for x in expected_bytes(trainer, training=False)["forward"])
            if got != want_eval:
                failures.append(f"{label}: evaluation forward bytes {got} != {want_eval}")
            runs += 1
    return runs


def check_policies(comm, data: dict, layout: RowLayout, replication: int, failures: list[str]) -> None:
    group = comm.rank // replication
    for plan in ("p2p", "sparse-bcast"):
        losses = {}
        for side in ("owner", "receiver"):
            trainer = Trainer(comm, local_graph(data, layout, group),
                              TrainConfig(model="gat", plan=plan, replication=replication, epochs=3,
                                          sample="bns:p=0.5,side=owner", input_exchange="per-epoch",
                                          dropout_side=side, **SETTINGS))
            losses[side] = [trainer.train_epoch()["loss"] for _ in range(3)]
        if not np.allclose(losses["owner"], losses["receiver"], rtol=RTOL, atol=ATOL):
            failures.append(f"GAT {plan} bns:p=0.5 P={comm.size}: receiver-side losses {losses['receiver']} != "
                            f"owner-side {losses['owner']}")
    if comm.size // replication < 2:
        return
    trainer = Trainer(comm, local_graph(data, layout, group),
                      TrainConfig(model="gat", plan="dense-bcast", replication=replication, epochs=3,
                                  stale="sancus-e:eps=1", input_exchange="per-epoch", **SETTINGS))
    records = [trainer.train_epoch() for _ in range(3)]
    moved = [sum(record["bytes"]["forward"].values()) for record in records]
    totals = comm.allgather_array(np.array(moved, dtype=np.int64)).sum(axis=0)
    if not totals[1] < totals[0] or not all(np.isfinite(record["loss"]) for record in records):
        failures.append(f"GAT sancus-e:eps=1 P={comm.size}: forward bytes per epoch {totals.tolist()} (the stale "
                        f"second epoch must move less), losses {[record['loss'] for record in records]}")


def check_pipelined_and_compressed(comm, data: dict, layout: RowLayout, replication: int,
                                   failures: list[str]) -> None:
    group = comm.rank // replication
    for plan in ("p2p", "dense-bcast"):
        variants = [("exact", {}), ("pipe:tau=0", {"stale": "pipe:tau=0"}), ("pipe:tau=1", {"stale": "pipe:tau=1"})]
        if plan == "p2p" and replication == 1:
            variants.append(("bf16", {"compress": "bf16"}))
        runs = {}
        for name, extra in variants:
            trainer = Trainer(comm, local_graph(data, layout, group),
                              TrainConfig(model="gat", plan=plan, replication=replication, epochs=EPOCHS,
                                          input_exchange="per-epoch", **extra, **SETTINGS))
            losses, traffic, used = [], [], []
            for epoch in range(EPOCHS):
                record = trainer.train_epoch()
                losses.append(record["loss"])
                traffic.append({phase: (record["bytes"][phase]["sent"], record["bytes"][phase]["recv"])
                                for phase in ("forward", "backward")})
                if name == "pipe:tau=1":
                    used.append([trainer.spmm.strategy.used(ExchangeContext(epoch, layer, True)).epoch
                                 for layer in range(trainer.model.num_layers)])
            trainer.close()
            runs[name] = (losses, [p.detach().clone() for p in trainer.parameters()], traffic, used)
        label = f"GAT {plan} P={comm.size} c={replication}"
        exact_losses, exact_weights, exact_traffic, _ = runs["exact"]
        losses, weights, traffic, _ = runs["pipe:tau=0"]
        if losses != exact_losses or not all(torch.equal(a, b) for a, b in zip(weights, exact_weights)):
            failures.append(f"{label}: pipe:tau=0 is not bitwise the exact run ({losses} vs {exact_losses})")
        losses, _, traffic, used = runs["pipe:tau=1"]
        want_used = [[max(epoch - 1, 0)] * len(used[0]) for epoch in range(EPOCHS)]
        if losses[0] != exact_losses[0] or losses[1:] == exact_losses[1:] or used != want_used:
            failures.append(f"{label}: pipe:tau=1 losses {losses} vs exact {exact_losses}, flights used {used} "
                            f"(expected exact epoch 1, then each layer one epoch stale: {want_used})")
        if traffic != exact_traffic:
            failures.append(f"{label}: pipe:tau=1 bytes {traffic} != the exact run's {exact_traffic}")
        if "bf16" in runs:
            losses, _, traffic, _ = runs["bf16"]
            halved = [{phase: (sent // 2, recv // 2) for phase, (sent, recv) in epoch.items()}
                      for epoch in exact_traffic]
            if traffic != halved or not np.allclose(losses, exact_losses, rtol=1e-2):
                failures.append(f"{label}: bf16 bytes {traffic} (want half of exact: {halved}), losses {losses} "
                                f"vs exact {exact_losses}")


def run(comm, replication: int, policies: bool) -> tuple[list[str], int]:
    """This rank's failures and the number of exact runs (collective; also called in-process at P = 1)."""
    layout = RowLayout.from_counts(COUNTS[Grid(comm.size, replication).groups])
    data = graph_data()
    failures: list[str] = []
    runs = check_exact(comm, data, layout, replication, failures)
    if policies:
        check_policies(comm, data, layout, replication, failures)
        check_pipelined_and_compressed(comm, data, layout, replication, failures)
    return failures, runs


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replication", type=int, default=1)
    parser.add_argument("--policies", action="store_true", help="also the sampling and staleness checks")
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    failures, runs = run(comm, args.replication, args.policies)
    return finish(comm, failures, f"gat cases P={comm.size} c={args.replication}: {runs} exact runs")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
