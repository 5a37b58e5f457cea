"""``prepare rmat`` in bounded memory: the same shards as the all-in-memory path, the expected size the memory
estimate uses, the stage measurements, and a partition table that an independent recount of the shards agrees
with (in process, at SCALE 10-11: fast)."""

from __future__ import annotations

import argparse
import json
import mmap
import re
from pathlib import Path

import numpy as np
import pytest

from runners import prepare_cmd
from runners.data.rmat import (RmatFeatures, features_of, node_data, node_labels, rmat_dataset,
                               rmat_dataset_bounded, rmat_graph)
from runners.data.shards import write_shards
from runners.data.stages import Stages
from runners.prepare_resources import prepare_rmat_memory, rmat_entries


def _probability_matrix(scale: int) -> np.ndarray:
    """R-MAT's ``P(u, v)`` for every pair (Graph500's A, B, C, D): the Kronecker power of ``[[A, B], [C, D]]``."""
    matrix = np.ones((1, 1))
    for _ in range(scale):
        matrix = np.kron(matrix, [[0.57, 0.19], [0.19, 0.05]])
    return matrix


@pytest.mark.parametrize("partitioner,drop", [("metis", False), ("random", True), ("metis-train", False)])
def test_the_bounded_path_writes_the_same_shards_byte_for_byte(tmp_path: Path, partitioner: str, drop: bool) -> None:
    """All in memory (features as one array, ``Â`` whole, METIS given a symmetrised copy) against the bounded path
    with every memory chunk forced small (row buckets of 64, merges every 100 keys, label blocks of 500 entries,
    feature blocks of 100 nodes): the archives are the same bytes (their SHA-256s in meta.json agree)."""
    plain, _ = rmat_dataset(11, features=12, classes=4, seed=2, drop_isolated=drop)
    bounded, _ = rmat_dataset_bounded(11, features=12, classes=4, seed=2, drop_isolated=drop, bucket_rows=64,
                                      merge_at=100, entries=500)
    assert isinstance(bounded.features, RmatFeatures) and np.array_equal(np.asarray(bounded.labels), plain.labels)
    one = write_shards(plain, tmp_path / "plain", 4, partitioner, seed=1)
    two = write_shards(bounded, tmp_path / "bounded", 4, partitioner, seed=1, symmetric=True, feature_block=100)
    assert one["files"] == two["files"] and one["partition_stats"] == two["partition_stats"]
    with np.load(tmp_path / "bounded" / "part-00002.npz") as part:
        order = np.load(tmp_path / "bounded" / "permutation.npy")
        lo, hi = two["row_offsets"][2:4]
        assert np.array_equal(part["features"], plain.features[order[lo:hi]])
        assert part["indices"].dtype == np.int64 and part["features"].dtype == np.float32


def test_labels_in_row_blocks_equal_the_whole_operator_and_features_any_range() -> None:
    graph = rmat_graph(12, seed=9)
    features, labels, masks = node_data(graph.adjacency, 8, 6, seed=9)
    for entries in (777, 1 << 30):
        blocked, blocked_masks = node_labels(graph.adjacency, 8, 6, seed=9, entries=entries)
        assert np.array_equal(blocked, labels)
    assert all(np.array_equal(masks[k], blocked_masks[k]) for k in masks)
    assert np.array_equal(features_of(1000, 3001, 8, 9), features[1000:3001])  # any range: the same rows
    assert np.array_equal(RmatFeatures(4096, 8, 9).rows(4000, 5000), features[4000:])


def test_the_expected_number_of_entries_is_exact() -> None:
    """:func:`rmat_entries` (a sum over bit-pair compositions) against the whole 2^10 x 2^10 probability matrix,
    and against generated graphs (within 5 standard deviations, as if the pairs were independent)."""
    scale, draws = 10, 16 * 2**10
    pair = _probability_matrix(scale)
    either = pair + pair.T
    np.fill_diagonal(either, 0)
    present = 1 - (1 - either) ** draws
    assert rmat_entries(scale, 16) == pytest.approx(present.sum(), rel=1e-9, abs=1)
    spread = 2 * np.sqrt((present * (1 - present)).sum() / 2)
    for seed in range(3):
        assert abs(rmat_graph(scale, seed=seed).adjacency.nnz - rmat_entries(scale, 16)) < 5 * spread


def _touch_and_free(size: int) -> None:
    """``size`` bytes of fresh pages, touched, then returned: an anonymous mapping, not the heap, where an
    earlier test in this process may have left freed memory that is still resident (glibc keeps it)."""
    region = mmap.mmap(-1, size)
    np.frombuffer(region, dtype=np.uint8)[:] = 1
    region.close()


