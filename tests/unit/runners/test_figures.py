"""The scaling figure's series and ideal line (no drawing), the breakdown's waits, and which bandwidth figures a
table draws."""

from __future__ import annotations

import numpy as np

from runners.figures import AGAINST_BANDWIDTH, _series, ideal_times, plot_against_bandwidth


def _row(dataset: str, ranks: int, seconds: float) -> dict[str, object]:
    return {"dataset": dataset, "world_size": ranks, "replication": 1, "plan": "p2p", "policy": "exact",
            "compress": "none", "variant": "", "epoch_time": seconds, "exchange_bytes": 0.0,
            "t_local_spmm": 0.0, "t_dense": 0.0, "t_exchange": 0.0, "t_allreduce": 0.0}


def test_each_dataset_is_its_own_line() -> None:
    rows = [_row(name, ranks, seconds) for name, base in (("metis", 7.0), ("metis-train", 6.0))
            for ranks, seconds in ((1, base), (2, base / 1.5), (4, base / 2))]
    series = _series(rows)
    assert sorted(series) == ["metis-train: p2p exact", "metis: p2p exact"]
    assert [r["epoch_time"] for r in series["metis: p2p exact"]] == [7.0, 7.0 / 1.5, 3.5]
    assert [r["world_size"] for r in series["metis-train: p2p exact"]] == [1, 2, 4]
    assert list(_series(rows[:3])) == ["p2p exact"]  # one dataset: its lines keep the short name


def test_the_ideal_line_divides_by_p_strong_and_stays_flat_weak() -> None:
    ranks, times = np.array([2, 4, 8]), np.array([6.0, 4.0, 3.0])
    assert ideal_times(ranks, times, "strong").tolist() == [6.0, 3.0, 1.5]
    assert ideal_times(ranks, times, "weak").tolist() == [6.0, 6.0, 6.0]


def test_a_points_spread_pools_its_seeds_and_old_tables_have_none() -> None:
    runs = [{**_row("d", 2, mean), "seed": seed, "epoch_time_median": median, "epoch_time_min": low,
             "epoch_time_max": high} for seed, (mean, median, low, high) in enumerate(
                 ((3.0, 2.5, 2.0, 5.0), (4.0, 3.5, 1.5, 4.5), (5.0, 4.5, 3.0, 6.5)))]
    (point,) = _series(runs)["p2p exact"]
    assert point["epoch_time"] == 4.0  # the mean of the seeds' means, as before
    assert (point["epoch_time_median"], point["epoch_time_min"], point["epoch_time_max"]) == (3.5, 1.5, 6.5)
    (old,) = _series([_row("d", 2, 3.0)])["p2p exact"]  # a results table written before the spread columns
    assert old["epoch_time_median"] is None and old["epoch_time_max"] is None


def test_the_waits_are_averaged_like_the_other_parts_and_zero_in_older_tables() -> None:
    runs = [{**_row("d", 2, 1.0), "seed": seed, "t_exchange": 0.1, "t_exchange_wait": wait, "t_allreduce_wait": 0.0}
            for seed, wait in enumerate((0.2, 0.4))]
    (point,) = _series(runs)["p2p exact"]
    assert abs(point["t_exchange_wait"] - 0.3) < 1e-12
    assert point["t_exchange"] == 0.1 and point["t_allreduce_wait"] == 0.0
    (old,) = _series([_row("d", 2, 1.0)])["p2p exact"]  # written before the split: its waits are in t_exchange
    assert old["t_exchange_wait"] == 0.0 and old["t_allreduce_wait"] == 0.0


def test_own_exchange_and_its_wait_are_drawn_against_bandwidth_apart(tmp_path) -> None:
    columns = {column: name for column, name, _, _ in AGAINST_BANDWIDTH}
    assert columns["t_exchange"] == "exchange-bandwidth.png"
    assert columns["t_exchange_wait"] == "exchange-wait-bandwidth.png"
    rows = [{**_row("d", 2, 1.0), "bandwidth": bandwidth, "t_exchange": 0.2, "t_exchange_wait": 0.05}
            for bandwidth in ("1gbit", "unlimited")]
    for column, name, ylabel, title in AGAINST_BANDWIDTH[1:]:
        assert plot_against_bandwidth(rows, column, ylabel, title, tmp_path / name, 50)
        assert (tmp_path / name).stat().st_size > 0
    older = [{key: value for key, value in row.items() if key != "t_exchange_wait"} for row in rows]
    assert not plot_against_bandwidth(older, "t_exchange_wait", "y", "t", tmp_path / "old.png", 50)
