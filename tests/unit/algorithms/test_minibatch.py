"""Mini-batch pieces without MPI: fanout parsing, owner-side row sampling (counts, scale, keyed randomness,
unbiasedness by averaging), the inclusion estimate of the feature cache, and flag refusals before MPI."""

from __future__ import annotations

import argparse
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from datasets_for_tests import random_directed, write

from algorithms.checkpoint import CheckpointError, SetWriter
from algorithms.minibatch import MinibatchConfig, parse_fanouts
from runners import cli, train_cmd
from runners.data.shards import read_meta
from sparse_dist.comm import world
from sparse_dist.fetch import inclusion_estimate
from sparse_dist.sampling import assemble_block, sample_rows, sampling_key


def graph(n: int = 40, density: float = 0.2, seed: int = 3) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    a = sp.random(n, n, density=density, format="csr", random_state=rng)
    a.data = rng.random(a.nnz) + 0.5
    return a


def test_fanouts_parse_and_refuse() -> None:
    assert parse_fanouts("15,10,5") == (15, 10, 5)
    assert parse_fanouts("all,3") == (None, 3)
    for bad in ("0", "1.5", "x", "3,,2", "-1"):
        with pytest.raises(ValueError, match="integers >= 1 or 'all'"):
            parse_fanouts(bad)


def test_rows_keep_min_of_fanout_and_degree_with_the_unbiased_scale() -> None:
    a = graph()
    rows = np.arange(a.shape[0])
    kept, columns, values = sample_rows(a, 0, rows, 3, sampling_key(0, 0, 0, 0))
    degree = np.diff(a.indptr)
    assert np.array_equal(kept, np.minimum(degree, 3))
    bounds = np.concatenate(([0], np.cumsum(kept)))
    for row in rows:
        mine = columns[bounds[row]:bounds[row + 1]]
        assert len(set(mine.tolist())) == mine.size  # without replacement
        scale = degree[row] / 3 if degree[row] > 3 else 1.0
        np.testing.assert_allclose(values[bounds[row]:bounds[row + 1]], a[row, mine].toarray().ravel() * scale)
    all_kept, all_columns, all_values = sample_rows(a, 0, rows, None, sampling_key(0, 0, 0, 0))
    assert np.array_equal(all_kept, degree) and np.array_equal(all_columns, a.indices)
    assert np.array_equal(all_values, a.data)


def test_a_rows_sample_depends_on_its_key_and_id_only() -> None:
    """Whoever asks, with whatever other rows, a node draws the same sample (so it does not depend on P)."""
    a = graph()
    key = sampling_key(5, 2, 1, 0)
    alone = sample_rows(a, 0, np.array([7]), 2, key)
    among = sample_rows(a, 0, np.array([30, 7, 1]), 2, key)
    offset = among[0][0]
    assert np.array_equal(alone[1], among[1][offset:offset + 2])
    shifted = sample_rows(a[5:], 5, np.array([7]), 2, key)  # another owner's row range holding row 7
    assert np.array_equal(alone[1], shifted[1])
    other = [sample_rows(a, 0, np.array([7]), 2, sampling_key(5, 2, 1, layer))[1].tolist() for layer in range(8)]
    assert len({tuple(c) for c in other}) > 1  # another key draws another sample


def test_sampled_product_is_unbiased() -> None:
    """The mean of the sampled ``A_s H`` over many keys approaches ``A H`` within a few standard errors."""
    a = graph(30, 0.3)
    rows = np.arange(a.shape[0])
    h = np.random.default_rng(1).random((a.shape[0], 4))
    draws = 3000
    products = np.empty((draws, a.shape[0], 4))
    for epoch in range(draws):
        kept, columns, values = sample_rows(a, 0, rows, 2, sampling_key(0, epoch, 0, 0))
        block = assemble_block(rows, kept, columns, values)
        products[epoch] = block.matrix @ h[block.src]
    exact = a @ h
    mean, error = products.mean(axis=0), products.std(axis=0) / np.sqrt(draws)
    assert np.all(np.abs(mean - exact) <= 5 * error + 1e-12)
    assert error.max() > 0  # rows of degree > 2 were sampled, so the check compares something random
    biased = products * 0.95  # a 5% bias is seen
    assert not np.all(np.abs(biased.mean(axis=0) - exact) <= 5 * error + 1e-12)


