"""Mini-batch training under mpiexec, in tests/mpi/test_training_cases.py's one launch per rank count.

On the random directed graph of static_input_cases.py (23 nodes; rows 0-4 hold no training node) laid out
unevenly: P = 3 has an EMPTY row group, P = 4 an empty one and one with rows but no training node.

* exactness: every fanout "all" and the whole training set as one batch give the loss and gradients of the
  independent single-process reference (tests/reference_gcn.py, dense ``Â``, dropout 0.5 with its masks of
  epoch 0), GCN and SAGE, 2 and 3 layers;
* bytes: per batch, the counted ``sample`` and ``fetch`` bytes of every rank equal a prediction written here
  from the requested ids, every rank's requests (gathered) and the global degrees; and equal the library's
  own predictions (:func:`predict_hop_bytes`, :func:`predict_fetch_bytes`); count features travel as uint8
  (one byte a value) and every batch's input rows are the reference's scaled rows bitwise;
* prefetch 2 (worker thread on its own communicator, running on into the next epoch) is bitwise the
  unpipelined run over 3 epochs, bytes per epoch and the evaluations between epochs (and their bytes)
  included, and so are prefetch 2 with bulk sampling of 3 batches per round and prefetch 1 with 2;
* bulk sampling (3 batches per round): each batch bitwise the one sampled alone, counted sample bytes per
  round == predicted (independent and library), 4 collective calls per hop per round; ONE feature pull per
  group (3 calls) of the group's distinct uncached remote rows, counted bytes == predicted;
* kernels: the compiled (numba) sampler's batches are bitwise the numpy reference's, in groups of 3;
* P-invariance: with the same global batch size (12 = P x 12/P), fanouts 3,2 and dropout, the first step's
  loss and gradients and two epochs' losses equal those of a run on one rank holding the whole graph
  (a communicator of this rank alone), to float tolerance.

The launch at P = 2 also checks exactness at P = 1 (rank 0 alone, a communicator of its own).
Rank 0 prints ``EXACT P=.. max_dloss=.. max_dgrad=..``, ``BYTES P=.. batches=.. mismatches=0`` and
``BULK P=.. sample_calls_alone=.. sample_calls_bulk=..`` lines.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from case_report import finish  # noqa: E402
from reference_gcn import Reference  # noqa: E402
from row_groups import local_graph as row_graph  # noqa: E402
from static_input_cases import C, graph_data  # noqa: E402

from algorithms.minibatch import MinibatchConfig, MinibatchTrainer  # noqa: E402
from algorithms.minibatch.trainer import step_groups  # noqa: E402
from algorithms.train import TrainConfig  # noqa: E402
from algorithms.training.metrics import counters_since  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402
from sparse_dist.fetch import predict_fetch_bytes  # noqa: E402
from sparse_dist.layout import RowLayout  # noqa: E402
from sparse_dist.sampling import predict_hop_bytes  # noqa: E402

COUNTS = {1: [23], 2: [11, 12], 3: [9, 0, 14], 4: [5, 7, 0, 11]}
TOLERANCE = 2e-5  # absolute, float32


def data_set() -> dict:
    data = graph_data()
    data["train"] = data["train"].copy()
    data["train"][:5] = False  # at P = 4 the first row group has rows but no training node
    return data


def trainer(comm, data: dict, counts: list[int], model: str, layers: int, fanouts: tuple,
            batch_size: int, cache: int = 0, prefetch: int = 0, sample_batches: int = 1,
            sampler: str = "auto", epochs: int = 2) -> MinibatchTrainer:
    layout = RowLayout.from_counts(counts)
    graph = row_graph(data, layout, comm.rank, C, "minibatch")
    return MinibatchTrainer(comm, graph, TrainConfig(model=model, layers=layers, epochs=epochs),
                            MinibatchConfig(fanouts, batch_size, cache, prefetch, sample_batches, sampler))


def gradients(mb: MinibatchTrainer) -> tuple[float, list[torch.Tensor]]:
    loss = mb.step_gradients(mb.make_batch(0, 0), 0)
    return loss, [p.grad.detach().clone() for p in mb.model.parameters()]


def check_exact(comm, data: dict, failures: list[str], counts: list[int], report: bool) -> None:
    dense = data["adjacency"].toarray()
    worst_loss = worst_grad = 0.0
    for model in ("gcn", "sage"):
        for layers in (2, 3):
            mb = trainer(comm, data, counts, model, layers, (None,) * layers, 1000)
            if mb.steps_per_epoch != 1:
                failures.append(f"{model}: one batch expected, got {mb.steps_per_epoch} steps")
            loss, grads = gradients(mb)
            reference = Reference(dense, data["features"], data["labels"], data["train"], C, model, layers=layers)
            logits = reference.forward(training=True)
            want = torch.nn.functional.cross_entropy(logits[reference.train], reference.y[reference.train])
            want.backward()
            want_grads = [p.grad for p in reference.flat_parameters()]
            dloss = abs(loss - float(want.detach()))
            dgrad = max(float((g.double() - w.double()).abs().max()) for g, w in zip(grads, want_grads))
            worst_loss, worst_grad = max(worst_loss, dloss), max(worst_grad, dgrad)
            if dloss > TOLERANCE or dgrad > TOLERANCE:
                failures.append(f"exact {model} L={layers} P={comm.size}: |dloss| {dloss:.3g}, |dgrad| {dgrad:.3g}")
    if report:
        print(f"EXACT P={comm.size} max_dloss={worst_loss:.3g} max_dgrad={worst_grad:.3g}", flush=True)


def degrees(data: dict, model: str) -> np.ndarray:
    """Stored entries per row of the normalised adjacency (GCN: self loop added where absent)."""
    a = sp.csr_matrix(data["adjacency"])
    per_row = np.diff(a.indptr)
    if model == "gcn":
        per_row = per_row + (a.diagonal() == 0)
    return per_row


def expected_sample(comm, requests: list[list[np.ndarray]], fanouts: list, degree: np.ndarray,
                    batches: int = 1) -> dict[str, int]:
    """What this rank's sample phase moves, from every rank's requested ids (gathered) and the degrees; a
    round of ``batches`` batches sends one request count per batch and peer."""
    everyone = comm.allgather_object(requests)
    sent = recv = 0
    me, size = comm.rank, comm.size
    for hop, fanout in enumerate(fanouts):
        def entries(ids: np.ndarray) -> int:
            kept = degree[ids] if fanout is None else np.minimum(degree[ids], fanout)
            return int(ids.size + 2 * kept.sum())
        for q in range(size):
            if q == me:
                continue
            mine, theirs = everyone[me][hop][q], everyone[q][hop][me]
            sent += 8 * (batches + 1) + 8 * mine.size + 8 * entries(theirs)
            recv += 8 * (batches + 1) + 8 * theirs.size + 8 * entries(mine)
    return {"sent": sent, "recv": recv}


def check_bytes(comm, floats: dict, failures: list[str]) -> None:
    """Counted bytes against predictions; with count features (0-3 a value) the rows travel as uint8, one byte
    a value, and arrive as the reference's scaled rows bitwise (the own rows and the cached ones too)."""
    batches = mismatches = counted = 0
    count_features = np.random.default_rng(7).integers(0, 4, floats["features"].shape).astype(np.float32)
    counts = {**floats, "features": count_features}
    for (model, fanouts, cache), (data, itemsize) in itertools.product(
            (("gcn", (3, 2), 0), ("sage", (2, None), 4)), ((floats, 4), (counts, 1))):
        mb = trainer(comm, data, COUNTS[comm.size], model, 2, fanouts, 2, cache)
        scaled = Reference(data["adjacency"].toarray(), data["features"], data["labels"], data["train"], C, model).x
        layer_fanouts = list(fanouts)[::-1]  # the sampler keeps its requests in layer order
        degree = degrees(data, model)
        for step in range(mb.steps_per_epoch):
            before = comm.stats.snapshot()
            batch = mb.make_batch(0, step)
            after = comm.stats.snapshot()
            moved = {phase: {"sent": int(after[phase]["bytes_sent"] - before[phase]["bytes_sent"]),
                             "recv": int(after[phase]["bytes_recv"] - before[phase]["bytes_recv"])}
                     for phase in ("sample", "fetch")}
            library = {"sent": 0, "recv": 0}
            for traffic in mb.sampler.last_traffic:
                for key, value in predict_hop_bytes(traffic, comm.rank).items():
                    library[key] += value
            fetched = predict_fetch_bytes(mb.fetcher.last_asked, mb.fetcher.last_answered, comm.rank,
                                          mb.fetcher.row_bytes())
            independent = expected_sample(comm, mb.sampler.last_requests, layer_fanouts, degree)
            asked = comm.allgather_object(mb.fetcher.last_requests)
            row_bytes = data["features"].shape[1] * itemsize
            # counts sum exactly in float32, so the reference's rows are the trainer's bitwise
            if itemsize == 1 and not torch.equal(batch.inputs, scaled[torch.from_numpy(batch.blocks[0].src)]):
                failures.append(f"bytes {model} P={comm.size} step {step}: input rows differ from the reference's "
                                f"scaled rows ({itemsize}-byte wire)")
            others = [q for q in range(comm.size) if q != comm.rank]
            fetch_expected = {"sent": sum(8 + 8 * asked[comm.rank][q].size + row_bytes * asked[q][comm.rank].size
                                          for q in others),
                              "recv": sum(8 + 8 * asked[q][comm.rank].size + row_bytes * asked[comm.rank][q].size
                                          for q in others)}
            remote = batch.blocks[0].src[(batch.blocks[0].src < mb.first_row)
                                         | (batch.blocks[0].src >= mb.first_row + mb.graph.layout.count(comm.rank))]
            uncached = np.setdiff1d(remote, mb.fetcher.cache_ids)
            if sorted(np.concatenate(mb.fetcher.last_requests).tolist()) != sorted(uncached.tolist()):
                failures.append(f"bytes {model} P={comm.size} step {step}: fetched ids are not the uncached remote "
                                f"input rows")
            batches += 1
            counted += sum(moved[phase][side] for phase in moved for side in ("sent", "recv"))
            for label, got, want in (("sample", moved["sample"], independent), ("sample/library", library,
                                                                                independent),
                                     ("fetch", moved["fetch"], fetch_expected), ("fetch/library", fetched,
                                                                                fetch_expected)):
                if got != want:
                    mismatches += 1
                    failures.append(f"bytes {model} P={comm.size} step {step} {label}: {got} != predicted {want}")
    if comm.rank == 0:
        print(f"BYTES P={comm.size} batches={batches} mismatches={mismatches} rank0_counted_bytes={counted}",
              flush=True)


