"""Which policies compose (docs/guide/policies.md#which-policies-compose): every combination of sampling,
staleness, compression, plan and 1.5D replication that ``train`` refuses is refused while the command line is
checked, before MPI starts, in one sentence said once that names why (and what to use instead), exit status 2;
and a few allowed triples that no other test trains end to end run under mpiexec (P = 2, Cora, 2 epochs), end 0,
write every epoch with a finite loss, and are watched by the accuracy guard."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from datasets_for_tests import cora, write
from mpirun import BIN, run_mpi
from refusals import refused

SPARSE_DIST = str(BIN / "sparse-dist")

# (flags, a phrase of the reason): one per refused row of the table, some with compression beside them, which
# changes no outcome
REFUSED = [
    pytest.param(["--plan", "p2p", "--stale", "sancus-e:eps=1"],
                 "staleness policies (cached historical blocks) need a broadcast plan: use dense-bcast or sparse-bcast",
                 id="sancus-e on p2p"),
    pytest.param(["--plan", "p2p", "--stale", "sancus-h:eps=0.02", "--compress", "int8,feedback"],
                 "need a broadcast plan", id="sancus-h int8 on p2p"),
    pytest.param(["--plan", "cover", "--stale", "sancus-h:eps=0.02", "--compress", "fp16"],
                 "need a broadcast plan: use dense-bcast or sparse-bcast (pipe composes with cover)",
                 id="sancus-h fp16 on cover"),
    pytest.param(["--plan", "dense-bcast", "--sample", "bns:keep=0.1"],
                 "dense-bcast sends every row of H_j by definition", id="bns on dense-bcast"),
    pytest.param(["--plan", "dense-bcast", "--sample", "bns:keep=0.1", "--stale", "pipe:tau=1", "--compress", "bf16"],
                 "dense-bcast sends every row of H_j by definition", id="bns pipe bf16 on dense-bcast"),
    pytest.param(["--plan", "cover", "--sample", "bns:keep=0.1", "--stale", "pipe:tau=1"],
                 "the cover plan pre-aggregates rows over several columns at their owner: use --plan p2p or "
                 "sparse-bcast to sample", id="bns pipe on cover"),
    pytest.param(["--plan", "sparse-bcast", "--sample", "bns:keep=0.1", "--stale", "pipe:tau=1,gamma=0.95"],
                 "gamma smooths each boundary row over consecutive messages; with a sampling policy rows arrive in "
                 "some epochs only", id="bns pipe-gamma on sparse-bcast"),
    pytest.param(["--plan", "p2p", "--sample", "bns:keep=0.1", "--stale", "sancus-e:eps=1"],
                 "need a broadcast plan: use dense-bcast or sparse-bcast; to sample and cache blocks together use "
                 "--plan sparse-bcast", id="bns sancus-e on p2p"),
    pytest.param(["--plan", "dense-bcast", "--sample", "bns:keep=0.1", "--stale", "sancus-h:eps=0.02"],
                 "to sample and cache blocks together use --plan sparse-bcast", id="bns sancus-h on dense-bcast"),
    pytest.param(["--plan", "cover", "--sample", "bns:keep=0.1", "--stale", "sancus-e:eps=1"],
                 "to sample and cache blocks together use --plan sparse-bcast", id="bns sancus-e on cover"),
    pytest.param(["--plan", "sparse-bcast", "--sample", "psc:budget=0.1"],
                 "per-receiver sampling (psc, dgs: each receiver's own edges or rows) needs the p2p plan",
                 id="psc on sparse-bcast"),
    pytest.param(["--plan", "sparse-bcast", "--sample", "dgs:nodes=0.5", "--stale", "pipe:tau=1"],
                 "per-receiver sampling (psc, dgs: each receiver's own edges or rows) needs the p2p plan",
                 id="dgs pipe on sparse-bcast"),
    pytest.param(["--plan", "dense-bcast", "--sample", "psc:budget=0.1", "--compress", "int8,feedback"],
                 "dense-bcast sends every row of H_j by definition", id="psc int8 on dense-bcast"),
    pytest.param(["--plan", "cover", "--sample", "dgs:nodes=0.5"],
                 "the cover plan pre-aggregates rows", id="dgs on cover"),
    pytest.param(["--plan", "p2p", "--sample", "psc:budget=0.1", "--stale", "sancus-e:eps=1"],
                 "per-receiver sampling (psc) needs --plan p2p and cached historical blocks (sancus-e) need --plan "
                 "dense-bcast or sparse-bcast, so no plan carries both", id="psc sancus-e on p2p"),
    pytest.param(["--plan", "sparse-bcast", "--sample", "dgs:nodes=0.5", "--stale", "sancus-h:eps=0.02"],
                 "per-receiver sampling (dgs) needs --plan p2p and cached historical blocks (sancus-h) need --plan "
                 "dense-bcast or sparse-bcast, so no plan carries both", id="dgs sancus-h on sparse-bcast"),
    pytest.param(["--plan", "p2p", "--sample", "psc:budget=0.1", "--replication", "2"],
                 "--sample psc:budget=0.1 samples each receiver's own edges: it needs --replication 1 (1D)",
                 id="psc at c=2"),
    pytest.param(["--plan", "p2p", "--sample", "dgs:nodes=0.5", "--stale", "pipe:tau=1", "--compress", "fp16",
                  "--replication", "2"],
                 "--sample dgs:nodes=0.5 samples each receiver's own edges: it needs --replication 1 (1D)",
                 id="dgs pipe fp16 at c=2"),
]


@pytest.mark.parametrize("flags, reason", REFUSED)
def test_a_combination_that_cannot_run_is_one_sentence_before_mpi(flags: list[str], reason: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """In this process, as every rank checks the command line before MPI starts (the dataset is never read)."""
    said = refused(["train", "--data", "/no/such/dataset", *flags], capsys)
    sentence = said.splitlines()[0]
    assert sentence.startswith("sparse-dist train: error: ") and ". " not in sentence, sentence
    assert reason in sentence, sentence


@pytest.fixture(scope="module")
def cora_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(cora(), tmp_path_factory.mktemp("compositions") / "cora", parts=2, partitioner="block")


# allowed triples (sampling, staleness, compression) whose combination no other test trains end to end; the
# first skips every broadcast of epoch 2, whose gradients then go back for the cached sampled rows with error
# feedback (a traceback before the cache kept the sample's positions: sparse_dist/cached.py)
ALLOWED = [
    pytest.param(["--plan", "sparse-bcast", "--sample", "bns:keep=0.1", "--stale", "sancus-e:eps=1",
                  "--compress", "int8,feedback"], id="bns sancus-e int8 sparse-bcast"),
    pytest.param(["--plan", "p2p", "--sample", "psc:budget=0.1", "--stale", "pipe:tau=1", "--compress", "bf16"],
                 id="psc pipe bf16 p2p"),
    pytest.param(["--plan", "p2p", "--sample", "dgs:nodes=0.5", "--stale", "pipe:tau=1",
                  "--compress", "int8,feedback"], id="dgs pipe int8 p2p"),
]


@pytest.mark.slow
@pytest.mark.parametrize("flags", ALLOWED)
def test_an_allowed_triple_trains_guarded(cora_shards: Path, tmp_path: Path, flags: list[str]) -> None:
    out = tmp_path / "run.jsonl"
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(cora_shards), "--epochs", "2", "--print-every", "1000",
                         "--threads", "1", "--out", str(out), *flags], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    epochs = [r for r in records if r["type"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2], records
    assert all(math.isfinite(r["loss"]) for r in epochs), [r["loss"] for r in epochs]
    if "sancus-e:eps=1" in flags:  # epoch 2 reuses epoch 1's blocks: no owner broadcasts
        assert [b["active"] for b in epochs[1]["broadcasts"]] == [[], []], epochs[1]["broadcasts"]
    final = records[-1]
    assert final["type"] == "final" and final["guard"]["on"], final.get("guard")
