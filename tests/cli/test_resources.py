"""Memory and disk before work: the estimate against measured peak RSS, and refusals in one sentence."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from datasets_for_tests import cora, write
from mpirun import BIN, ROOT, run_mpi

from runners.data.datasets import planted_classes
from runners.memory_estimate import HALO_EXCHANGE_COPIES, train_memory
from runners.prepare_resources import prepare_memory, shard_bytes
from runners.resources import mem_available

SPARSE_DIST = str(BIN / "sparse-dist")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("resources")
    return {"cora": write(cora(), root / "cora", parts=2, partitioner="block"),
            "planted-50k": write(planted_classes(nodes=50_000), root / "planted", parts=2, partitioner="block"),
            "cora-4": write(cora(), root / "cora4", parts=4, partitioner="block")}


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
    hidden, layers = 1000, 2  # widths within --hidden's range (65536): deeper once the widest is reached
    while train_memory(meta, rank=0, world_size=2, replication=1, model="gcn", hidden=hidden, layers=layers,
                       dtype="float32").total < 2 * _available():
        hidden, layers = (min(2 * hidden, 65536), layers) if hidden < 65536 else (hidden, 2 * layers)
    assert layers <= 128, "this machine holds 128 layers of 65536: the check cannot be made here"
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(graphs["cora"]), "--epochs", "1", "--hidden", str(hidden),
                         "--layers", str(layers)])
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


def test_a_one_rank_run_keeps_nothing_for_other_ranks(graphs) -> None:
    meta = json.loads((graphs["cora"] / "meta.json").read_text())
    shape = dict(rank=0, replication=1, model="gcn", hidden=4096, layers=2, dtype="float32")
    whole = train_memory(meta, world_size=1, stale="sancus-e:eps=1", **shape)
    split = train_memory(meta, world_size=2, **shape)
    per_epoch = train_memory(meta, world_size=2, input_exchange="per-epoch", **shape)
    stale = train_memory(meta, world_size=2, stale="sancus-e:eps=1", **shape)
    assert whole is not None and split is not None and per_epoch is not None and stale is not None
    assert whole.parts["buffers"] == whole.parts["halo"] == 0
    assert split.parts["halo"] > 0 and per_epoch.parts["halo"] > 0  # fetched once, or received every epoch
    assert split.parts["buffers"] == 0 < stale.parts["buffers"]  # a staleness rule's caches
    assert train_memory(meta, rank=0, world_size=3, replication=1, model="gcn", hidden=16, layers=2,
                        dtype="float32") is None  # 2 parts over 3 row groups: the shard reader refuses it


def test_error_feedback_residuals_are_counted_for_the_layers_that_exchange(graphs) -> None:
    meta = json.loads((graphs["cora"] / "meta.json").read_text())
    shape = dict(rank=0, world_size=2, replication=1, model="gcn", hidden=64, layers=3, dtype="float32")
    plain = train_memory(meta, input_exchange="per-epoch", **shape)
    fp16 = train_memory(meta, input_exchange="per-epoch", compress="fp16", **shape)
    every_layer = train_memory(meta, input_exchange="per-epoch", compress="int8,feedback", **shape)
    once = train_memory(meta, input_exchange="once", compress="int8,feedback", **shape)
    adaptive = train_memory(meta, input_exchange="once", compress="adaptive,feedback", **shape)
    assert "residuals" not in plain.parts and "residuals" not in fp16.parts  # no feedback, nothing kept
    halo_rows = plain.parts["halo"] // (4 * 2 * 64)  # two copies of the widest exchanged width (64) a halo row
    assert halo_rows > 0
    # a residual of the rows and one of the gradients for each exchanging layer: GCN 1433 -> 64 -> 64 -> 7 exchanges
    # 64, 64 and 7 columns (the narrower side of each product); layer 0's input fetched once exchanges nothing a step
    assert every_layer.parts["residuals"] == 2 * halo_rows * (64 + 64 + 7) * 4
    assert once.parts["residuals"] == adaptive.parts["residuals"] == 2 * halo_rows * (64 + 7) * 4
    assert every_layer.total == plain.total + every_layer.parts["residuals"]


@pytest.mark.parametrize("f_in,f_out,epochs", [(1433, 16, 3), (1433, 16, 100), (128, 128, 1), (128, 8, 5),
                                                (64, 256, 2)])
def test_auto_input_exchange_is_predicted_as_the_run_decides_it(f_in: int, f_out: int, epochs: int) -> None:
    """The estimate counts the halo where ``auto`` will fetch it once: its rule is the run's under p2p."""
    from algorithms.static_input import choose_input_exchange, evaluations
    from runners.memory_estimate import fetched_once, model_figures
    from sparse_dist.layout import Grid, RowLayout

    counts = np.array([[0, 40, 7, 0], [31, 0, 12, 5], [9, 22, 0, 18], [0, 3, 25, 0]])
    layout = RowLayout((0, 100, 220, 300, 400))
    first = model_figures("gcn", f_in, f_out, 2, 7)[0]
    decided = choose_input_exchange("auto", grid=Grid(4, 1), layout=layout, boundary_counts=counts,
                                    union_sizes=counts.max(axis=0), plan="p2p", f_in=f_in, f_out=f_out, itemsize=4,
                                    epochs=epochs, evaluations=evaluations(epochs, 1), layer0=first.owner)
    assert fetched_once("auto", first, epochs, evaluations(epochs, 1)) == (decided.mode == "once"), decided


