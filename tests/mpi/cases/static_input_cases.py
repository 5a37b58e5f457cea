"""Layer 0 from a halo fetched once, and receiver-side dropout, under mpiexec.

On a random directed graph laid out over this launch's row groups (with
P = 3 one row group is EMPTY, the others uneven), for every plan:

* exactness: 3 training losses, the first step's weight gradients and the
  evaluation logits equal the independent single-process reference
  (tests/support/reference_gcn.py) for input modes (once, receiver), (once, owner)
  and (per-epoch, receiver); with the halo, evaluations multiply the kept ``Â_ext X``;
* bytes: the one-time halo exchange counts exactly what
  ``predict_halo_bytes`` says on every rank; each training epoch's forward
  and backward bytes, and each evaluation's forward bytes, equal the exact
  byte model of the layers that still exchange (``ModelShape.exchanges``);
  layer 0 moves nothing after the halo;
* sampling: with BNS (p = 0.5, p2p and sparse-bcast) receiver-side dropout
  gives the same losses as owner-side dropout (same sample, same masks);
* compression (``--compress``): counted bytes equal the byte model's with the coded row size, every plan (adaptive
  widths: each layer and direction at the width agreed before the step, which must change from 8 bits);
  evaluation stays exact; with bns or sancus-e the compressed run moves the uncompressed run's rows, coded;
* a narrower wire: count features travel once as uint8 (bytes the model's at one byte a value, the kept rows
  bitwise the reference's scaled rows, losses exact); random features travel as they are;
* SANCUS under dropout 0.5 (dense-bcast, sancus-h:eps=0.5, a wider graph):
  owners skip broadcasts on either dropout side (owner-side, the gap
  compares the rows without their fresh masks, ``H W``; before, the masks
  made every owner broadcast every epoch).
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
from reference_gcn import Reference  # noqa: E402
from row_groups import check_loss, close  # noqa: E402
from row_groups import local_graph as row_graph  # noqa: E402

from algorithms.train import LocalGraph, TrainConfig, Trainer  # noqa: E402
from runners.perf.cost_model import ModelShape  # noqa: E402
from sparse_dist.compress import Codec  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402
from sparse_dist.layout import Grid, RowLayout  # noqa: E402
from sparse_dist.plans import PLAN_NAMES, plan_class  # noqa: E402
from sparse_dist.predict import predict_halo_bytes, predict_spmm_bytes  # noqa: E402

N, F, C, EPOCHS = 23, 6, 3, 3
RTOL, ATOL = 1e-4, 2e-5
COUNTS = {1: [23], 2: [11, 12], 3: [9, 0, 14]}


def graph_data(nodes: int = N, width: int = F, density: float = 0.15) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    adjacency = sp.random(nodes, nodes, density=density, format="csr", random_state=rng)
    adjacency.data[:] = 1.0
    return {"adjacency": adjacency, "features": rng.random((nodes, width)).astype(np.float32),
            "labels": rng.integers(0, C, nodes), "train": rng.random(nodes) < 0.6}


def local_graph(data: dict, layout: RowLayout, group: int) -> LocalGraph:
    return row_graph(data, layout, group, C, "static-input")


def traffic(comm) -> dict[str, tuple[int, int]]:
    return {phase: (int(c["bytes_sent"]), int(c["bytes_recv"])) for phase, c in comm.stats.snapshot().items()}


def expected_epoch(trainer: Trainer, shape: ModelShape, training: bool) -> dict[str, np.ndarray]:
    """Exact forward/backward bytes per world rank of one epoch (or one evaluation) from the byte model, each
    layer's rows and gradients at the row size its codec has now (call it before the step)."""
    matrix = trainer.matrix
    total = {"forward": np.zeros((trainer.comm.size, 2), np.int64), "backward": np.zeros((trainer.comm.size, 2), np.int64)}
    codec = trainer.codec if training else None  # evaluation exchanges are never compressed
    first = 1 if shape.input_once else 0  # shape.exchanges leaves out layer 0 where its input came once
    for layer, (width, backward) in enumerate(shape.exchanges, start=first):
        for phase, direction in (("forward", "rows"), ("backward", "gradients")):
            if phase == "backward" and not (backward and training):
                continue
            coded = codec.at(layer, direction) if codec is not None else None
            volume = predict_spmm_bytes(matrix.grid, matrix.layout, matrix.boundary_counts, matrix.union_sizes,
                                        trainer.config.plan, width, shape.itemsize,
                                        coded.row_bytes(width) if coded is not None else None,
                                        pair_counts=trainer.spmm.plan.pair_counts)
            total[phase] += volume[phase]
    return total


