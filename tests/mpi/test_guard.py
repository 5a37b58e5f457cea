"""The accuracy guard under real mpiexec (tests/mpi/cases/guard_cases.py, one launch at P = 4): it rescues a
pipelined run that falls, decides the same at P = 1, 2, 4 where the signals are the same, resumes bitwise,
and ``--guard off`` changes nothing."""

import pytest
import json

from datasets_for_tests import cora, write
from mpirun import run_case


@pytest.mark.slow
def test_guard_rescues_a_falling_policy_and_decides_alike_everywhere(tmp_path) -> None:
    data = write(cora(), tmp_path / "cora", parts=4, partitioner="random")  # 75% of the entries cut
    result = run_case(4, "guard_cases.py", str(data), timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RESCUE P=4" in result.stdout and "SAME P=4,2,1" in result.stdout, result.stdout
    assert "guard cases P=4: all checks pass" in result.stdout, result.stdout + result.stderr


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
