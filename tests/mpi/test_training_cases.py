"""The in-memory training checks under real mpiexec, one launch per rank count (tests/mpi/cases/training_cases.py):

* distributed SpMM against scipy (spmm_cases.py): 6 matrices x F in {1, 64} x two dtypes x 3 plans, forward,
  transpose, autograd, counted == predicted bytes;
* every exchange plan x GCN/SAGE, two datasets, 5 epochs (train_parity.py): logits, first gradients, losses
  and final weights equal the plain-torch reference (tests/support/reference_gcn.py);
* layer 0 from a halo fetched once, receiver-side dropout, compression (static_input_cases.py): exact against
  the single-process reference, counted == predicted bytes (coded sizes), an EMPTY row group at P = 3;
* pipelined stale exchange (pipe_cases.py): tau = 0 bitwise the exact path, tau = 1, 2 equal a single-process
  simulation of T-stale rows and gradients, each epoch uses exactly the flight of epoch t - tau, bytes equal the
  exact (or sampled) path's, a checkpoint with flights outstanding resumes bitwise; at c = 1 psc's feature
  cache (psc_cases.py) and dgs (R = Q = 1 bitwise exact, its explanation time booked apart);
* GAT (gat_cases.py): exact against tests/support/reference_gat.py with predicted bytes, and with ``--gat-policies`` its
  sampling and staleness checks;
* policies at c = 1 (policy_cases.py): unbiased sampling, the same sample forward and backward, staleness
  agreement, psc and dgs properties;
* mini-batch training at c = 1 (minibatch_cases.py): exact against the reference with every fanout "all" and
  one batch (P = 1 inside the P = 2 launch), counted == predicted sample and fetch bytes, P-invariance, bulk
  sampling and prefetch bitwise.
"""

import pytest
from datasets_for_tests import cora, random_directed, write
from mpirun import run_case

from algorithms.policies import PipeRule, parse_staleness


@pytest.fixture(scope="session")
def parity_shards(tmp_path_factory) -> list[str]:
    """train_parity.py's datasets: 12 random parts, so every P in 1..4 and c = 2 merge parts."""
    root = tmp_path_factory.mktemp("parity")
    return [str(write(random_directed(), root / "random")), str(write(cora(), root / "cora"))]


ALL = "spmm,parity,static,pipe,gat,policy,minibatch"


# One launch per (P, c): every check this launch's P and c can run (policy_cases.py and minibatch_cases.py are
# written for c = 1; P = 1 parity runs alone in tests/mpi/test_train.py, P = 1 mini-batch inside P = 2). At four
# ranks, c = 2 runs the SpMM, parity and GAT checks (as four ranks), so c = 1 runs only what c = 2 cannot: the
# policies and mini-batch (the slow lane).
@pytest.mark.parametrize("ranks,replication,sections,gat_policies", [
    (2, 1, ALL, False), (3, 1, ALL, True), (4, 2, "spmm,parity,static,pipe,gat", True),
    pytest.param(4, 1, "policy,minibatch", False, marks=pytest.mark.slow)])
def test_training_cases_equal_their_references(parity_shards: list[str], ranks: int, replication: int, sections: str,
                                               gat_policies: bool) -> None:
    extra = ["--gat-policies"] if gat_policies else []
    result = run_case(ranks, "training_cases.py", "--replication", str(replication), "--sections", sections, *extra,
                      "--parity", *parity_shards, timeout=500)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks pass" in result.stdout, result.stdout + result.stderr
    if "spmm" in sections and "parity" in sections:  # the counts come from the plan list
        assert "(96 SpMM cases per rank, 12 parity runs," in result.stdout, result.stdout
    if "minibatch" in sections:  # the mini-batch cases say what they checked
        assert f"BYTES P={ranks}" in result.stdout and "mismatches=0" in result.stdout, result.stdout
        assert f"EXACT P={ranks}" in result.stdout and (ranks != 2 or "EXACT P=1" in result.stdout), result.stdout


def test_pipe_specs_are_parsed_and_checked() -> None:
    assert parse_staleness("pipe:tau=2,gamma=0.95") == PipeRule(2, 0.95)
    assert parse_staleness("pipe:tau=1") == PipeRule(1, 0.0)
    with pytest.raises(ValueError, match="tau must be >= 0"):
        parse_staleness("pipe:tau=-1")
    with pytest.raises(ValueError, match=r"gamma must lie in \[0, 1\)"):
        parse_staleness("pipe:tau=1,gamma=1")
    with pytest.raises(ValueError, match="'1.5' is not a int"):
        parse_staleness("pipe:tau=1.5")