def check_modes(comm, data: dict, layout: RowLayout, replication: int, failures: list[str]) -> None:
    group = comm.rank // replication
    lo, hi = layout.row_range(group)
    modes = (("once", "receiver"), ("once", "owner"), ("per-epoch", "receiver"))
    for plan in PLAN_NAMES:
        for input_exchange, side in modes:
            if side == "receiver" and plan_class(plan).run_refusal(receiver_dropout=True):
                continue
            label = f"{plan} input={input_exchange} side={side} P={comm.size} c={replication}"
            before = traffic(comm)
            trainer = Trainer(comm, local_graph(data, layout, group),
                              TrainConfig(plan=plan, replication=replication, epochs=EPOCHS,
                                          input_exchange=input_exchange, dropout_side=side))
            after_setup = traffic(comm)
            if trainer.input_exchange.wire_dtype:  # uniform random features fit no narrower dtype
                failures.append(f"{label}: random features travelled as {trainer.input_exchange.wire_dtype}")
            halo = after_setup["halo"][0] - before["halo"][0], after_setup["halo"][1] - before["halo"][1]
            want_halo = (tuple(int(x) for x in predict_halo_bytes(trainer.matrix.grid, trainer.matrix.boundary_counts,
                                                                  F, 4)[comm.rank])
                         if input_exchange == "once" else (0, 0))
            if halo != want_halo:
                failures.append(f"{label}: halo bytes (sent, recv) {halo} != predicted {want_halo}")
            reference = Reference(data["adjacency"].toarray(), data["features"], data["labels"], data["train"], C, "gcn")
            dims = (F, 16, C)
            shape = ModelShape(dims, input_once=input_exchange == "once", receiver_dropout=side == "receiver")
            eval_shape = ModelShape(dims, input_once=input_exchange == "once")
            for epoch in range(EPOCHS):
                record = trainer.train_epoch()
                check_loss(failures, label, epoch, record["loss"], reference.step())
                if epoch == 0:
                    for layer, params in enumerate(reference.params):
                        if not close(trainer.model.weights[layer].grad, params[0].grad):
                            failures.append(f"{label}: gradient of W{layer} differs from the reference")
                predicted = expected_epoch(trainer, shape, training=True)
                for phase in ("forward", "backward"):
                    got = (record["bytes"][phase]["sent"], record["bytes"][phase]["recv"])
                    want_bytes = tuple(int(x) for x in predicted[phase][comm.rank])
                    if got != want_bytes:
                        failures.append(f"{label}: epoch {epoch + 1} {phase} bytes {got} != predicted {want_bytes}")
            trainer.evaluate()
            got = (trainer.eval_bytes["forward"]["sent"], trainer.eval_bytes["forward"]["recv"])
            want_eval = tuple(int(x) for x in expected_epoch(trainer, eval_shape, training=False)["forward"][comm.rank])
            if got != want_eval:
                failures.append(f"{label}: evaluation forward bytes {got} != predicted {want_eval}")
            with torch.no_grad():
                logits = trainer.forward(training=False)
                want_logits = reference.forward(training=False)[lo:hi]
            if not close(logits, want_logits):
                failures.append(f"{label}: evaluation logits differ by {(logits - want_logits).abs().max():.2e}")
            if input_exchange == "once":  # the evaluations' layer 0 multiplies Â_ext X, made once and kept
                kept = trainer.halo.aggregate()
                if kept is not trainer.halo.aggregate() or not close(kept, trainer.halo.multiply(trainer.halo.values)):
                    failures.append(f"{label}: the kept layer-0 product is not Â_ext X, or is made again")