def same_batch(a, b) -> bool:
    """Bitwise the same seeds, blocks (ids, CSR arrays) and input rows."""
    return (a.step == b.step and np.array_equal(a.seeds, b.seeds) and torch.equal(a.inputs, b.inputs)
            and all(np.array_equal(x.dst, y.dst) and np.array_equal(x.src, y.src)
                    and all(np.array_equal(getattr(x.matrix, f), getattr(y.matrix, f))
                            for f in ("indptr", "indices", "data"))
                    for x, y in zip(a.blocks, b.blocks, strict=True)))


def check_bulk(comm, data: dict, failures: list[str]) -> None:
    """Sampling K = 3 batches per round: each batch bitwise the K = 1 one; the round's counted sample bytes
    equal the independent prediction (one request count per batch and peer) and the library's; the sample
    phase takes 4 collective calls per hop for the whole group, as one batch alone does."""
    layers, fanouts = 2, (3, 2)
    degree = degrees(data, "sage")
    alone = trainer(comm, data, COUNTS[comm.size], "sage", layers, fanouts, 1, cache=3)
    bulk = trainer(comm, data, COUNTS[comm.size], "sage", layers, fanouts, 1, cache=3, sample_batches=3)
    groups = step_groups(bulk.steps_per_epoch, 3)
    calls = {"alone": 0, "bulk": 0}
    fetch_calls = {"alone": 0, "bulk": 0}
    row_bytes = data["features"].shape[1] * 4
    for group in groups:
        before_all = comm.stats.snapshot()
        before = before_all["sample"]
        made = bulk.make_batches(1, group)
        after_all = comm.stats.snapshot()
        after = after_all["sample"]
        calls["bulk"] += int(after["calls"] - before["calls"])
        fetch_calls["bulk"] += int(after_all["fetch"]["calls"] - before_all["fetch"]["calls"])
        moved = {"sent": int(after["bytes_sent"] - before["bytes_sent"]),
                 "recv": int(after["bytes_recv"] - before["bytes_recv"])}
        check_grouped_pull(comm, bulk, made, before_all, after_all, row_bytes, group, failures)
        independent = expected_sample(comm, bulk.sampler.last_requests, list(fanouts)[::-1], degree, len(group))
        library = {"sent": 0, "recv": 0}
        for traffic in bulk.sampler.last_traffic:
            for key, value in predict_hop_bytes(traffic, comm.rank).items():
                library[key] += value
        if moved != independent or library != independent:
            failures.append(f"bulk P={comm.size} steps {group}: counted {moved}, library {library}, "
                            f"predicted {independent}")
        for batch in made:
            before_all = comm.stats.snapshot()
            single = alone.make_batch(1, batch.step)
            after_all = comm.stats.snapshot()
            calls["alone"] += int(after_all["sample"]["calls"] - before_all["sample"]["calls"])
            fetch_calls["alone"] += int(after_all["fetch"]["calls"] - before_all["fetch"]["calls"])
            if not same_batch(batch, single):
                failures.append(f"bulk P={comm.size} step {batch.step}: not bitwise the batch sampled alone")
    want = {"alone": 4 * layers * bulk.steps_per_epoch, "bulk": 4 * layers * len(groups)}
    if calls != want:
        failures.append(f"bulk P={comm.size}: sample-phase collective calls {calls}, expected {want}")
    want = {"alone": 3 * bulk.steps_per_epoch, "bulk": 3 * len(groups)}  # counts, ids, rows: once per group
    if fetch_calls != want:
        failures.append(f"bulk P={comm.size}: fetch-phase collective calls {fetch_calls}, expected {want}")
    if comm.rank == 0:
        print(f"BULK P={comm.size} steps={bulk.steps_per_epoch} groups={len(groups)} "
              f"sample_calls_alone={calls['alone']} sample_calls_bulk={calls['bulk']}", flush=True)