def test_a_power_law_partition_counts_a_halo_and_the_fixed_part_on_every_rank(tmp_path: Path) -> None:
    """R-MAT's hubs are in every part's halo: each rank of every P keeps one (the 16-36% under-estimate at P = 8
    before the halo was counted), bounded by the other parts' boundary rows, and the per-rank fixed part."""
    result = _prepare("rmat", "--scale", "10", "--parts", "8", "--features", "16", "--out", str(tmp_path / "r10"))
    assert result.returncode == 0, result.stderr
    meta = json.loads((tmp_path / "r10" / "meta.json").read_text())
    stats = meta["partition_stats"]
    for world_size in (1, 2, 4, 8):
        halos = []
        for rank in range(world_size):
            estimate = train_memory(meta, rank=rank, world_size=world_size, replication=1, model="gcn", hidden=16,
                                    layers=3, dtype="float32", epochs=3)
            assert estimate is not None and estimate.parts["runtime"] > 0
            per_group = 8 // world_size
            others = sum(stats["boundary_nodes"]) - sum(stats["boundary_nodes"][rank * per_group:(rank + 1) * per_group])
            # X's 16 columns kept, and the exchanges' rows at the widest width (16), float32
            halos.append(estimate.parts["halo"] // (16 * (1 + HALO_EXCHANGE_COPIES) * 4))
            assert halos[-1] <= others
            cut = sum(stats["cut_edges"][rank * per_group:(rank + 1) * per_group])
            assert (halos[-1] > 0) == (world_size > 1 and cut > 0), (world_size, rank, halos)
        if world_size == 8:  # one group per part: prepare's p2p prediction (every halo once), shared out and capped
            predicted = stats["predicted_forward_bytes_per_feature"]["p2p"] // 4
            assert predicted / 2 <= sum(halos) <= predicted + 8, (halos, predicted)


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


POLICY = ["--plan", "dense-bcast", "--stale", "sancus-e:eps=2", "--dropout-side", "receiver"]


@pytest.mark.slow
@pytest.mark.parametrize("ranks, flags", [(2, []), (2, POLICY), (4, ["--compress", "int8,feedback"])],
                         ids=["weights-only", "sancus-caches", "feedback-residuals-P4"])
def test_the_disk_estimate_is_close_to_what_a_run_writes(graphs, ranks: int, flags: list[str], tmp_path: Path) -> None:
    """A checkpoint set (main file, and per-rank policy files where the run keeps policy state) within 25% of the
    estimate; the results file within 50%; the estimate printed on start with the memory line."""
    out, checkpoint = tmp_path / "r.jsonl", tmp_path / "ck" / "run.ckpt"
    data = graphs["cora" if ranks == 2 else "cora-4"]
    result = run_mpi(ranks, [SPARSE_DIST, "train", "--data", str(data), "--epochs", "3", "--out", str(out),
                             "--checkpoint", str(checkpoint), "--checkpoint-every", "1", *flags])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("memory: about ") and lines[1].startswith("disk: about "), lines[:2]
    assert "for checkpoints (2 sets of " in lines[1] and lines[1].endswith(" for the results file"), lines[1]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    estimate = next(r for r in records if r["type"] == "environment")["memory"]["disk_estimate"]
    sets = [entry for entry in checkpoint.parent.iterdir() if entry.is_dir()]
    assert len(sets) == 1, sets
    files = sorted(entry.name for entry in sets[0].iterdir())
    assert files == ["main.ckpt", *([f"rank{r:05d}.ckpt" for r in range(ranks)] if flags else [])], files
    written = sum(entry.stat().st_size for entry in sets[0].iterdir())
    assert abs(estimate["set"] - written) <= 0.25 * written, (estimate, written)
    assert estimate["checkpoint"] == 2 * estimate["set"]
    assert abs(estimate["results"] - out.stat().st_size) <= 0.5 * out.stat().st_size, (estimate, out.stat().st_size)


def _tiny_filesystem(directory: Path, size: str = "64k") -> None:
    directory.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {(mounted.stderr or mounted.stdout).strip()}")


def test_train_refuses_checkpoints_larger_than_the_free_space_before_any_epoch(graphs, tmp_path: Path) -> None:
    tiny = tmp_path / "tiny"
    _tiny_filesystem(tiny)
    try:
        result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(graphs["cora"]), "--epochs", "3",
                             "--checkpoint", str(tiny / "run.ckpt"), "--checkpoint-every", "1", *POLICY])
        assert result.returncode == 2, result.stdout + result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("sparse-dist train: error: not enough disk: the checkpoints (--checkpoint, 2 sets "
                                   "of "), lines
        assert ") need about " in lines[0]
        assert f" in {tiny} but it has " in lines[0]
        assert lines[0].endswith("free space there or choose another --checkpoint directory (a larger "
                                 "--checkpoint-every does not lower the peak)"), lines
        assert "epoch" not in result.stdout, result.stdout
        assert list(tiny.iterdir()) == []  # nothing written, not even a set directory
    finally:
        subprocess.run(["umount", str(tiny)], check=False)


