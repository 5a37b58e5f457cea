"""A third party's layer and staleness rule (tests/support/third_party.py, written as docs/design/extending.md
says) reach every estimator and a real run: the memory and disk estimates, ``cost predict`` and a 2-rank
``train``. In-process the registrations are undone after each test; the commands run through
tests/support/with_third_party.py, which registers them and then runs the command line."""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import sys
from pathlib import Path

import pytest
from datasets_for_tests import random_directed, write
from mpirun import ROOT, run_mpi, run_with_timeout

from algorithms.layers import LAYER_TYPES
from algorithms.policies import AxisSpec, PolicySpec, registry

WITH_THIRD_PARTY = str(ROOT / "tests" / "support" / "with_third_party.py")
DIMS = [12, 16, 4]  # random_directed's features, the hidden width, its classes
PARAMETERS = 12 * 16 + 16 * 16 + 16 + 16 * 4 + 4 * 4 + 4  # per layer: two weight matrices and a bias


@pytest.fixture()
def third_party():
    """The module imported (its registrations made) for one test, then every registration undone."""
    layers, kinds = dict(LAYER_TYPES), {axis: dict(known) for axis, known in registry.KINDS.items()}
    sys.modules.pop("third_party", None)
    try:
        yield importlib.import_module("third_party")
    finally:
        sys.modules.pop("third_party", None)
        LAYER_TYPES.clear()
        LAYER_TYPES.update(layers)
        for axis, known in kinds.items():
            registry.KINDS[axis].clear()
            registry.KINDS[axis].update(known)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write(random_directed(), tmp_path_factory.mktemp("third_party") / "random")


def _built_parameters() -> int:
    from algorithms.model import GraphModel

    return sum(p.numel() for p in GraphModel("gin-like", DIMS).parameters())


def test_the_estimators_ask_the_new_layer_and_rule(third_party, data: Path) -> None:
    from runners.perf.cost_model import ExpectedTraffic, ModelShape
    from runners.resources import OPTIMIZER_COPIES, policy_state_copies, train_disk, train_memory

    built = _built_parameters()
    assert built == PARAMETERS
    meta = json.loads((data / "meta.json").read_text())
    memory = train_memory(meta, rank=0, world_size=2, replication=1, model="gin-like", hidden=16, layers=2,
                          dtype="float32")
    assert memory.parts["parameters"] == OPTIMIZER_COPIES * built * 4
    shape = ModelShape(tuple(DIMS), "gin-like")
    assert shape.parameters == built
    assert shape.exchanges == [(12, False), (16, True)]  # it aggregates H first in every layer, whatever the widths
    assert shape.dense_work_per_row == 12 * 16 + 16 * 16 + 16 * 4 + 4 * 4
    traffic = ExpectedTraffic.of(PolicySpec.parse("every-third"))  # agreement, overlaps, ...: PolicyBase's defaults
    assert traffic.active == pytest.approx(1 / 3) and not traffic.agreement and not traffic.overlapped
    stale = AxisSpec.parse("stale", "every-third")
    assert policy_state_copies(stale, "none") == (1, True)  # a caching rule's default: one cached block per layer
    args = argparse.Namespace(dtype="float32", model="gin-like", hidden=16, layers=2, heads=None, output_heads=None,
                              checkpoint=str(data.parent / "run.ckpt"), guard="off", stale=stale,
                              sample=AxisSpec.parse("sample", "none"), compress="none", dropout_side="auto",
                              dropout=0.5, input_exchange="auto", replication=1, plan="sparse-bcast", resume=False,
                              out=None, epochs=3)
    disk = train_disk(meta, args, 2)
    assert disk["set"] >= 3 * built * 4  # the weights and Adam's two moments, counted from the layer's own answer


def test_the_pyg_peer_refuses_a_kind_it_cannot_mirror(third_party) -> None:
    from runners.bench.pyg_peer import mirror_problem

    assert all(mirror_problem(kind) is None for kind in ("gcn", "sage", "gat"))
    assert mirror_problem("gin-like") == ("the PyG peer mirrors --layer-kind gcn, sage, gat only: it has no PyG "
                                          "layer to copy the weights of --layer-kind gin-like into")


def test_cost_predict_prices_the_new_layer_and_rule(data: Path, tmp_path: Path) -> None:
    study = tmp_path / "study"
    study.mkdir()
    calibration = {"run": "calibration", "world_size": 1, "replication": 1, "plan": "p2p", "policy": "exact",
                   "sample": "none", "stale": "none", "compress": "none", "epoch_time": 0.01, "nodes": 1,
                   "data": str(data), "hidden": 16, "layers": 2, "model": "gcn", "dtype": "float32",
                   "input_exchange": "per-epoch", "receiver_dropout": "False", "threads_per_rank": 1,
                   "t_local_spmm": 0.001, "t_dense": 0.002, "t_policy": "", "broadcast_fraction": ""}
    with open(study / "results.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(calibration))
        writer.writeheader()
        writer.writerow(calibration)
    result = run_with_timeout([sys.executable, WITH_THIRD_PARTY, "cost", "predict", "--nodes", "10000", "--nnz",
                               "100000", "--features", "12", "--classes", "4", "--hidden", "16", "--layers", "2",
                               "--layer-kind", "gin-like", "--ranks", "2,4", "--plans", "sparse-bcast,p2p",
                               "--policies", "exact,every-third", "--calibrate-from", str(study)], timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "GIN-LIKE 2 layers" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line.split()[:1] in (["2"], ["4"])]
    assert [row[:3] for row in rows if row[2] == "every-third"] == [["2", "sparse-bcast", "every-third"],
                                                                   ["4", "sparse-bcast", "every-third"]], result.stdout
    assert not any(row[1] == "p2p" and row[2] == "every-third" for row in rows)  # p2p carries no history


def test_two_ranks_train_the_new_layer_under_the_new_rule(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    result = run_mpi(2, [sys.executable, WITH_THIRD_PARTY, "train", "--data", str(data), "--layer-kind", "gin-like",
                         "--plan", "sparse-bcast", "--stale", "every-third", "--epochs", "4", "--print-every", "1000",
                         "--out", str(out)], timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "memory: about" in result.stdout  # the estimate ran, and let the run go
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["type"] for r in records] == ["config", "environment", "setup"] + ["epoch"] * 4 + ["final"]
    estimate = records[1]["memory"]["estimate_parts_per_rank"]
    assert {parts["parameters"] for parts in estimate} == {4 * PARAMETERS * 4}  # Adam's copies, float32
    # owners send in epochs 0 and 3 (every third) and are stale in between, on every exchanging layer
    sent = [[bool(layer["active"]) for layer in r["broadcasts"]] for r in records[3:7]]
    assert sent == [[True] * len(sent[0]), [False] * len(sent[0]), [False] * len(sent[0]), [True] * len(sent[0])]

