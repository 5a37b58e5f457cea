"""The accuracy guard under real mpiexec (tests/mpi/cases/guard_cases.py, one launch at P = 4): it rescues a
pipelined run that falls, decides the same at P = 1, 2, 4 where the signals are the same, resumes bitwise,
and ``--guard off`` changes nothing; its bias signal (tests/mpi/cases/bias_cases.py, P = 2) catches a policy
that never falls but stays low, which the first signal alone does not."""

import pytest
import json

from datasets_for_tests import across_halves, cora, write
from mpirun import run_case


@pytest.mark.slow
def test_guard_rescues_a_falling_policy_and_decides_alike_everywhere(tmp_path) -> None:
    data = write(cora(), tmp_path / "cora", parts=4, partitioner="random")  # 75% of the entries cut
    result = run_case(4, "guard_cases.py", str(data), timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RESCUE P=4" in result.stdout and "SAME P=4,2,1" in result.stdout, result.stdout
    assert "guard cases P=4: all checks pass" in result.stdout, result.stdout + result.stderr


def test_the_bias_signal_catches_a_policy_that_never_falls_and_the_old_rule_does_not(tmp_path) -> None:
    data = write(across_halves(), tmp_path / "halves", parts=2, partitioner="block")
    result = run_case(2, "bias_cases.py", str(data), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CAUGHT" in result.stdout and "INTERVAL" in result.stdout, result.stdout
    assert "bias cases P=2: all checks pass" in result.stdout, result.stdout + result.stderr


@pytest.mark.slow
def test_train_says_each_decision_once_and_records_them(tmp_path) -> None:
    from mpirun import BIN, run_mpi

    data = write(cora(), tmp_path / "cora", parts=4, partitioner="random")
    out = tmp_path / "guarded.jsonl"
    result = run_mpi(4, [str(BIN / "sparse-dist"), "train", "--data", str(data), "--stale", "pipe:tau=1", "--lr", "0.05",
                         "--epochs", "30", "--print-every", "100", "--out", str(out)], timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    said = [line for line in result.stdout.splitlines() if line.startswith("guard: ")]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    decided = [r["guard"] for r in records if r["type"] == "epoch" and "guard" in r]
    final = records[-1]["guard"]
    assert said and len(said) == len(decided) == len(final["decisions"]), (said, decided)
    assert [d["to"] for d in decided] == [d["to"] for d in final["decisions"]] and final["on"] is True
    assert "fell behind" in said[0] and decided[0]["from"] == "pipe:tau=1" and final["ended_with"] == decided[-1]["to"]
    refused = run_mpi(2, [str(BIN / "sparse-dist"), "train", "--data", str(data), "--guard-drop", "0.2",
                          "--guard-sharp", "0.1"], timeout=120)
    assert refused.returncode == 2 and "--guard-sharp 0.1 is below --guard-drop 0.2" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.slow
def test_a_run_whose_last_evaluations_fell_ends_on_its_best_weights(tmp_path) -> None:
    """pipe:tau=1 at lr 0.05 on Cora in 3 random parts (2708 rows: no even split) falls and does not recover; with
    thresholds that never tighten during the run, the end of the run restores the best evaluation's weights:
    the final record's metrics are bitwise that evaluation's, said once; ``--guard off`` ends on the last step."""
    from mpirun import BIN, run_mpi

    data = write(cora(), tmp_path / "cora", parts=3, partitioner="random")
    never_during = ["--guard-patience", "1000", "--guard-sharp", "0.99", "--guard-loss-rise", "100",
                    "--guard-stall", "0"]
    finals = {}
    for mode in ("auto", "off"):
        out = tmp_path / f"{mode}.jsonl"
        result = run_mpi(3, [str(BIN / "sparse-dist"), "train", "--data", str(data), "--stale", "pipe:tau=1",
                             "--lr", "0.05", "--epochs", "40", "--print-every", "100", "--guard", mode,
                             *never_during, "--out", str(out)], timeout=240)
        assert result.returncode == 0, result.stdout + result.stderr
        records = [json.loads(line) for line in out.read_text().splitlines()]
        epochs = {r["epoch"]: r for r in records if r["type"] == "epoch"}
        final = records[-1]
        said = [line for line in result.stdout.splitlines() if line.startswith("guard: ")]
        finals[mode] = (final, epochs, said)
    final, epochs, said = finals["auto"]
    restored = final["guard"]["restored_at_end"]
    assert final["guard"]["decisions"] == [] and restored is not None, final["guard"]
    best = max(epochs.values(), key=lambda r: (r["val_acc"], -r["epoch"]))
    assert restored["restored_epoch"] == best["epoch"] < 40 and epochs[40]["val_acc"] < best["val_acc"] - 0.02
    for split in ("train_acc", "val_acc", "test_acc"):  # the restored weights, evaluated exactly again
        assert final[split] == best[split] == restored["metrics"][split], split
    assert len(said) == 1 and f"the final model is epoch {best['epoch']}'s weights" in said[0], said
    off_final, off_epochs, off_said = finals["off"]
    assert off_said == [] and off_final["guard"]["restored_at_end"] is None
    assert off_final["test_acc"] == off_epochs[40]["test_acc"] != final["test_acc"]
    # until the end the guard only watched: the same steps and evaluations with it on and off
    assert [(r["loss"], r["val_acc"]) for r in off_epochs.values()] == [(r["loss"], r["val_acc"]) for r in epochs.values()]

