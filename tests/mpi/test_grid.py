"""GCN and SAGE over a process grid under real mpiexec (tests/mpi/cases/grid_cases.py): every grid equals one process in
float64 (losses, first gradients, weights after 3 Adam steps) on a directed graph with isolated, in-only and
out-only nodes and on Cora, with counted == predicted bytes per phase. Grids of fewer ranks run on
sub-communicators of the same launch: rows, widths and classes that do not divide, axes with empty class blocks."""

import pytest
from mpirun import run_case

from sparse_dist.grid import GridShape, block_range


def test_grids_of_up_to_four_ranks_equal_one_process_in_float64() -> None:
    """GCN here; SAGE on the slow lane's launches (the same cases)."""
    grids = ["1,1,1", "2,1,1", "1,1,3", "2,2,1", "1,2,2"]
    result = run_case(4, "grid_cases.py", "--gcn-only", *grids, timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"grid GCN on 4 ranks, grids {' '.join(grids)}: all checks pass" in result.stdout, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("ranks,grids", [(4, ["1,2,1", "1,1,2", "3,1,1", "1,3,1", "4,1,1", "1,1,4"]),
                                         (8, ["2,2,2", "4,2,1", "1,1,8", "3,2,1", "1,2,3"])])
def test_more_grids_equal_one_process_in_float64(ranks: int, grids: list[str]) -> None:
    result = run_case(ranks, "grid_cases.py", *grids, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"grid GCN and SAGE on {ranks} ranks, grids {' '.join(grids)}: all checks pass" in result.stdout, result.stderr


@pytest.mark.parametrize("ranks", [3, 4])
def test_the_coded_allreduce_is_the_documented_algorithm_with_the_models_bytes(ranks: int) -> None:
    """tests/mpi/cases/grid_coded_cases.py: 37 rows over 3 or 4 ranks, 3 rows over 4 (an empty chunk)."""
    result = run_case(ranks, "grid_coded_cases.py", timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"coded allreduce on {ranks} ranks: all checks pass" in result.stdout, result.stderr


def test_grid_shapes_are_parsed_and_checked_in_one_sentence() -> None:
    assert GridShape.parse("2,2,1", 4) == GridShape(2, 2, 1) and GridShape.parse("1x1x8", 8).size == 8
    for text, words in (("2,2", "three positive integers"), ("2,0,2", "three positive integers"),
                        ("a,b,c", "three positive integers"), ("2,2,2", "the job has 4 ranks")):
        with pytest.raises(ValueError, match=words) as error:
            GridShape.parse(text, 4)
        assert "\n" not in str(error.value)


def test_blocks_are_array_split_s() -> None:
    import numpy as np

    for length, parts in ((10, 3), (2, 8), (0, 2), (2708, 7)):
        spans = [block_range(length, parts, index) for index in range(parts)]
        expected = [(int(c[0]), int(c[-1]) + 1) if c.size else None for c in np.array_split(np.arange(length), parts)]
        assert [s if s[1] > s[0] else None for s in spans] == expected
        assert spans[0][0] == 0 and spans[-1][1] == length and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


@pytest.mark.slow
@pytest.mark.parametrize("model,dropout", [("gcn", "0"), ("sage", "0"), ("gcn", "0.5")])
def test_bench_grid_trains_from_shards_with_the_bytes_of_the_model(tmp_path, model: str, dropout: str) -> None:
    import json

    from datasets_for_tests import random_directed, write
    from mpirun import BIN, run_mpi

    data = write(random_directed(n=300, seed=3), tmp_path / "data", parts=3)
    out = tmp_path / "grid.jsonl"
    result = run_mpi(2, [str(BIN / "sparse-dist"), "bench", "grid", "--data", str(data), "--grid", "2,1,1",
                         "--epochs", "3", "--hidden", "8", "--model", model, "--dropout", dropout, "--out", str(out)],
                     timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    epochs, summary = records[:-1], records[-1]
    assert [r["epoch"] for r in epochs] == [1, 2, 3] and epochs[-1]["loss"] < epochs[0]["loss"]
    assert all(r["bytes_busiest_rank"] == r["bytes_predicted"] and r["bytes_predicted"]["forward"] > 0
               for r in epochs)
    assert summary["grid"] == "2x1x1" and summary["model"] == model and 0.0 <= summary["test_acc"] <= 1.0 and len(summary["peak_rss_bytes"]) == 2
    once = float(dropout) == 0.0  # without dropout layer 0 is aggregated once, before the steps
    assert summary["input_bytes_busiest_rank"] == summary["input_bytes_predicted"] and (summary["input_bytes_predicted"] > 0) == once
    assert len(summary["memory"]["estimate_over_peak"]) == 2 and all(r > 0 for r in summary["memory"]["estimate_over_peak"])
    assert result.stdout.startswith("memory: about "), result.stdout


def test_bench_grid_refuses_what_the_node_cannot_hold_before_reading_blocks(tmp_path) -> None:
    """--hidden 65536 on 3 layers: Adam's copies of a 65536 x 65536 weight block are tens of GiB a rank."""
    from datasets_for_tests import random_directed, write
    from mpirun import BIN, run_mpi

    data = write(random_directed(n=60, seed=3), tmp_path / "data", parts=2)
    result = run_mpi(2, [str(BIN / "sparse-dist"), "bench", "grid", "--data", str(data), "--grid", "2,1,1",
                         "--epochs", "1", "--hidden", "65536"], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "not enough memory: the 2 rank(s) on " in lines[0], lines
    assert lines[0].endswith("use more nodes or a smaller --hidden") and "parameters" in lines[0]