def check_narrow_wire(comm, layout: RowLayout, replication: int, failures: list[str]) -> None:
    """Count features (0-3 a value, row sums exact in float32) travel once as uint8: the halo bytes are the model's
    at one byte a value, the kept halo rows equal the reference's scaled rows bitwise, training is exact."""
    group = comm.rank // replication
    data = graph_data()
    data["features"] = np.random.default_rng(7).integers(0, 4, (N, F)).astype(np.float32)
    data["features"][5] = 0  # a row summing to 0 scales to 0
    for plan in PLAN_NAMES:
        label = f"{plan} uint8 wire P={comm.size} c={replication}"
        before = traffic(comm)
        trainer = Trainer(comm, local_graph(data, layout, group),
                          TrainConfig(plan=plan, replication=replication, epochs=EPOCHS, input_exchange="once"))
        after_setup = traffic(comm)
        if trainer.input_exchange.wire_dtype != "uint8":
            failures.append(f"{label}: the halo travelled as {trainer.input_exchange.wire_dtype!r}, not uint8")
        halo = after_setup["halo"][0] - before["halo"][0], after_setup["halo"][1] - before["halo"][1]
        want = tuple(int(x) for x in predict_halo_bytes(trainer.matrix.grid, trainer.matrix.boundary_counts, F,
                                                        1)[comm.rank])
        if halo != want:
            failures.append(f"{label}: halo bytes (sent, recv) {halo} != predicted at one byte a value {want}")
        reference = Reference(data["adjacency"].toarray(), data["features"], data["labels"], data["train"], C, "gcn")
        kept = trainer.halo.values[trainer.halo.own_count:]
        if not torch.equal(kept, reference.x[torch.from_numpy(trainer.halo.halo_ids)]):
            failures.append(f"{label}: the kept halo rows differ from the reference's scaled rows")
        for epoch in range(EPOCHS):
            check_loss(failures, label, epoch, trainer.train_epoch()["loss"], reference.step())


def check_sampled(comm, data: dict, layout: RowLayout, replication: int, failures: list[str]) -> None:
    group = comm.rank // replication
    for plan in ("p2p", "sparse-bcast"):
        losses = {}
        for side in ("owner", "receiver"):
            trainer = Trainer(comm, local_graph(data, layout, group),
                              TrainConfig(plan=plan, replication=replication, epochs=EPOCHS, sample="bns:p=0.5,side=owner",
                                          input_exchange="per-epoch", dropout_side=side))
            losses[side] = [trainer.train_epoch()["loss"] for _ in range(EPOCHS)]
        if not np.allclose(losses["owner"], losses["receiver"], rtol=RTOL, atol=ATOL):
            failures.append(f"{plan} bns:p=0.5 P={comm.size}: receiver-side losses {losses['receiver']} != "
                            f"owner-side {losses['owner']}")


def trainer_adapts(compress: str) -> bool:
    codec = Codec.parse(compress)
    return codec is not None and codec.adapts


