"""Memory and disk before work: the estimate against measured peak RSS, and refusals in one sentence."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from datasets_for_tests import cora, write
from mpirun import BIN, ROOT, run_mpi

from runners.data.datasets import planted_classes
from runners.resources import mem_available, prepare_memory, shard_bytes, train_memory

SPARSE_DIST = str(BIN / "sparse-dist")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("resources")
    return {"cora": write(cora(), root / "cora", parts=2, partitioner="block"),
            "planted-50k": write(planted_classes(nodes=50_000), root / "planted", parts=2, partitioner="block")}


@pytest.mark.parametrize("name", ["cora", "planted-50k"])
def test_the_estimate_is_within_a_quarter_of_the_measured_peak(graphs, name: str, tmp_path: Path) -> None:
    """Accuracy, not speed: each rank's estimate against its ``ru_maxrss`` minus its resident set at start."""
    out = tmp_path / "r.jsonl"
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(graphs[name]), "--epochs", "3", "--out", str(out)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("memory: about "), result.stdout
    records = [json.loads(line) for line in out.read_text().splitlines()]
    memory = next(r for r in records if r["type"] == "environment")["memory"]
    final = records[-1]
    for rank in range(2):
        grown = final["peak_memory_per_rank"][rank]["rss"] - memory["rss_at_start_per_rank"][rank]
        ratio = memory["estimate_per_rank"][rank] / grown
        assert 0.75 <= ratio <= 1.25, (name, rank, memory["estimate_parts_per_rank"][rank], grown)


def _available() -> int:
    available = mem_available()
    if available is None:
        pytest.skip("no MemAvailable in /proc/meminfo")
    return available


def test_train_refuses_a_width_the_machine_cannot_hold_before_reading_shards(graphs) -> None:
    meta = json.loads((graphs["cora"] / "meta.json").read_text())
    hidden = 1000
    while train_memory(meta, rank=0, world_size=2, replication=1, model="gcn", hidden=hidden, layers=2,
                       dtype="float32").total < 2 * _available():
        hidden *= 2
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(graphs["cora"]), "--epochs", "1", "--hidden", str(hidden)])
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparse-dist train: error: not enough memory: the 2 rank(s) on "), lines
    assert lines[0].endswith(f"use a smaller --hidden (now {hidden}) or more ranks (on more nodes)")


def _prepare(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPARSE_DIST, "prepare", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_prepare_refuses_a_graph_larger_than_memory_and_points_at_stream(tmp_path: Path) -> None:
    nodes = 1_000_000
    while prepare_memory(nodes, 20 * nodes, 128, 2, words=20).total < 2 * _available():
        nodes *= 2
    result = _prepare("synthetic", "--nodes", str(nodes), "--out", str(tmp_path / "big"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "use prepare synthetic --stream (bounded memory)" in result.stderr
    assert result.stderr.startswith("sparse-dist prepare: error: not enough memory: prepare needs about ")
    assert list(tmp_path.iterdir()) == []


def test_shard_bytes_predicts_the_disk_the_shards_take(graphs) -> None:
    meta = json.loads((graphs["planted-50k"] / "meta.json").read_text())
    written = sum(path.stat().st_size for path in graphs["planted-50k"].iterdir())
    predicted = shard_bytes(meta["num_nodes"], meta["num_edges"], meta["feature_dim"])
    assert abs(predicted - written) <= 0.05 * written, (predicted, written)


def test_a_one_rank_run_has_no_boundary_buffers(graphs) -> None:
    meta = json.loads((graphs["cora"] / "meta.json").read_text())
    whole = train_memory(meta, rank=0, world_size=1, replication=1, model="gcn", hidden=4096, layers=2, dtype="float32")
    split = train_memory(meta, rank=0, world_size=2, replication=1, model="gcn", hidden=4096, layers=2, dtype="float32")
    assert whole is not None and split is not None
    assert whole.parts["buffers"] == 0 < split.parts["buffers"]
    assert train_memory(meta, rank=0, world_size=3, replication=1, model="gcn", hidden=16, layers=2,
                        dtype="float32") is None  # 2 parts over 3 row groups: the shard reader refuses it


def test_a_memory_cgroup_limit_counts_as_what_is_available(tmp_path: Path) -> None:
    from runners.resources import cgroup_memory_room

    job = tmp_path / "memory" / "slurm" / "job_7"
    job.mkdir(parents=True)
    (job / "memory.limit_in_bytes").write_text(f"{8 << 30}\n")
    (job / "memory.usage_in_bytes").write_text(f"{3 << 30}\n")
    membership = tmp_path / "cgroup"
    membership.write_text("4:memory:/slurm/job_7\n1:cpu:/\n")
    assert cgroup_memory_room(tmp_path, membership) == 5 << 30
    (job / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert cgroup_memory_room(tmp_path, membership) is None
    unified = tmp_path / "user.slice" / "job"
    unified.mkdir(parents=True)
    (unified / "memory.max").write_text(f"{4 << 30}\n")
    (unified / "memory.current").write_text(f"{1 << 30}\n")
    membership.write_text("0::/user.slice/job\n")
    assert cgroup_memory_room(tmp_path, membership) == 3 << 30
    (unified / "memory.max").write_text("max\n")
    assert cgroup_memory_room(tmp_path, membership) is None