def test_stages_record_time_and_a_peak_that_sees_an_allocation() -> None:
    """A stage's peak sees a spike shorter than the sampling period even when the process's peak is already
    higher (set by an earlier, larger spike), and the process peak is kept across stages."""
    _touch_and_free(160 << 20)  # the process's peak: 160 MiB over what the stage below will start from
    stages = Stages(heartbeat=None)
    with stages.stage("allocate"):
        _touch_and_free(64 << 20)
    with stages.stage("nothing"):
        pass
    allocate, nothing = stages.records
    assert allocate.peak is not None and allocate.peak - allocate.rss_start >= 60 << 20
    assert allocate.peak - allocate.rss_start < 150 << 20  # its own spike, not the earlier one
    assert nothing.peak < allocate.peak and allocate.seconds >= 0
    assert stages.process_peak is not None and stages.process_peak - allocate.rss_start >= 150 << 20
    assert nothing.process_peak == stages.process_peak
    lines = stages.table()
    assert lines[1].startswith("allocate") and lines[-1].startswith("total")


def _prepare(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    parser = argparse.ArgumentParser()
    prepare_cmd.add_arguments(parser)
    assert prepare_cmd.main(None, parser.parse_args(["rmat", *argv])) == 0
    return capsys.readouterr().out


def _table(out: str, parts: int) -> tuple[list[list[int]], list[str], str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("partition table"))
    rows = [[int(v) for i, v in enumerate(line.split()) if i != 4] for line in lines[start + 2:start + 2 + parts]]
    return rows, lines[start + 2 + parts].split()[1:], lines[start + 3 + parts]


@pytest.mark.parametrize("partitioner", ["metis", "metis-train", "random"])
def test_the_partition_table_agrees_with_a_recount_of_the_shards(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 partitioner: str) -> None:
    out_dir = tmp_path / partitioner
    out = _prepare(tmp_path, capsys, "--scale", "10", "--features", "8", "--classes", "4", "--parts", "3",
                   "--partitioner", partitioner, "--out", str(out_dir))
    rows, balances, cut_line = _table(out, 3)
    meta = json.loads((out_dir / "meta.json").read_text())
    offsets = meta["row_offsets"]
    owner = np.repeat(np.arange(3), np.diff(offsets))
    shards = []
    for part in range(3):
        with np.load(out_dir / f"part-{part:05d}.npz") as archive:
            shards.append({key: archive[key] for key in ("indptr", "indices", "train")})
    needed = [set() for _ in range(3)]  # part j's rows that another part's rows read
    recount = []
    for part, shard in enumerate(shards):
        outside = shard["indices"][owner[shard["indices"]] != part]
        for column in np.unique(outside):
            needed[owner[column]].add(int(column))
        recount.append([part, shard["indptr"].size - 1, int(shard["train"].sum()), 0, shard["indices"].size,
                        outside.size])
    for part in range(3):
        recount[part][3] = len(needed[part])
    assert rows == recount
    columns = np.array([r[1:] for r in recount], dtype=float)
    assert balances == [f"{c.max() / c.mean():.3f}" for c in columns.T]
    total_cut = sum(r[5] for r in recount)
    assert cut_line.startswith(f"edge cut: {total_cut} of {sum(r[4] for r in recount)} adjacency entries")
    assert cut_line.endswith(f"boundary rows (rows other parts need): {sum(r[3] for r in recount)}")
    assert re.search(r"^partition \(\S+\)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+$", out, re.M)  # stage table
    assert "generate edges" in out and "write features" in out


MEASURED_GIB = {(18, 4, "metis"): 0.93, (18, 8, "metis"): 1.07, (20, 4, "metis"): 4.16, (22, 8, "random"): 2.00,
                (22, 8, "metis"): 19.38}
"""``prepare rmat --features 128`` peak RSS (``ru_maxrss``) less the 0.26 GiB the process holds before it starts
(docs/guide/prepare.md's table: this machine, commit 813f33b)."""


@pytest.mark.parametrize("case", sorted(MEASURED_GIB))
def test_the_memory_estimate_is_within_a_quarter_of_the_measured_peak(case: tuple[int, int, str]) -> None:
    scale, parts, partitioner = case
    estimate = prepare_rmat_memory(1 << scale, rmat_entries(scale, 16), 128, parts, partitioner).total / (1 << 30)
    assert MEASURED_GIB[case] <= estimate <= 1.25 * MEASURED_GIB[case], (estimate, MEASURED_GIB[case])