def check_compressed(comm, data: dict, layout: RowLayout, replication: int, failures: list[str]) -> None:
    """Compressed exchanges: counted bytes equal the byte model's with the coded row size (every plan, forward
    and backward, the 1.5D replica exchanges uncompressed); evaluation stays exact; and with bns or sancus-e
    a compressed run moves exactly the uncompressed run's rows (the same samples and skips), coded."""
    group = comm.rank // replication
    lo, hi = layout.row_range(group)
    shape = ModelShape((F, 16, C), input_once=False)
    adaptive = [("p2p", "adaptive,feedback"), ("dense-bcast", "adaptive:stochastic,min=2,budget=0.5")]
    for plan, compress in [(plan, "int8,feedback") for plan in PLAN_NAMES] + [("p2p", "fp16")] + adaptive:
        label = f"{plan} --compress {compress} P={comm.size} c={replication}"
        epochs = 3 if trainer_adapts(compress) else 2
        trainer = Trainer(comm, local_graph(data, layout, group),
                          TrainConfig(plan=plan, replication=replication, epochs=epochs, input_exchange="per-epoch",
                                      compress=compress))
        used: set[int] = set()
        for epoch in range(epochs):
            predicted = expected_epoch(trainer, shape, training=True)  # at the widths agreed before the step
            record = trainer.train_epoch()
            used.update(record.get("bit_widths", {}).get("used", {}).values())
            for phase in ("forward", "backward"):
                got = (record["bytes"][phase]["sent"], record["bytes"][phase]["recv"])
                want = tuple(int(x) for x in predicted[phase][comm.rank])
                if got != want:
                    failures.append(f"{label}: epoch {epoch + 1} {phase} bytes {got} != predicted {want}")
        if trainer_adapts(compress) and not used - {8}:  # the byte check must see a width change to test it
            failures.append(f"{label}: every message stayed at 8 bits ({sorted(used)})")
        with torch.no_grad():
            logits = trainer.forward(training=False)
        reference = Reference(data["adjacency"].toarray(), data["features"], data["labels"], data["train"], C, "gcn")
        for params, mine in zip(reference.params, [trainer.model.layer_parameters(k) for k in range(2)]):
            for theirs, own in zip(params, mine):
                theirs.data.copy_(own.detach())
        if not close(logits, reference.forward(training=False)[lo:hi]):
            failures.append(f"{label}: the evaluation forward is not exact")
    if replication > 1:
        return
    for plan, sample, stale in (("p2p", "bns:p=0.5", "none"), ("sparse-bcast", "bns:p=0.5,side=owner", "none"),
                                ("dense-bcast", "none", "sancus-e:eps=1")):
        moved = {}
        for compress in ("none", "int8"):
            trainer = Trainer(comm, local_graph(data, layout, group),
                              TrainConfig(plan=plan, epochs=3, input_exchange="per-epoch", sample=sample,
                                          stale=stale, compress=compress))
            moved[compress] = [(r["bytes"]["forward"]["sent"], r["bytes"]["forward"]["recv"],
                                r["bytes"]["backward"]["sent"], r["bytes"]["backward"]["recv"])
                               for r in (trainer.train_epoch() for _ in range(3))]
        # every layer of an epoch moves the same rows: bytes = rows * sum over layers of the row size
        forward = [width for width, _ in shape.exchanges]
        backward = [width for width, back in shape.exchanges if back]
        coded = trainer.codec
        for plain, small in zip(moved["none"], moved["int8"]):
            for k, widths in enumerate((forward, forward, backward, backward)):
                if small[k] * sum(4 * w for w in widths) != plain[k] * sum(coded.row_bytes(w) for w in widths):
                    failures.append(f"{plan} {sample} {stale} int8: bytes {small} are not the coded size of {plain}")


def check_sancus(comm, replication: int, failures: list[str]) -> None:
    """On a wider, denser graph (200 nodes, 64 features, degree about 10), where layer 0's own input
    dropout moves ``H_1`` little from one epoch to the next but a fresh mask on ``H_1`` moves it a lot:
    the gap must not look at the mask (owner-side it compares ``H_1 W``, unmasked)."""
    groups = comm.size // replication
    if groups < 2:
        return
    data = graph_data(200, 64, 0.05)
    layout = RowLayout.balanced(200, groups)
    group = comm.rank // replication
    sent = {}
    for side in ("owner", "receiver"):
        trainer = Trainer(comm, local_graph(data, layout, group),
                          TrainConfig(plan="dense-bcast", replication=replication, epochs=8, hidden=16,
                                      stale="sancus-h:eps=0.5", input_exchange="once", dropout_side=side))
        active = owners = 0
        for _ in range(8):
            record = trainer.train_epoch()
            if not np.isfinite(record["loss"]):
                failures.append(f"sancus-h side={side}: loss {record['loss']}")
            for decision in record["broadcasts"]:
                active += len(decision["active"])
                owners += decision["owners"]
        sent[side] = (active, owners)
    owner_active, owner_total = sent["owner"]
    receiver_active, receiver_total = sent["receiver"]
    if owner_total == 0 or owner_active >= owner_total:
        failures.append(f"sancus-h, owner-side dropout: expected skipped broadcasts, got {sent['owner']}")
    if receiver_total == 0 or receiver_active >= receiver_total:
        failures.append(f"sancus-h, receiver-side dropout: expected skipped broadcasts, got {sent['receiver']}")


def run(comm, replication: int) -> list[str]:
    """This rank's failures of every check above (collective)."""
    layout = RowLayout.from_counts(COUNTS[Grid(comm.size, replication).groups])
    data = graph_data()
    failures: list[str] = []
    check_modes(comm, data, layout, replication, failures)
    check_narrow_wire(comm, layout, replication, failures)
    check_sampled(comm, data, layout, replication, failures)
    check_compressed(comm, data, layout, replication, failures)
    check_sancus(comm, replication, failures)
    return failures


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replication", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    return finish(comm, run(comm, args.replication), f"static input P={comm.size} c={args.replication}")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