def check_grouped_pull(comm, mb: MinibatchTrainer, made: list, before: dict, after: dict, row_bytes: int,
                       group: list[int], failures: list[str]) -> None:
    """A group's ONE feature pull: it asked each owner for the distinct uncached remote input rows of all the
    group's batches (each once), and its counted bytes equal the prediction from every rank's requests
    (gathered) and the library's (:func:`predict_fetch_bytes`)."""
    last = mb.first_row + mb.graph.layout.count(comm.rank)
    sources = np.concatenate([batch.blocks[0].src for batch in made])
    remote = np.unique(sources[(sources < mb.first_row) | (sources >= last)])
    asked_ids = np.concatenate(mb.fetcher.last_requests)
    if asked_ids.size != np.unique(asked_ids).size or not np.array_equal(
            np.sort(asked_ids), np.setdiff1d(remote, mb.fetcher.cache_ids)):
        failures.append(f"grouped pull P={comm.size} steps {group}: the ids asked are not the group's distinct "
                        f"uncached remote input rows")
    asked = comm.allgather_object(mb.fetcher.last_requests)
    others = [q for q in range(comm.size) if q != comm.rank]
    want = {"sent": sum(8 + 8 * asked[comm.rank][q].size + row_bytes * asked[q][comm.rank].size for q in others),
            "recv": sum(8 + 8 * asked[q][comm.rank].size + row_bytes * asked[comm.rank][q].size for q in others)}
    moved = {"sent": int(after["fetch"]["bytes_sent"] - before["fetch"]["bytes_sent"]),
             "recv": int(after["fetch"]["bytes_recv"] - before["fetch"]["bytes_recv"])}
    library = predict_fetch_bytes(mb.fetcher.last_asked, mb.fetcher.last_answered, comm.rank, mb.fetcher.row_bytes())
    if moved != want or library != want:
        failures.append(f"grouped pull P={comm.size} steps {group}: counted {moved}, library {library}, "
                        f"predicted {want}")


