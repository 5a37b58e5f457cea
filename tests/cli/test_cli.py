"""The commands users launch, under real mpiexec."""

import json
import sys

import pytest
from mpirun import BIN, run_mpi

from sparse_dist.plans import PLAN_NAMES

SPARSE_DIST = str(BIN / "sparse-dist")


@pytest.mark.parametrize("ranks,extra", [(2, []), pytest.param(4, ["--replication", "2"], marks=pytest.mark.slow)])
def test_demo_matches_the_single_process_result(ranks: int, extra: list[str]) -> None:
    result = run_mpi(ranks, [SPARSE_DIST, "demo", *extra], timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "match: all plans equal the single-process result" in result.stdout
    assert result.stdout.count("True") == len(PLAN_NAMES)  # one row per plan, each matching


@pytest.mark.slow
def test_bench_reports_counted_bytes_equal_to_predicted() -> None:
    result = run_mpi(3, [SPARSE_DIST, "bench", "spmm", "--nodes", "3000", "--degree", "4", "--features", "8",
                         "--repeats", "1", "--graph", "random", "--json"], timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["world_size"] == 3 and set(report["plans"]) == set(PLAN_NAMES)
    for plan in report["plans"].values():
        assert plan["bytes_match"] is True
        assert plan["counted_bytes"] == plan["predicted_bytes"]
    assert report["reference"]["forward"] > 0
    # dense broadcast moves every row of H to every other rank: 3000 * 8 * 4 bytes received in total * 2 others
    dense_received = sum(recv for _, recv in report["plans"]["dense-bcast"]["counted_bytes"]["forward"])
    assert dense_received == 2 * 3000 * 8 * 4


def test_bad_arguments_end_the_job_nonzero() -> None:
    result = run_mpi(2, [SPARSE_DIST, "bench", "spmm", "--nodes", "100", "--replication", "3"], timeout=120)
    assert result.returncode != 0
    assert "must divide" in result.stderr


def test_info_runs_without_mpiexec() -> None:
    import subprocess

    result = subprocess.run([sys.executable, "-m", "runners.cli", "info"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "mpi_library" in result.stdout and "cuda-aware" in result.stdout


@pytest.mark.parametrize("flag,value,sentence", [
    ("--sample", "foo", "argument --sample: unknown sampling policy 'foo'"),
    ("--stale", "sancus-h:eps=-1", "argument --stale: sancus-h: eps must be >= 0, got -1.0"),
])
def test_a_bad_policy_flag_is_said_once_before_anything_is_read(flag: str, value: str, sentence: str) -> None:
    """The data directory does not exist: the flag must be refused first, by rank 0 alone, with no traceback."""
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", "/no/such/dataset", flag, value], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count(sentence) == 1, result.stderr
    assert "accepted:" in result.stderr
    assert "Traceback" not in result.stderr and "no/such/dataset" not in result.stderr
