"""One sentence, once: a problem several ranks find at an agreed point is said once, naming the ranks; distinct
problems are listed once each (capped); the job ends non-zero without MPI_Abort and without a hang."""

from __future__ import annotations

import subprocess

import pytest
from datasets_for_tests import cora, write
from mpirun import BIN, run_case, run_mpi

SPARSE_DIST = str(BIN / "sparse-dist")


def _said(result: subprocess.CompletedProcess[str]) -> str:
    return result.stdout + result.stderr


@pytest.mark.parametrize("ranks", [1, 3, pytest.param(4, marks=pytest.mark.slow)])  # P=8: the layout error below
def test_the_same_problem_on_every_rank_is_said_once_with_the_ranks(ranks: int) -> None:
    result = run_case(ranks, "said_once.py", "same", timeout=180)
    assert result.returncode == 2, _said(result)
    expected = "case: error: " + ("" if ranks == 1 else f"ranks 0-{ranks - 1}: ") + \
        "data/meta.json: 4 parts cannot be split over the row groups\n"
    assert result.stderr == expected, _said(result)  # the whole of stderr: no abort notice, no traceback


@pytest.mark.slow
def test_distinct_problems_are_listed_once_each_and_capped() -> None:
    result = run_case(8, "said_once.py", "distinct", timeout=180)
    assert result.returncode == 2, _said(result)
    assert result.stderr == ("case: error: ranks 0, 7: part 0 is damaged; rank 1: part 1 is damaged; rank 2: part 2 "
                             "is damaged; rank 3: part 3 is damaged; rank 4: part 4 is damaged; and 2 more distinct "
                             "messages (ranks 5-6)\n"), _said(result)


def test_an_internal_error_every_rank_raises_shows_one_traceback() -> None:
    result = run_case(3, "said_once.py", "internal", timeout=180)
    assert result.returncode == 1, _said(result)
    assert result.stderr.count("Traceback (most recent call last)") == 1 and "[rank 1]" not in result.stderr
    assert result.stderr.endswith("[rank 0] RuntimeError: ranks 0-2: data/meta.json: 4 parts cannot be split over "
                                  "the row groups\n"), _said(result)


@pytest.fixture(scope="module")
def cora_parts(tmp_path_factory) -> dict[int, object]:
    root = tmp_path_factory.mktemp("said_once")
    graph = cora()
    return {parts: write(graph, root / f"cora{parts}", parts=parts, partitioner="block") for parts in (3, 4)}


# (8 ranks, oversubscribed on a small machine: test_distinct_problems_are_listed_once_each_and_capped)
@pytest.mark.parametrize("ranks, parts", [(3, 4), (4, 3)])
def test_a_layout_error_is_said_once_naming_the_ranks(cora_parts, ranks: int, parts: int) -> None:
    data = cora_parts[parts]
    result = run_mpi(ranks, [SPARSE_DIST, "train", "--data", str(data), "--epochs", "1"], timeout=180)
    assert result.returncode == 2, _said(result)
    assert result.stderr == (f"sparse-dist train: error: ranks 0-{ranks - 1}: {data}: {parts} parts cannot be split "
                             f"over {ranks} row groups (P={ranks}, c=1); use a P/c that divides the number of "
                             f"parts\n"), _said(result)