def check_kernels(comm, data: dict, failures: list[str]) -> None:
    """The compiled (numba) and the numpy sampling kernels make bitwise the same batches, sampled in groups of
    3 (--sample-batches 3), for fanouts below, at and above the degrees."""
    for fanouts in ((3, 2), (1, None), (50, 50)):
        made = {}
        for kernel in ("numba", "numpy"):
            mb = trainer(comm, data, COUNTS[comm.size], "sage", 2, fanouts, 2, sample_batches=3, sampler=kernel)
            if mb.sampler.kernel != kernel:
                failures.append(f"kernels P={comm.size}: asked for {kernel}, {mb.sampler.kernel} runs")
            made[kernel] = [batch for group in step_groups(mb.steps_per_epoch, 3)
                            for batch in mb.make_batches(2, group)]
        if len(made["numba"]) != len(made["numpy"]) or not all(
                same_batch(a, b) for a, b in zip(made["numba"], made["numpy"])):
            failures.append(f"kernels P={comm.size} fanouts {fanouts}: numba's batches are not numpy's, bitwise")
    if comm.rank == 0:
        print(f"KERNELS P={comm.size} numba==numpy", flush=True)


def check_p_invariant(comm, data: dict, failures: list[str]) -> None:
    """The same global batch size gives the same steps as one rank holding the whole graph."""
    alone = comm.split(comm.rank, 0)
    for model in ("gcn", "sage"):
        runs = []
        for here, counts, batch_size in ((comm, COUNTS[comm.size], 12 // comm.size), (alone, [23], 12)):
            mb = trainer(here, data, counts, model, 2, (3, 2), batch_size, cache=3)
            loss, grads = gradients(mb)
            losses = [mb.train_epoch()["loss"] for _ in range(2)]
            runs.append((loss, grads, losses))
        (loss, grads, losses), (want, want_grads, want_losses) = runs
        dgrad = max(float((g.double() - w.double()).abs().max()) for g, w in zip(grads, want_grads))
        if abs(loss - want) > TOLERANCE or dgrad > TOLERANCE or not np.allclose(losses, want_losses, atol=1e-4):
            failures.append(f"P-invariance {model} P={comm.size}: loss {loss} vs {want}, |dgrad| {dgrad:.3g}, "
                            f"epochs {losses} vs {want_losses}")
    alone.free()


def check_prefetch(comm, data: dict, failures: list[str]) -> None:
    """A pipelined run (worker thread, its own communicator, running on into the next epoch's first batches)
    is bitwise the unpipelined one over 3 epochs, and each epoch's bytes are the unpipelined epoch's (with
    K = 1 and K = 3); an evaluation between epochs, while the worker samples, counts only its own bytes."""
    runs, epochs = [], 3
    for prefetch, sample_batches in ((0, 1), (2, 1), (0, 3), (2, 3), (1, 2)):
        mb = trainer(comm, data, COUNTS[comm.size], "sage", 2, (3, 2), 2, cache=3, prefetch=prefetch,
                     sample_batches=sample_batches, epochs=epochs)
        records, evaluated = [], []
        for epoch in range(epochs):
            records.append(mb.train_epoch())
            if prefetch and epoch + 1 < epochs and mb._prefetcher.granted.get(epoch + 1, 0) < 1:
                failures.append(f"prefetch {prefetch} K={sample_batches} P={comm.size}: epoch {epoch + 1} was not "
                                f"granted to the worker before epoch {epoch} ended")
            before = comm.stats.snapshot()
            scores = mb.evaluate()
            evaluated.append((scores, {phase: int(d["bytes_sent"]) for phase, d in counters_since(comm, before).items()
                                       if d["bytes_sent"]}))
        runs.append(([r["loss"] for r in records], [p.detach().clone() for p in mb.model.parameters()],
                     [r["bytes"] for r in records], records[-1]["time"]["wait"], evaluated))
        mb.close()
    (losses, weights, moved, _, evaluated), piped, (_, _, moved_k3, _, _), piped_k3, piped_k2 = runs
    for label, (piped_losses, piped_weights, piped_moved, wait, piped_evaluated), want_moved in (
            ("prefetch 2", piped, moved), ("prefetch 2 with K=3", piped_k3, moved_k3),
            ("prefetch 1 with K=2", piped_k2, None)):
        if losses != piped_losses or not all(torch.equal(a, b) for a, b in zip(weights, piped_weights)):
            failures.append(f"{label} P={comm.size}: not bitwise the unpipelined run ({piped_losses} vs {losses})")
        if want_moved is not None and piped_moved != want_moved:
            failures.append(f"{label} P={comm.size}: bytes per epoch differ from the unpipelined run")
        if piped_evaluated != evaluated:
            failures.append(f"{label} P={comm.size}: the evaluations or their bytes differ from the unpipelined "
                            f"run's ({piped_evaluated} vs {evaluated})")
        if not wait >= 0.0:
            failures.append(f"{label} P={comm.size}: wait {wait}")
    if comm.rank == 0:
        print(f"PREFETCH P={comm.size} steps={mb.steps_per_epoch} bitwise={losses == piped_losses}", flush=True)


def run(comm) -> list[str]:
    """Every mini-batch check of this launch (collective; c = 1); the failures. Rank 0 prints the EXACT and
    BYTES lines the pytest side looks for."""
    data = data_set()
    failures: list[str] = []
    check_exact(comm, data, failures, COUNTS[comm.size], comm.rank == 0)
    if comm.size == 2:  # P = 1 without a launch of its own: rank 0 alone holding every row
        alone = comm.split(comm.rank, 0)
        if comm.rank == 0:
            check_exact(alone, data, failures, COUNTS[1], True)
        alone.free()
    check_bytes(comm, data, failures)
    check_bulk(comm, data, failures)
    check_kernels(comm, data, failures)
    check_p_invariant(comm, data, failures)
    check_prefetch(comm, data, failures)
    return failures


def main() -> int:
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    return finish(comm, run(comm), f"minibatch cases P={comm.size}")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
