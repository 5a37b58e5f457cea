"""``bench cores``: the node splits it runs, how it reads a run's epoch records, and its table (no MPI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runners.bench.cores import NodeSplitRun, default_node_splits, parse_node_splits, read_node_split_run, table
from runners.perf.node_split import NodeSplit


def test_the_default_splits_are_the_powers_of_two_then_all_threads_and_pairs_of_threads() -> None:
    assert default_node_splits(16) == [NodeSplit(1, 1), NodeSplit(2, 1), NodeSplit(4, 1), NodeSplit(8, 1),
                                       NodeSplit(16, 1), NodeSplit(1, 16), NodeSplit(8, 2)]
    assert default_node_splits(2) == [NodeSplit(1, 1), NodeSplit(2, 1), NodeSplit(1, 2)]
    assert default_node_splits(1) == [NodeSplit(1, 1)]
    assert default_node_splits(6) == [NodeSplit(1, 1), NodeSplit(2, 1), NodeSplit(4, 1), NodeSplit(1, 6),
                                      NodeSplit(3, 2)]


def test_splits_are_parsed_or_refused_in_one_sentence() -> None:
    assert parse_node_splits("1x1, 8X2") == [NodeSplit(1, 1), NodeSplit(8, 2)]
    for bad in ("8", "0x2", "2x", "ax1"):
        with pytest.raises(ValueError, match="is not RxT"):
            parse_node_splits(bad)


def _epoch(epoch: int, total: float, dropout: float, exchange: float, wait: float) -> dict:
    parts = {"total": total, "masks": 0.25 * dropout, "dropout": 0.75 * dropout, "exchange": exchange,
             "exchange_wait": wait}
    return {"type": "epoch", "epoch": epoch, "time": {k: {"min": v / 2, "mean": v / 2, "max": v}
                                                      for k, v in parts.items()}}


def test_a_run_is_the_median_of_its_epochs_after_the_first_two(tmp_path: Path) -> None:
    records = [{"type": "config"}, _epoch(1, 9.0, 9.0, 9.0, 9.0), _epoch(2, 9.0, 9.0, 9.0, 9.0),
               _epoch(3, 1.0, 0.2, 0.1, 0.0), _epoch(4, 3.0, 0.4, 0.3, 0.2), _epoch(5, 2.0, 0.3, 0.2, 0.1),
               {"type": "final"}]
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = read_node_split_run(path, 2, 1, 0.5)
    assert (run.step, run.exchange, run.exchange_wait) == (2.0, 0.2, 0.1)
    assert run.dropout_part == pytest.approx(0.3)  # masks + dropout, the slowest rank's
    # every part on its own, each its own median of the slowest rank's seconds (masks 0.25x, dropout 0.75x)
    assert run.parts == pytest.approx({"masks": 0.075, "dropout": 0.225, "exchange": 0.2, "exchange_wait": 0.1})
    assert table([run])[0]["parts"] == run.parts  # and the JSON rows carry them
    path.write_text("".join(json.dumps(r) + "\n" for r in records[:3]))
    with pytest.raises(ValueError, match="no epoch past the first 2"):
        read_node_split_run(path, 2, 1, 0.5)


def test_speedup_and_efficiency_are_against_one_rank_of_one_thread_at_the_same_dropout() -> None:
    def run(ranks: int, threads: int, dropout: float, step: float, dropout_part: float,
            exchange: float) -> NodeSplitRun:
        return NodeSplitRun(ranks, threads, dropout, step, dropout_part, {"exchange": exchange, "exchange_wait": 0.0})

    runs = [run(1, 1, 0.5, 4.0, 1.0, 0.0), run(1, 1, 0.0, 3.0, 0.0, 0.0),
            run(2, 2, 0.5, 1.6, 0.4, 0.1), run(2, 2, 0.0, 1.5, 0.0, 0.1)]
    rows = {(row["ranks"], row["threads"], row["dropout"]): row for row in table(runs)}
    assert rows[(2, 2, 0.5)]["speedup"] == pytest.approx(2.5)
    assert rows[(2, 2, 0.5)]["efficiency"] == pytest.approx(0.625)
    assert rows[(2, 2, 0.0)]["speedup"] == pytest.approx(2.0)
    assert rows[(2, 2, 0.5)]["dropout_share"] == pytest.approx(0.25)
    alone = table([run(2, 1, 0.5, 1.0, 0.1, 0.0)])  # no 1 x 1 run: nothing to compare with
    assert alone[0]["speedup"] is None and alone[0]["efficiency"] is None