def test_checkpoints_and_results_on_one_file_system_are_counted_together(graphs, tmp_path: Path) -> None:
    """Each alone fits the 64 KiB file system, both together do not: the refusal names both flags."""
    import shutil

    from runners.cli import _parser
    from runners.model_defaults import fill_model_defaults
    from runners.resources import train_disk

    def figures(epochs: int) -> dict[str, int]:
        args = _parser().parse_args(["train", *argv, "--epochs", str(epochs)])
        fill_model_defaults(args)
        return train_disk(meta, args, 2)

    meta = json.loads((graphs["cora"] / "meta.json").read_text())
    tiny = tmp_path / "tiny"
    _tiny_filesystem(tiny)
    try:
        free = shutil.disk_usage(tiny).free
        argv = ["--data", str(graphs["cora"]), "--hidden", "1", "--out", str(tiny / "r.jsonl"),
                "--checkpoint", str(tiny / "run.ckpt"), "--checkpoint-every", "1"]
        epochs = next(e for e in range(1, 100) if figures(e)["checkpoint"] + figures(e)["results"] > free)
        disk = figures(epochs)
        assert disk["checkpoint"] <= free and disk["results"] <= free, (disk, free)  # each alone would fit
        result = run_mpi(2, [SPARSE_DIST, "train", *argv, "--epochs", str(epochs)])
        assert result.returncode == 2, result.stdout + result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            "sparse-dist train: error: not enough disk: the checkpoints (--checkpoint, 2 sets of "), lines
        assert ") and the results file (--out) need about " in lines[0]
        assert "choose another --checkpoint/--out directory" in lines[0]
        assert list(tiny.iterdir()) == []
    finally:
        subprocess.run(["umount", str(tiny)], check=False)


def test_the_memory_hint_names_a_flag_that_would_shrink_the_halo() -> None:
    from argparse import Namespace

    from runners.memory_estimate import Estimate
    from runners.resources import _train_hint

    halo_first = Estimate({"graph": 1, "halo": 10, "activations": 5})
    kept = _train_hint(Namespace(hidden=128, input_exchange="auto"), halo_first)
    assert kept.startswith("--input-exchange per-epoch")
    # received every epoch already: per-epoch cannot help, a narrower exchange or more ranks can
    received = _train_hint(Namespace(hidden=128, input_exchange="per-epoch"), halo_first)
    assert received == "a smaller --hidden (now 128) or more ranks (on more nodes)"
