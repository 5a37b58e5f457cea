"""Renamed flags and commands (docs/reference/names.md): the new name works, the old one still works this
release, parses to the same values and says the new name in one line, once, from launcher rank 0 only."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from runners import argtypes, cli, train_cmd
from runners.bench import train as bench_train
from runners.study.train_table import check_train_table

NOTICE = "warning: --model is deprecated, use --layer-kind (the old name goes in the next release)"


@pytest.fixture(autouse=True)
def fresh_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with no notice given yet (they are said once per process), as launcher rank 0."""
    monkeypatch.setattr(argtypes, "_NOTED", set())
    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)


def _parser(add_arguments: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparse-dist train")
    add_arguments(parser)  # type: ignore[operator]
    return parser


@pytest.mark.parametrize("add_arguments", [train_cmd.add_arguments, bench_train.add_arguments])
def test_the_layer_kind_flag_and_its_old_name_parse_alike(add_arguments: object,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser(add_arguments)
    new = parser.parse_args(["--data", "d", "--layer-kind", "gat"])
    assert capsys.readouterr().err == ""
    old = parser.parse_args(["--data", "d", "--model", "gat"])
    assert vars(old) == vars(new) and new.model == "gat"
    assert capsys.readouterr().err == f"sparse-dist train: {NOTICE}\n"
    parser.parse_args(["--data", "d", "--model", "sage"])  # said once per process
    assert capsys.readouterr().err == ""
    assert parser.parse_args(["--data", "d"]).model == "gcn"
    with pytest.raises(SystemExit):
        parser.parse_args(["--data", "d", "--model", "gcnn"])  # the old name checks its value as the new one
    assert "argument --model: invalid choice: 'gcnn'" in capsys.readouterr().err


def test_only_launcher_rank_0_says_the_notice(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PMI_RANK", "3")
    assert _parser(train_cmd.add_arguments).parse_args(["--data", "d", "--model", "sage"]).model == "sage"
    assert capsys.readouterr().err == ""


def test_a_study_may_name_the_layer_kind_either_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check_train_table({"layer-kind": "sage", "hidden": 8}, []) is None
    assert capsys.readouterr().err == ""
    assert check_train_table({"model": "sage", "hidden": 8}, []) is None
    assert capsys.readouterr().err.count(NOTICE) == 1


def test_the_cost_command_answers_to_its_old_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both names run the same command (here it refuses a directory without a study's results, exit 2)."""
    said = {}
    for name in ("cost", "model"):
        with pytest.raises(SystemExit) as exit_info:
            raise SystemExit(cli.main([name, "compare", str(tmp_path)]))
        assert exit_info.value.code == 2
        said[name] = capsys.readouterr().err
    assert said["cost"] == (f"sparse-dist cost: error: {tmp_path}/results.csv: no such results table "
                            f"(run `sparse-dist sweep` first)\n")
    assert said["model"] == ("sparse-dist: warning: sparse-dist model is deprecated, use sparse-dist cost "
                             "(the old name goes in the next release)\n" + said["cost"])


def test_the_keep_probability_and_its_old_name_build_the_same_sampler() -> None:
    from algorithms.policies import AxisSpec, BnsSampler

    assert AxisSpec.parse("sample", "bns:keep=0.1,side=owner").build(seed=4) == BnsSampler(0.1, "owner", 4)
    with pytest.warns(FutureWarning, match=r"bns:p= is deprecated, use bns:keep="):
        assert AxisSpec.parse("sample", "bns:p=0.1,side=owner").build(seed=4) == BnsSampler(0.1, "owner", 4)
    with pytest.raises(ValueError, match=r"give keep=K only \(p= is its old name\)"):
        AxisSpec.parse("sample", "bns:keep=0.1,p=0.1")
    with pytest.raises(ValueError, match="bns: needs keep=K"):
        AxisSpec.parse("sample", "bns:side=owner")
    with pytest.raises(ValueError, match=r"bns: keep must lie in \[0, 1\], got 1.5"):
        AxisSpec.parse("sample", "bns:keep=1.5")


def test_the_command_says_a_policy_parameters_old_name_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The library warns (FutureWarning); the command prints it as one line, then goes on (here to a flag error)."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["cost", "predict", "--policies", "exact,bns:p=0.1", "--cut", "2"])
    assert exit_info.value.code == 2
    said = capsys.readouterr().err.splitlines()
    assert said[0] == ("sparse-dist: warning: bns:p= is deprecated, use bns:keep= (the old name goes in the next "
                       "release)")
    assert said[1].startswith("sparse-dist cost predict: error: argument --cut:") and len(said) == 3, said