def test_block_puts_destinations_first() -> None:
    block = assemble_block(np.array([4, 2]), np.array([2, 1]), np.array([9, 2, 4]), np.array([1.0, 2.0, 3.0]))
    assert block.src.tolist() == [4, 2, 9]
    assert block.matrix.toarray().tolist() == [[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]


def test_inclusion_estimate_is_exact_for_one_hop() -> None:
    a = sp.csr_matrix(np.array([[1, 1, 0, 0], [0, 1, 1, 1]], dtype=float), shape=(2, 4))  # rows 0, 1 of 4
    ids, p = inclusion_estimate(a, 0, np.array([0.5, 0.2]), [None])
    got = dict(zip(ids.tolist(), p.tolist()))
    assert got[0] == pytest.approx(0.5) and got[1] == pytest.approx(1 - 0.5 * 0.8)
    assert got[2] == pytest.approx(0.2) and got[3] == pytest.approx(0.2)
    ids, p = inclusion_estimate(a, 0, np.array([0.0, 0.6]), [1])  # row 1 keeps 1 of its 3 edges
    got = dict(zip(ids.tolist(), p.tolist()))
    assert got[2] == pytest.approx(0.2) and got[1] == pytest.approx(0.6) and 0 not in got


TRAIN = ["train", "--data", "/no/such/dataset"]


@pytest.mark.parametrize("extra,sentence", [
    (["--mode", "minibatch", "--model", "gat"], "--mode minibatch trains GCN and SAGE; --model gat"),
    (["--mode", "minibatch", "--fanouts", "10"], "--fanouts gives 1 hop(s) but --layers is 2"),
    (["--mode", "minibatch", "--fanouts", "10,0"], "argument --fanouts: fanouts are integers >= 1 or 'all'"),
    (["--fanouts", "10,10"], "--fanouts need --mode minibatch"),
    (["--mode", "minibatch", "--batch-size", "0"], "argument --batch-size: must be an integer >= 1 and <= 16777216, got 0"),
    (["--mode", "minibatch", "--sample", "bns:p=0.5"], "--mode minibatch exchanges no boundary rows"),
    (["--sample-batches", "4"], "--sample-batches need --mode minibatch"),
    (["--sampler", "numpy"], "--sampler need --mode minibatch"),
    (["--mode", "minibatch", "--sampler", "c"], "argument --sampler: invalid choice: 'c'"),
    (["--mode", "minibatch", "--sample-batches", "0"], "argument --sample-batches: must be an integer >= 1 and <= 1024, got 0"),
])
def test_bad_minibatch_flags_are_refused_before_mpi(extra: list[str], sentence: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(TRAIN + extra)
    assert exit_info.value.code == 2
    said = capsys.readouterr().err
    assert said.count("error:") == 1 and sentence in said, said


MINIBATCH = ["--mode", "minibatch", "--fanouts", "5,5", "--batch-size", "32"]


@pytest.mark.parametrize("flags,sentence", [
    (["--mode", "minibatch", "--fanouts", "5,all", "--batch-size", "32"],
     "fanouts [5, 5] in the checkpoint, [5, 'all'] in this run"),
    (["--mode", "minibatch", "--fanouts", "5,5", "--batch-size", "16"],
     "global_batch_size 32 in the checkpoint, 16 in this run"),
    ([], "mode 'minibatch' in the checkpoint, 'full' in this run"),
])
def test_a_minibatch_checkpoint_resumes_only_with_its_mode_fanouts_and_global_batch(
        tmp_path, flags: list[str], sentence: str) -> None:
    """``open_resume`` (one rank) refuses, in one sentence, a run whose mini-batch fingerprint differs."""
    data = write(random_directed(30), tmp_path / "data", parts=1)
    path = tmp_path / "run.ckpt"

    def args(*given: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        train_cmd.add_arguments(parser)
        namespace = parser.parse_args(["--data", str(data), "--checkpoint", str(path), "--resume", *given])
        assert train_cmd.check_arguments(namespace) is None
        namespace.feature_norm = "row"
        return namespace

    comm = world(gpu_aware="off")
    written = args(*MINIBATCH)
    state = {"config": {**train_cmd._config(written).fingerprint(), **MinibatchConfig((5, 5), 32).fingerprint(1)},
             "epoch": 2, "graph": {"name": read_meta(data)["name"], "nodes": 30}}
    SetWriter(comm, path, replication=1, plan=written.plan).commit(2, state, None)
    resumed = train_cmd.open_resume(comm, written, train_cmd._config(written))
    assert resumed.state["epoch"] == 2  # the same flags resume
    refused_args = args(*flags)
    with pytest.raises(CheckpointError) as refused:
        train_cmd.open_resume(comm, refused_args, train_cmd._config(refused_args))
    said = str(refused.value)
    assert said.startswith(f"--checkpoint {path}: the checkpoint (epoch 2) belongs to another run: ")
    assert sentence in said and "\n" not in said, said


def test_without_numba_auto_falls_back_to_numpy_once_and_numba_is_refused_before_mpi(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """Where the compiled sampler cannot be imported: ``auto`` runs the numpy kernel (said once in the log),
    ``--sampler numba`` is refused in one sentence (exit 2)."""
    from sparse_dist import sampling

    monkeypatch.setitem(sys.modules, "sparse_dist.sampling_compiled", None)  # as if numba were missing
    monkeypatch.setattr(sampling, "_fallback_said", [])
    with caplog.at_level("WARNING", logger="sparse_dist"):
        assert sampling.resolve_sampler("auto") == sampling.resolve_sampler("auto") == "numpy"
    said = [r.getMessage() for r in caplog.records if "numpy reference kernel" in r.getMessage()]
    assert len(said) == 1 and "numba is not importable" in said[0], said
    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(TRAIN + ["--mode", "minibatch", "--sampler", "numba"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "--sampler numba: numba is not importable" in err, err
    assert "install numba or use --sampler numpy" in err
