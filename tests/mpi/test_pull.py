"""The one pull of rows by global id (sparse_dist/pull.py): rows, segments, computed answers and agreed counts
equal what they should bitwise, and counted bytes equal the pull's own prediction and an independent one, under
real mpiexec at P = 2, 3 (an empty part) and 4 (tests/mpi/cases/pull_cases.py); its byte arithmetic in-process."""

import pytest
from mpirun import run_case

from sparse_dist.fetch import predict_fetch_bytes
from sparse_dist.pull import PullTraffic, predict_pull_bytes
from sparse_dist.sampling import HopTraffic, predict_hop_bytes


@pytest.mark.parametrize("ranks", [1, 2, 3, pytest.param(4, marks=pytest.mark.slow)])  # 1: no exchange at all; 4: slow lane
def test_pull_cases_under_mpiexec(ranks: int) -> None:
    result = run_case(ranks, "pull_cases.py", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"PULL P={ranks} pulls=10 mismatches=0" in result.stdout, result.stdout + result.stderr
    assert "all checks pass" in result.stdout, result.stdout


def test_the_callers_predictions_are_the_pulls() -> None:
    """Rank 1 of 3: asks 4 and 0 ids of ranks 0 and 2, answers 2 and 5; the own slot counts nothing."""
    asked, answered = [4, 9, 0], [2, 9, 5]
    dense = predict_pull_bytes(PullTraffic.dense(asked, answered, 20), 1)
    assert dense == {"sent": 8 * 2 + 8 * 4 + 20 * 7, "recv": 8 * 2 + 8 * 7 + 20 * 4}
    assert predict_fetch_bytes(asked, answered, 1, 20) == dense
    hop = HopTraffic(asked, [6, 99, 0], answered, [1, 99, 3], batches=3)
    words_in, words_out = [8 * (4 + 12), 0, 0], [8 * (2 + 2), 0, 8 * (5 + 6)]
    ragged = predict_pull_bytes(PullTraffic(asked, answered, words_in, words_out, 3, ragged=True), 1)
    assert predict_hop_bytes(hop, 1) == ragged == {"sent": 8 * 3 * 2 + 8 * 4 + 8 * 2 + 8 * (4 + 11),
                                                  "recv": 8 * 3 * 2 + 8 * 7 + 8 * 2 + 8 * 16}
    agreed = PullTraffic.dense(asked, answered, 20, segments=0)
    assert agreed.request_bytes(1) == {"sent": 8 * 4, "recv": 8 * 7}
    assert agreed.answer_bytes(1) == {"sent": 20 * 7, "recv": 20 * 4}
