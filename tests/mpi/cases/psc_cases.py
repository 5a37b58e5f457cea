"""psc's feature cache for layer 0 (inclusion-aware caching), checks run by pipe_cases.py's launches (1D), on
the random directed graph of static_input_cases.py over the launch's row groups (P = 3: one row group EMPTY):

* with ``budget = 1`` (nothing sampled) and half the boundary rows cached, training equals the independent
  single-process reference (tests/support/reference_gcn.py): the cached and fetched rows of X, masked by the
  receiver, give the exact layer 0;
* with ``budget = 0.4`` (probabilities recomputed every 2 epochs, so the cache set changes), the cache budget
  changes nothing but where rows come from: the losses with ``cache = 0, 0.5, 1`` are bitwise equal; no cache
  means no hit and layer 0 fetches every needed row (bytes counted exactly), a full cache means every needed
  row is a hit and layer 0 fetches nothing; the rows the cache holds are X's rows (static: a hit is never
  stale).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from reference_gcn import Reference  # noqa: E402
from static_input_cases import C, close, local_graph  # noqa: E402

from algorithms.train import TrainConfig, Trainer  # noqa: E402
from sparse_dist.layout import RowLayout  # noqa: E402

RTOL, ATOL = 1e-4, 2e-5


def check_exact_through_the_cache(comm, data: dict, layout: RowLayout, failures: list[str]) -> None:
    trainer = Trainer(comm, local_graph(data, layout, comm.rank),
                      TrainConfig(epochs=4, sample="psc:budget=1,every=2,cache=0.5"))
    reference = Reference(data["adjacency"].toarray(), data["features"], data["labels"], data["train"], C, "gcn")
    if trainer.input_exchange.mode != "cache":
        failures.append(f"psc cache: layer 0 runs in mode {trainer.input_exchange.mode}, not cache")
    for epoch in range(4):
        got, want = trainer.train_epoch()["loss"], reference.step()
        if abs(got - want) > ATOL + RTOL * abs(want):
            failures.append(f"psc budget=1 cache=0.5 P={comm.size}: epoch {epoch + 1} loss {got:.7f} != {want:.7f}")
    if not all(close(a, b) for a, b in zip(trainer.parameters(), [p for l in reference.params for p in l])):
        failures.append(f"psc budget=1 cache=0.5 P={comm.size}: weights differ from the reference")


def check_cache_budgets(comm, data: dict, layout: RowLayout, failures: list[str]) -> None:
    runs, received, needed_rows = {}, {}, {}
    for share in (0.0, 0.5, 1.0):
        trainer = Trainer(comm, local_graph(data, layout, comm.rank),
                          TrainConfig(epochs=6, hidden=8, sample=f"psc:budget=0.4,every=2,cache={share}"))
        records = [trainer.train_epoch() for _ in range(6)]
        cache = trainer.work[0].cached_input  # the psc feature cache (its EpochWork)
        runs[share] = [r["loss"] for r in records]
        hits = sum(r["feature_cache"]["hits"] for r in records)
        needed = sum(r["feature_cache"]["needed"] for r in records)
        if share == 0.0 and hits:
            failures.append(f"psc cache=0 P={comm.size}: {hits} hits without a cache")
        if share == 1.0 and hits != needed:
            failures.append(f"psc cache=1 P={comm.size}: {hits} hits of {needed} needed rows")
        received[share] = [r["bytes"]["forward"]["recv"] for r in records]
        needed_rows[share] = [r["feature_cache"]["needed"] for r in records]
        held = cache.recv_global[cache.cached]
        rows = data["features"][held].astype(np.float64)
        rows = rows / np.where(rows.sum(axis=1, keepdims=True) == 0, 1.0, rows.sum(axis=1, keepdims=True))  # row norm
        if not torch.equal(cache.cached_values.cpu(), torch.from_numpy(rows).to(cache.cached_values.dtype)):
            failures.append(f"psc cache={share} P={comm.size}: a cached row differs from X's row")
        if trainer.spmm.strategy.recomputations != 2:
            failures.append(f"psc every=2: {trainer.spmm.strategy.recomputations} recomputations in 6 epochs, not 2")
    # the same samples: without a cache layer 0 fetches every needed row of X (6 columns of float32); with a
    # full cache it fetches none, and layer 1's exchange is the same in both runs
    fetched = [a - b for a, b in zip(received[0.0], received[1.0])]
    if fetched != [rows * 6 * 4 for rows in needed_rows[0.0]] or needed_rows[0.0] != needed_rows[1.0]:
        failures.append(f"psc P={comm.size}: layer 0 fetched {fetched} bytes, needed rows {needed_rows[0.0]}")
    if not (runs[0.0] == runs[0.5] == runs[1.0]):
        failures.append(f"psc P={comm.size}: the cache budget changed the losses: {runs}")
    if not np.all(np.isfinite(runs[0.0])):
        failures.append(f"psc P={comm.size}: non-finite loss {runs[0.0]}")


