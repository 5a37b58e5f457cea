"""`sparse-dist prepare rmat` end to end: a dataset `train` accepts, its refusals, and a study's rmat dataset."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from mpirun import BIN, run_mpi

from runners.study.spec import StudyError, load_study
from runners.sweep_cmd import prepare_command

SPARSE_DIST = str(BIN / "sparse-dist")


def _prepare(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPARSE_DIST, "prepare", "rmat", *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_prepare_rmat_writes_a_dataset_two_ranks_train_on(tmp_path: Path) -> None:
    out = tmp_path / "rmat"
    result = _prepare("--scale", "10", "--features", "16", "--classes", "4", "--parts", "2", "--seed", "3",
                      "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert "isolated vertices" in result.stdout and "R-MAT expects" in result.stdout
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_nodes"] == 1024 and meta["num_classes"] == 4 and meta["feature_dim"] == 16
    assert meta["feature_norm"] == "none" and meta["generator"]["scale"] == 10
    assert meta["generator"]["isolated_vertices"] == "kept" and meta["generator"]["isolated"] > 0
    run = run_mpi(2, [SPARSE_DIST, "train", "--data", str(out), "--epochs", "2"], timeout=180)
    assert run.returncode == 0, run.stderr
    assert "final test accuracy" in run.stdout

    dropped = _prepare("--scale", "10", "--features", "16", "--classes", "4", "--parts", "2", "--seed", "3",
                       "--isolated", "drop", "--out", str(tmp_path / "dropped"))
    assert dropped.returncode == 0, dropped.stderr
    smaller = json.loads((tmp_path / "dropped" / "meta.json").read_text())
    assert smaller["num_nodes"] == 1024 - meta["generator"]["isolated"] and smaller["num_edges"] == meta["num_edges"]


@pytest.mark.parametrize("argv,said", [
    ((), "prepare rmat needs --scale S"),
    (("--scale", "4", "--abcd", "0.5,0.2,0.2,0.2"), "--abcd 0.5,0.2,0.2,0.2: expected four probabilities"),
    (("--scale", "4", "--abcd", "a,b"), "--abcd a,b: expected four probabilities"),
    (("--scale", "33"), "argument --scale: must be an integer >= 1 and <= 32, got 33"),
    (("--scale", "4", "--isolated", "some"), "argument --isolated: invalid choice: 'some'"),
])
def test_a_mistake_is_one_sentence_and_status_2(tmp_path: Path, argv: tuple[str, ...], said: str) -> None:
    result = _prepare(*argv, "--out", str(tmp_path / "never"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("sparse-dist prepare: error: ") and said in lines[0], result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "never").exists()


STUDY = """
[study]
name = "r"
output = "out"
ranks = [1, 2]
plans = ["p2p"]
policies = ["exact"]
epochs = 2

[[dataset]]
name = "graph500"
rmat = { scale = 12, edge_factor = 8, features = 32, classes = 4 }
partitioner = "block"
"""


def test_a_study_prepares_its_rmat_dataset_with_prepare_rmat(tmp_path: Path) -> None:
    (tmp_path / "study.toml").write_text(STUDY)
    study = load_study(tmp_path / "study.toml")
    runs, _ = study.runs()
    assert {run.data_name for run in runs} == {"graph500"} and {run.nodes for run in runs} == {None}
    command = prepare_command(study, runs[0])
    assert command[command.index("prepare") + 1] == "rmat"
    assert command[-4:] == ["--scale=12", "--edge-factor=8", "--features=32", "--classes=4"]
    assert command[command.index("--parts") + 1] == "2" and "block" in command


@pytest.mark.parametrize("table,said", [
    ("rmat = { edge_factor = 8 }", "rmat.scale: expected the R-MAT scale"),
    ("rmat = { scale = 40 }", "rmat.scale: expected an integer in [1, 32]"),
    ("rmat = { scale = 10, degree = 3 }", "unknown field(s) ['degree']"),
    ('rmat = { scale = "ten" }', "rmat.scale: expected an integer"),
    ("rmat = { scale = 10 }\nsynthetic = { nodes = 100 }", "exactly one of"),
])
def test_a_wrong_rmat_table_is_refused_naming_the_field(tmp_path: Path, table: str, said: str) -> None:
    text = STUDY.replace("rmat = { scale = 12, edge_factor = 8, features = 32, classes = 4 }", table)
    (tmp_path / "study.toml").write_text(text)
    with pytest.raises(StudyError, match=None) as error:
        load_study(tmp_path / "study.toml")
    assert said in str(error.value)
