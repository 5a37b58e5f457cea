"""Every numeric flag is checked while the command line is parsed, with the accepted range in the message;
per-model defaults; ``--version``; outputs that would overwrite inputs are refused before MPI starts."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from mpirun import BIN, ROOT, run_mpi
from refusals import refused as _refused

from algorithms.policies import AxisSpec
from algorithms.static_input import receiver_side
from runners import cli, train_cmd
from runners.argtypes import launcher_world_size
from runners.model_defaults import MODEL_DEFAULTS

SPARSE_DIST = str(BIN / "sparse-dist")


TRAIN = ["train", "--data", "/no/such/dataset"]  # the flag must be refused before the path is looked at


@pytest.mark.parametrize("flag,value,sentence", [
    ("--replication", "0", "argument --replication: must be an integer >= 1 and <= 1024, got 0"),
    ("--hidden", "0", "argument --hidden: must be an integer >= 1 and <= 65536, got 0"),
    ("--lr", "-1", "argument --lr: must be a finite number > 0 and <= 10, got -1"),
    ("--lr", "nan", "argument --lr: must be a finite number > 0 and <= 10, got nan"),
    ("--lr", "inf", "argument --lr: must be a finite number > 0 and <= 10, got inf"),
    ("--dropout", "1.0", "argument --dropout: must be a finite number >= 0 and < 1, got 1"),
    ("--attention-dropout", "-0.1", "argument --attention-dropout: must be a finite number >= 0 and < 1, got -0.1"),
    ("--threads", "-2", "argument --threads: must be an integer >= 0, got -2"),
    ("--eval-every", "0", "argument --eval-every: must be an integer >= 1 and <= 10000000, got 0"),
    ("--print-every", "0", "argument --print-every: must be an integer >= 1 and <= 10000000, got 0"),
    ("--epochs", "-1", "argument --epochs: must be an integer >= 1 and <= 10000000, got -1"),
    ("--epochs", "0", "argument --epochs: must be an integer >= 1 and <= 10000000, got 0"),
    ("--layers", "0", "argument --layers: must be an integer >= 1 and <= 128, got 0"),
    ("--weight-decay", "-1", "argument --weight-decay: must be a finite number >= 0 and <= 10, got -1"),
    ("--clip", "-1", "argument --clip: must be a finite number >= 0 and <= 1e+06, got -1"),
    ("--seed", "-1", "argument --seed: must be an integer >= 0 and <= 9223372036854775807, got -1"),
    ("--audit-every", "-1", "argument --audit-every: must be an integer >= 0 and <= 10000000, got -1"),
    ("--heads", "0", "argument --heads: must be an integer >= 1 and <= 64, got 0"),
    ("--hidden", "16.5", "argument --hidden: must be an integer >= 1 and <= 65536, got '16.5'"),
])
def test_a_bad_train_number_is_refused_with_its_range(flag: str, value: str, sentence: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    said = _refused([*TRAIN, flag, value], capsys)
    assert f"sparse-dist train: error: {sentence}\n" in said, said


@pytest.mark.parametrize("argv,sentence", [
    (["prepare", "synthetic", "--out", "/no/such/out", "--parts", "0"], "argument --parts: must be an integer >= 1 and <= 65536, got 0"),
    (["prepare", "synthetic", "--out", "/no/such/out", "--nodes", "0"], "argument --nodes: must be an integer >= 1 and <= 10000000000, got 0"),
    (["prepare", "synthetic", "--out", "/no/such/out", "--classes", "1"], "argument --classes: must be an integer >= 2 and <= 100000, got 1"),
    (["prepare", "synthetic", "--out", "/no/such/out", "--seed", "-3"], "argument --seed: must be an integer >= 0"),
    (["prepare", "edgelist", "--out", "/no/such/out", "--num-classes", "0"],
     "argument --num-classes: must be an integer >= 1 and <= 100000, got 0"),
    (["bench", "spmm", "--repeats", "0"], "argument --repeats: must be an integer >= 1 and <= 10000, got 0"),
    (["bench", "spmm", "--mixing", "1.5"], "argument --mixing: must be a finite number >= 0 and <= 1, got 1.5"),
    (["bench", "spmm", "--nodes", "-5"], "argument --nodes: must be an integer >= 1 and <= 1000000000, got -5"),
    (["bench", "network", "--repeats", "0"], "argument --repeats: must be an integer >= 1 and <= 100000, got 0"),
    (["bench", "network", "--max-bytes", "4"], "argument --max-bytes: must be an integer >= 2097152 and <= 2147483647, got 4"),
    (["bench", "policies", "--data", "d", "--epochs", "0"], "argument --epochs: must be an integer >= 1 and <= 10000000, got 0"),
    (["bench", "policies", "--data", "d", "--dropout", "1"], "argument --dropout: must be a finite number >= 0 and < 1"),
    (["bench", "policies", "--data", "d", "--sancus-h-eps", "nan"],
     "argument --sancus-h-eps: must be a finite number >= 0 and <= 1e+06, got nan"),
    (["bench", "policies", "--data", "d", "--psc-budget", "0"],
     "argument --psc-budget: must be a finite number > 0 and <= 1, got 0"),
    (["bench", "train", "--synthetic", "100", "--seed", "-1"], "argument --seed: must be an integer >= 0"),
    (["bench", "train", "--synthetic", "100", "--warmup", "-1"], "argument --warmup: must be an integer >= 0 and <= 1000000, got -1"),
    (["model", "predict", "--calibrate-from", "x", "--ranks", "64,0"],
     "argument --ranks: must be comma-separated integers >= 1, e.g. 64,256; got '64,0'"),
    (["model", "predict", "--calibrate-from", "x", "--cut", "2"], "argument --cut: must be a finite number >= 0 and <= 1, got 2"),
    (["model", "predict", "--calibrate-from", "x", "--beta-gbs", "0"], "argument --beta-gbs: must be a finite number > 0 and <= 10000, got 0"),
    (["model", "predict", "--calibrate-from", "x", "--plans", "p2p,allgather"], "argument --plans: unknown plan(s) ['allgather']"),
    (["model", "compare", "results", "--ranks-per-node", "0"], "argument --ranks-per-node: must be an integer >= 1 and <= 100000, got 0"),
])
def test_bad_numbers_of_the_other_commands_are_refused(argv: list[str], sentence: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    said = _refused(argv, capsys)
    assert sentence in said, said


def test_replication_must_divide_the_launchers_world_size(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PMI_SIZE", "4")
    assert launcher_world_size() == 4
    said = _refused([*TRAIN, "--replication", "3"], capsys)
    assert ("sparse-dist train: error: argument --replication: must divide the number of ranks P=4, got 3 "
            "(divisors of 4: 1, 2, 4)") in said
    monkeypatch.delenv("PMI_SIZE")
    monkeypatch.setenv("PMI_RANK", "0")  # a rank but no size: an unknown launcher, checked once MPI started
    assert launcher_world_size() is None
    monkeypatch.setenv("SLURM_NTASKS", "8")  # srun's step of 2 tasks inside a job of 8
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    assert launcher_world_size() == 2


def test_replication_3_at_p4_is_said_once_under_mpiexec() -> None:
    result = run_mpi(4, [SPARSE_DIST, "train", "--data", "/no/such/dataset", "--replication", "3"], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("argument --replication: must divide the number of ranks P=4, got 3") == 1
    assert "Traceback" not in result.stderr and "no/such/dataset" not in result.stderr


def test_replication_is_agreed_after_mpi_starts_where_the_launcher_gave_no_size() -> None:
    """SLURM_PROCID without SLURM_NTASKS: P is unknown before MPI starts (a singleton here, P = 1)."""
    env = {key: value for key, value in os.environ.items() if "PMI" not in key and "SLURM" not in key}
    result = subprocess.run([SPARSE_DIST, "train", "--data", "/no/such/dataset", "--replication", "2"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env=dict(env, SLURM_PROCID="0"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("sparse-dist train: error: argument --replication: must divide the number of "
                               "ranks P=1, got 2") == 1, result.stderr
    assert "no/such/dataset" not in result.stderr and "Traceback" not in result.stderr


def test_version_is_the_package_metadata_version() -> None:
    result = subprocess.run([SPARSE_DIST, "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"sparse-dist {version('sparse-dist')}\n"


OWNED_ELSEWHERE = {"--checkpoint", "--checkpoint-every", "--resume"}  # their help is the checkpoint work's


def test_every_train_flag_states_its_default() -> None:
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    flags = [action for action in parser._actions if action.option_strings and action.dest != "help"]
    undocumented = [action.option_strings[0] for action in flags
                    if action.option_strings[0] not in OWNED_ELSEWHERE and "default" not in (action.help or "")
                    and "(required)" not in (action.help or "")]
    assert undocumented == []
    assert len(flags) > 30


def _train_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    args = parser.parse_args(["--data", "d", *argv])
    assert train_cmd.check_arguments(args) is None
    return args


def test_each_model_trains_with_its_papers_defaults_unless_a_flag_says_otherwise() -> None:
    gat = train_cmd._config(_train_args("--model", "gat")).record()
    assert {key: gat[key] for key in MODEL_DEFAULTS["gat"]} == {
        "hidden": 8, "heads": 8, "output_heads": 1, "dropout": 0.6, "attention_dropout": 0.6, "lr": 0.005,
        "weight_decay": 5e-4, "weight_decay_scope": "all"}
    gcn = train_cmd._config(_train_args()).record()
    assert (gcn["hidden"], gcn["dropout"], gcn["lr"], gcn["weight_decay"], gcn["weight_decay_scope"]) == \
        (16, 0.5, 0.01, 5e-4, "first")
    assert (gcn["heads"], gcn["output_heads"], gcn["attention_dropout"]) == (1, 1, 0.0)
    sage = train_cmd._config(_train_args("--model", "sage")).record()
    assert (sage["hidden"], sage["dropout"], sage["lr"], sage["weight_decay"], sage["weight_decay_scope"]) == \
        (16, 0.5, 0.01, 5e-4, "first")
    explicit = train_cmd._config(_train_args("--model", "gat", "--lr", "0.01", "--heads", "2", "--dropout", "0",
                                             "--weight-decay-scope", "first")).record()
    assert (explicit["lr"], explicit["heads"], explicit["dropout"], explicit["weight_decay_scope"]) == \
        (0.01, 2, 0.0, "first")
    assert explicit["hidden"] == 8 and explicit["attention_dropout"] == 0.6


def test_train_help_states_the_per_model_defaults() -> None:
    result = subprocess.run([SPARSE_DIST, "train", "--help"], capture_output=True, text=True, timeout=120)
    text = " ".join(result.stdout.split())
    for needle in ("(default: per layer kind: gcn 16, sage 16, gat 8)", "(default: per layer kind: gcn 0.01, sage 0.01, gat 0.005)",
                   "(default: gat 8; 1 for the others)", "(default: per layer kind: gcn first, sage first, gat all)",
                   "(default: per layer kind: gcn 0.5, sage 0.5, gat 0.6)"):
        assert needle in text, needle


def test_dropout_side_help_says_what_auto_does() -> None:
    """auto is receiver-side exactly under sancus-h with dropout on, as the help now says."""
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    text = next(a.help for a in parser._actions if a.dest == "dropout_side")
    assert "receiver only under --stale sancus-h" in text and "owner for every other policy" in text
    for stale, receiver in (("sancus-h:eps=0.02", True), ("sancus-e:eps=1", False), ("sancus-a:eps=1", False),
                            ("pipe:tau=1", False), ("none", False)):
        assert receiver_side("auto", 0.5, AxisSpec.parse("stale", stale)) is receiver, stale
        assert receiver_side("auto", 0.0, AxisSpec.parse("stale", stale)) is False
    assert receiver_side("receiver", 0.0, AxisSpec.parse("stale", "none")) is False  # "with --dropout 0 is owner"


# ---------------------------------------------------------------- outputs never overwrite inputs
def _overlaps(tmp_path: Path, *argv: str) -> list[str]:
    parser = argparse.ArgumentParser()
    train_cmd.add_arguments(parser)
    return train_cmd.overlap_problems(parser.parse_args(["--data", str(tmp_path / "cora"), *argv]))


def test_an_output_may_not_lie_inside_an_input_or_on_another_output(tmp_path: Path) -> None:
    (tmp_path / "cora").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "cora")
    cora = tmp_path / "cora"
    assert _overlaps(tmp_path, "--out", str(cora / "meta.json")) == [
        f"--out {cora / 'meta.json'} lies inside the --data dataset directory {cora}; writing it there would "
        f"damage the dataset, so choose a results file outside it"]
    assert _overlaps(tmp_path, "--out", str(cora))[0].startswith(f"--out {cora} is the --data dataset directory")
    assert len(_overlaps(tmp_path, "--out", str(tmp_path / "link" / "r.jsonl"))) == 1  # resolved through the link
    assert "--checkpoint" in _overlaps(tmp_path, "--checkpoint", str(cora / "run.ckpt"))[0]
    assert _overlaps(tmp_path, "--out", str(tmp_path / "x"), "--checkpoint", str(tmp_path / "x")) == [
        f"--out {tmp_path / 'x'} is the --checkpoint path {tmp_path / 'x'}, whose files ({tmp_path / 'x'}*) belong "
        f"to the checkpoint; choose another results file"]
    # whatever files a checkpoint is made of, they start with its path
    assert len(_overlaps(tmp_path, "--out", str(tmp_path / "run.ckpt.rank00001"), "--checkpoint",
                         str(tmp_path / "run.ckpt"), "--resume")) == 1
    assert len(_overlaps(tmp_path, "--out", str(tmp_path / "run.ckpt.e000010" / "r"), "--checkpoint",
                         str(tmp_path / "run.ckpt"))) == 1
    assert _overlaps(tmp_path, "--out", str(tmp_path / "run.jsonl"), "--checkpoint", str(tmp_path / "run.ckpt")) == []
    assert _overlaps(tmp_path, "--out", str(tmp_path / "cora-results.jsonl")) == []  # a sibling, not inside


@pytest.mark.slow
def test_out_inside_the_dataset_is_refused_before_mpi_and_the_dataset_survives(tmp_path: Path) -> None:
    data = tmp_path / "cora"
    prepared = subprocess.run([SPARSE_DIST, "prepare", "planetoid", "--out", str(data), "--parts", "2"],
                              capture_output=True, text=True, timeout=120)
    assert prepared.returncode == 0, prepared.stderr
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(data), "--epochs", "1", "--out",
                         str(data / "meta.json")], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count(f"--out {data / 'meta.json'} lies inside the --data dataset directory") == 1
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before
    same = run_mpi(2, [SPARSE_DIST, "train", "--data", str(data), "--epochs", "1", "--out", str(tmp_path / "x"),
                       "--checkpoint", str(tmp_path / "x"), "--checkpoint-every", "1"], timeout=120)
    assert same.returncode == 2 and same.stderr.count("is the --checkpoint path") == 1, same.stderr
    assert not (tmp_path / "x").exists()


def test_sys_executable_runs_the_same_cli() -> None:
    """``python -m runners.cli`` (what sweep launches) knows --version too."""
    result = subprocess.run([sys.executable, "-m", "runners.cli", "--version"], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 0 and result.stdout.startswith("sparse-dist "), result.stderr


@pytest.mark.parametrize("argv, command", [
    (["--log", "DEBUG", "plot", "x"], "plot"), (["--log-level=INFO", "emulate", "--", "true"], "emulate"),
    (["--gpu-aware", "off", "--debug", "train", "--data", "d"], "train"), (["model", "compare"], "cost"),
    (["--help"], None)])
def test_the_named_command_is_found_past_the_global_flags(argv: list[str], command: str | None) -> None:
    assert cli._named_command(argv) == command


def test_emulate_and_plot_parse_without_importing_torch() -> None:
    """Only the named command's module is imported: ``emulate`` (which wraps every emulated run) and ``plot``
    start in a fraction of a second; ``train`` still gets its whole parser."""
    probe = ("import sys\nfrom runners.cli import _parser\n"
             "_parser(['emulate', '--nodes', '2', '--', 'true']).parse_args(['emulate', '--nodes', '2', '--', 'true'])\n"
             "_parser(['plot', 'x']).parse_args(['plot', 'x'])\n"
             "print('torch' in sys.modules)\n"
             "args = _parser(['train', '--data', 'd']).parse_args(['train', '--data', 'd', '--epochs', '3'])\n"
             "print('torch' in sys.modules, args.epochs)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True", "3"], result.stdout
