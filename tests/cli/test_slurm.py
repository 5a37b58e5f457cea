"""The ``slurm/`` templates, submitted with ``sbatch`` to a real single-node Slurm started here.

Slurm (Debian's slurm-wlm and munge) is installed by the fixture when it is
missing; the tests skip, saying why, only where it cannot be installed. Each
job is waited for with a time limit and must end COMPLETED with exit code
0:0 and a complete results file. The GPU templates run with
``DEVICE=cpu`` on a node that advertises two count-only GPUs: this checks
that Slurm schedules them with one GPU per task and that the script's steps
work, not CUDA itself.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_cluster import LocalSlurm, ensure_slurm_installed

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "slurm"
JOB_TIMEOUT = 300


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    reason = ensure_slurm_installed()
    if reason:
        pytest.skip(reason)
    with LocalSlurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A submit directory holding a tiny prepared dataset (2 shards)."""
    if not (Path(sys.prefix) / "bin" / "activate").is_file():
        pytest.skip(f"the templates source $VENV/bin/activate; {sys.prefix} is not a virtual environment")
    root = tmp_path_factory.mktemp("submit")
    subprocess.run([sys.executable, "-m", "runners.cli", "prepare", "synthetic", "--out", str(root / "tiny"),
                    "--nodes", "1500", "--degree", "5", "--features", "16", "--classes", "3", "--parts", "2"],
                   check=True, capture_output=True, timeout=120, cwd=REPO)
    return root


def _submit_and_wait(slurm: LocalSlurm, template: str, work: Path, export: dict[str, str],
                     *options: str) -> dict[str, str]:
    job_id = slurm.sbatch(TEMPLATES / template, *options, export={"VENV": sys.prefix, **export}, cwd=work)
    info = slurm.wait(job_id, JOB_TIMEOUT)
    output = Path(info.get("StdOut", ""))
    text = output.read_text() if output.is_file() else "(no output file)"
    gpus = f", TRES per task {info['TresPerTask']}" if info.get("TresPerTask") else ""
    print(f"\n{template}: job {job_id} {info.get('JobState')} exit {info.get('ExitCode')} "
          f"elapsed {info.get('RunTime')} on {info.get('NodeList')} ({info.get('NumTasks')} tasks{gpus})")
    assert info.get("JobState") == "COMPLETED" and info.get("ExitCode") == "0:0", \
        f"{template}: job {job_id} ended {info.get('JobState')} exit {info.get('ExitCode')}:\n{text[-2000:]}"
    return {**info, "output": text}


def _final_record(path: Path) -> dict:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[-1]["type"] == "final", f"{path} has no final record"
    return records[0] | records[-1]


@pytest.mark.slow
def test_train_cpu_template(slurm: LocalSlurm, work: Path) -> None:
    out = work / "train-cpu.jsonl"
    info = _submit_and_wait(slurm, "train-cpu.sbatch", work,
                            {"DATA": str(work / "tiny"), "OUT": str(out), "EPOCHS": "3"}, "--ntasks=2")
    record = _final_record(out)
    assert record["world_size"] == 2 and record["epochs"] == 3 and record["device"] == "cpu"
    assert "final test accuracy" in info["output"]


@pytest.mark.slow
def test_train_cpu_template_prints_the_fastest_node_split_first(slurm: LocalSlurm, work: Path) -> None:
    """``SPLIT_FROM``: the job prints ``cost node-split`` for its node's CPUs (probed on the compute node), then
    trains as submitted."""
    study = _study(work, "split-calibration", "threads = 1")
    subprocess.run([sys.executable, "-m", "runners.cli", "sweep", str(study)], check=True, capture_output=True,
                   timeout=300, cwd=work)
    out = work / "train-split.jsonl"
    info = _submit_and_wait(slurm, "train-cpu.sbatch", work,
                            {"DATA": str(work / "tiny"), "OUT": str(out), "EPOCHS": "2",
                             "SPLIT_FROM": str(work / "split-calibration-out")}, "--ntasks=2")
    assert "fastest: " in info["output"] and "--ntasks-per-node=" in info["output"], info["output"]
    assert info["output"].index("fastest: ") < info["output"].index("final test accuracy")
    assert _final_record(out)["world_size"] == 2


@pytest.mark.slow
def test_train_gpu_template_schedules_one_gpu_per_task(slurm: LocalSlurm, work: Path) -> None:
    out = work / "train-gpu.jsonl"
    info = _submit_and_wait(slurm, "train-gpu.sbatch", work,
                            {"DATA": str(work / "tiny"), "OUT": str(out), "EPOCHS": "2", "DEVICE": "cpu",
                             "GPU_AWARE": "off"}, "--ntasks=2", "--cpus-per-task=1")
    assert info.get("TresPerTask") == "gres:gpu:1", f"expected one GPU per task, found {info.get('TresPerTask')}"
    assert "GPU devices seen by the ranks: 0,1" in info["output"], info["output"][-2000:]
    record = _final_record(out)
    assert record["world_size"] == 2 and record["epochs"] == 2


def _study(work: Path, name: str, train: str) -> Path:
    path = work / f"{name}.toml"
    path.write_text(f"""
[study]
name = "{name}"
output = "{name}-out"
ranks = [1, 2]
plans = ["p2p"]
policies = ["exact"]
epochs = 3
warmup = 1
timeout = 200

[train]
hidden = 8
{train}

[[dataset]]
name = "tiny"
path = "tiny"
""")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("template", ["sweep-cpu.sbatch", "sweep-gpu.sbatch"])
def test_sweep_templates_launch_runs_with_srun(slurm: LocalSlurm, work: Path, template: str) -> None:
    name = template.removesuffix(".sbatch")
    study = _study(work, name, 'device = "cpu"')
    _submit_and_wait(slurm, template, work, {"STUDY": str(study)}, "--ntasks=2", "--cpus-per-task=1")
    with open(work / f"{name}-out" / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted(int(r["world_size"]) for r in rows) == [1, 2]
    assert {r["launcher"] for r in rows} == {"srun"}
