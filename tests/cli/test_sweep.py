"""``sparse-dist sweep``, ``model compare`` and ``plot`` end to end, with real mpiexec runs."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from datasets_for_tests import random_directed, write
from mpirun import BIN

SPARSE_DIST = str(BIN / "sparse-dist")
STUDY = """
[study]
name = "t"
output = "out"
ranks = [1, 3]
plans = ["sparse-bcast", "p2p"]
policies = ["exact", "sancus-e:eps=1"]
epochs = 4
warmup = 1
timeout = {timeout}

[train]
hidden = 8
threads = 1
audit_every = 2

[[dataset]]
name = "directed"
path = "data"
"""


def _sweep(study: Path, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPARSE_DIST, "sweep", str(study)], cwd=study.parent, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("study")
    write(random_directed(n=300, seed=2), root / "data", parts=3)
    path = root / "study.toml"
    path.write_text(STUDY.format(timeout=200))
    result = _sweep(path)
    assert result.returncode == 0, result.stdout + result.stderr
    return path


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path) as handle:
        return list(csv.DictReader(handle))


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_sweep_runs_every_configuration_and_collects_one_table(study: Path) -> None:
    rows = _rows(study.parent / "out" / "results.csv")
    # 2 rank counts x (sparse-bcast: exact, sancus-e; p2p: exact; sancus-e needs a broadcast plan)
    assert len(rows) == 6
    assert {(r["world_size"], r["plan"], r["policy"]) for r in rows} == {
        (ranks, plan, policy) for ranks in ("1", "3") for plan, policy in (
            ("sparse-bcast", "exact"), ("sparse-bcast", "sancus-e:eps=1"), ("p2p", "exact"))}
    for row in rows:
        assert row["launcher"] == "mpiexec" and int(row["epochs"]) == 4 and float(row["epoch_time"]) > 0
        assert (float(row["exchange_bytes"]) == 0) == (row["world_size"] == "1")
    sancus = next(r for r in rows if r["policy"] == "sancus-e:eps=1" and r["world_size"] == "3")
    assert 0 < float(sancus["broadcast_fraction"]) < 1
    for ranks in ("1", "3"):  # every run at a P races to 0.98 x that P's exact p2p best; that run reaches it
        exact = next(r for r in rows if r["policy"] == "exact" and r["plan"] == "p2p" and r["world_size"] == ranks)
        assert float(exact["target_acc"]) == pytest.approx(0.98 * float(exact["best_val"]))
        assert 0 < float(exact["time_to_target"]) <= float(exact["wall_total"])
        assert {r["target_acc"] for r in rows if r["world_size"] == ranks} == {exact["target_acc"]}
    raw = (study.parent / "out" / "runs.jsonl").read_text().splitlines()
    assert len({line.split('"run": "')[1].split('"')[0] for line in raw}) == 6


@pytest.mark.slow
def test_a_killed_study_resumes_with_the_missing_runs_only(study: Path) -> None:
    runs = study.parent / "out" / "runs"
    victim = runs / "directed_P3_c1_p2p_exact_s0.jsonl"
    victim.unlink()
    leftover = runs / "directed_P3_c1_p2p_exact_s0.jsonl.partial"  # what a killed run streamed so far
    leftover.write_text('{"type": "config", "killed": true}\n{"type": "epoch", "epoch": 1}\n')
    result = _sweep(study)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("done before, skipped") == 5
    assert "directed_P3_c1_p2p_exact_s0  ran" in result.stdout
    assert victim.is_file() and len(_rows(study.parent / "out" / "results.csv")) == 6
    text = victim.read_text()
    assert '"killed"' not in text and text.count('"type": "config"') == 1  # started afresh, not appended to
    assert not leftover.exists()


@pytest.mark.slow
def test_model_predicts_the_exact_bytes_of_every_exact_run(study: Path) -> None:
    result = subprocess.run([SPARSE_DIST, "model", "compare", str(study.parent / "out")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = _rows(study.parent / "out" / "model.csv")
    measured = {r["run"]: r for r in _rows(study.parent / "out" / "results.csv")}
    assert len(rows) == 6
    for row in rows:
        if row["policy"] == "exact":
            assert float(row["measured_bytes"]) == float(row["predicted_bytes"])
        assert float(row["predicted_epoch"]) > 0
        if row["calibration"] == "True":  # rates are fitted to this run's own compute time
            run = measured[row["run"]]
            assert row["world_size"] == "1"
            assert float(row["predicted_compute"]) == pytest.approx(float(run["t_local_spmm"]) + float(run["t_dense"]))
        # every run's cycle: its step and the evaluation after it, measured between rows and predicted
        run = measured[row["run"]]
        assert run["overlap_evaluation"] == "False" and run["eval_every"] == "1"
        assert float(run["cycle_time"]) > 0 and float(run["eval_bytes"]) >= 0
        # a cycle holds its epoch's step and evaluation: the same epochs' steps (each rank's shortest, which lies
        # inside rank 0's interval between rows) take less (the means over other epoch sets need not: a slow
        # warm-up epoch counts in ``epoch_time`` and closes no cycle)
        epochs = [r for r in _records(study.parent / "out" / "runs" / f"{row['run']}.jsonl")
                  if r["type"] == "epoch"][int(run["warmup"]):]
        cycles = [later["wall"] - earlier["wall"] for earlier, later in zip(epochs, epochs[1:])]
        assert sum(cycles) / len(cycles) == pytest.approx(float(run["cycle_time"]))
        assert sum(cycles) > sum(epoch["time"]["total"]["min"] for epoch in epochs[1:])
        assert float(row["measured_cycle"]) == float(run["cycle_time"])
        assert float(row["predicted_cycle"]) == pytest.approx(float(row["predicted_epoch"])
                                                              + float(row["predicted_eval_compute"])
                                                              + float(row["predicted_eval_exchange"]))
        assert float(row["predicted_eval_compute"]) > 0
    assert "within 25%" in result.stdout and "cycle (step and evaluation), every run: 6" in result.stdout


@pytest.mark.slow
def test_model_predicts_layer_0_from_a_halo_fetched_once(study: Path) -> None:
    def totals(mode: str) -> tuple[dict[str, float], str]:
        result = subprocess.run([SPARSE_DIST, "model", "predict", "--nodes", "100000", "--nnz", "1000000",
                                 "--features", "256", "--classes", "8", "--hidden", "32", "--ranks", "4,16",
                                 "--plans", "p2p", "--policies", "exact", "--input-exchange", mode,
                                 "--calibrate-from", str(study.parent / "out")],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr
        rows = [line.split() for line in result.stdout.splitlines() if line.split()[1:3] == ["p2p", "exact"]]
        return {row[0]: float(row[4]) for row in rows}, result.stdout

    every, _ = totals("per-epoch")
    once, text = totals("once")
    assert set(every) == set(once) == {"4", "16"}
    assert all(once[p] < every[p] for p in every)  # layer 0 (256 -> 32 columns) no longer exchanges
    assert text.count("halo of X fetched once") == 2


@pytest.mark.slow
def test_model_prices_grids_beside_1d_with_the_passes_probed_here(study: Path) -> None:
    """``cost predict --plans p2p,grid:auto`` ranks the fastest grid beside 1D p2p at each P, its compute with the
    grid's elementwise passes at a rate probed in the command (runners/grid_probes.py), which the run says."""
    result = subprocess.run([SPARSE_DIST, "cost", "predict", "--nodes", "100000", "--nnz", "1000000", "--features",
                             "64", "--classes", "8", "--hidden", "32", "--ranks", "4,8", "--plans", "p2p,grid:auto",
                             "--policies", "exact", "--calibrate-from", str(study.parent / "out")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "the grid's elementwise passes" in result.stdout and "probed here" in result.stdout
    picks = [line.split() for line in result.stdout.splitlines() if "grid:auto=" in line]
    assert {row[0] for row in picks} == {"4", "8"}
    chosen = [line for line in result.stdout.splitlines() if line.endswith("<- chosen")]
    assert len(chosen) == 2 and all(float(line.split("compute ")[1].split(" s")[0]) > 0 for line in chosen)


@pytest.mark.slow
def test_cost_node_split_prices_every_split_of_the_node_and_names_the_fastest(study: Path) -> None:
    """``cost node-split``: a row per ranks x threads of a 2-core node, fastest first, its launch line matching that
    row; a node larger than this machine is refused in one sentence (its splits cannot be probed here)."""
    common = [SPARSE_DIST, "cost", "node-split", "--nodes", "20000", "--nnz", "200000", "--features", "64", "--classes",
              "8", "--hidden", "16", "--calibrate-from", str(study.parent / "out")]
    result = subprocess.run(common + ["--cores-per-node", "2"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line[:1].isdigit() and " x " in line[:6]]
    assert sorted((row[0], row[2], row[3]) for row in rows) == [("1", "2", "1"), ("2", "1", "2")]
    epochs = [float(row[9]) for row in rows]
    assert epochs == sorted(epochs) and rows[0][-1] == "fastest"
    assert f"--ntasks-per-node={rows[0][0]} --cpus-per-task={rows[0][2]}" in result.stdout
    refused = subprocess.run(common + ["--cores-per-node", str((os.cpu_count() or 1) * 64)], capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode != 0 and "cannot be probed on this machine" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


@pytest.mark.slow
def test_plot_writes_every_figure(study: Path, tmp_path: Path) -> None:
    result = subprocess.run([SPARSE_DIST, "plot", str(study.parent / "out"), "--out", str(tmp_path), "--dpi", "50"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    names = {"scaling-strong.png", "breakdown.png", "bytes.png", "accuracy.png", "sancus-broadcasts.png", "audit.png",
             "accuracy-time.png"}  # no tta-bandwidth.png: this study has no [network] table
    assert {Path(line).name for line in result.stdout.split()} == names
    for name in names:
        header = (tmp_path / name).read_bytes()[:24]
        assert header[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
        assert width > 100 and height > 100


def test_a_run_over_its_time_limit_is_killed_and_reported(tmp_path: Path) -> None:
    write(random_directed(n=300, seed=2), tmp_path / "data", parts=3)
    path = tmp_path / "study.toml"
    path.write_text(STUDY.format(timeout=1).replace('policies = ["exact", "sancus-e:eps=1"]',
                                                    'policies = ["exact"]').replace("ranks = [1, 3]", "ranks = [3]")
                    .replace('plans = ["sparse-bcast", "p2p"]', 'plans = ["p2p"]')
                    .replace("epochs = 4", "epochs = 100000"))  # over the limit however fast the ranks start
    result = _sweep(path, timeout=120)
    assert result.returncode == 1
    assert "FAILED (timed out" in result.stdout and "1 run(s) failed" in result.stderr
    assert not list((tmp_path / "out" / "runs").glob("*.jsonl"))


def test_bad_study_is_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "study.toml"
    path.write_text(STUDY.format(timeout=10).replace('plans = ["sparse-bcast", "p2p"]', 'plans = ["ring"]'))
    result = _sweep(path, timeout=60)
    assert result.returncode == 2
    assert f"{path}: study.plans: unknown plan 'ring'" in result.stderr



def _small_study(tmp_path: Path, extra_study: str = "", train: str = "", epochs: int = 4) -> Path:
    """A one-run study (P = 1) on a 120-node dataset at ``tmp_path/data``."""
    if not (tmp_path / "data").exists():
        write(random_directed(n=120, seed=2), tmp_path / "data", parts=1)
    path = tmp_path / "study.toml"
    path.write_text(STUDY.format(timeout=120).replace("ranks = [1, 3]", "ranks = [1]")
                    .replace('plans = ["sparse-bcast", "p2p"]', 'plans = ["p2p"]')
                    .replace('policies = ["exact", "sancus-e:eps=1"]', 'policies = ["exact"]')
                    .replace("epochs = 4", f"epochs = {epochs}").replace('name = "t"', f'name = "t"\n{extra_study}')
                    .replace("[train]", f"[train]\n{train}"))
    return path


def test_a_second_sweep_on_the_same_output_is_refused_while_the_first_runs(tmp_path: Path) -> None:
    """One writer per output: two sweeps of one study at once used to run every run twice into the same files
    (one of them aborted); the second is now refused in one sentence naming the first's pid."""
    from runners.output_lock import OutputLocks

    path = _small_study(tmp_path)
    first = subprocess.run([SPARSE_DIST, "sweep", "--collect-only", str(path)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)  # marks the output as the study's
    assert first.returncode == 0, first.stderr
    locks = OutputLocks()  # what a running sweep holds
    assert locks.take(tmp_path / "out" / "results.csv", "study.output", overwrite=False) is None
    try:
        second = _sweep(path, timeout=60)
    finally:
        locks.release()
    assert second.returncode == 2, second.stdout + second.stderr
    assert second.stderr.strip().splitlines() == [
        f"sparse-dist sweep: error: {path}: study.output {tmp_path / 'out' / 'results.csv'} is being written by "
        f"another run (pid {os.getpid()} on host {os.uname().nodename}, since "
        f"{second.stderr.split(', since ')[1].split(';')[0]}; it holds {tmp_path / 'out' / 'results.csv.lock'}); wait "
        f"for it to end or choose another study.output"], second.stderr
    assert not list((tmp_path / "out").glob("runs/*.jsonl"))


@pytest.mark.slow
def test_an_output_holding_files_the_study_did_not_write_is_refused_unless_overwrite(tmp_path: Path) -> None:
    path = _small_study(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.csv").write_bytes(b"my own table\n")
    (tmp_path / "out" / "runs.jsonl").write_bytes(b'{"mine": 1}\n')
    for flags in ([], ["--dry-run"]):
        result = subprocess.run([SPARSE_DIST, "sweep", *flags, str(path)], cwd=tmp_path, capture_output=True,
                                text=True, timeout=120)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stdout + result.stderr
        assert result.stderr.strip().splitlines() == [
            f"sparse-dist sweep: error: {path}: study.output {tmp_path / 'out'} holds files this study's sweep did not "
            f"write (results.csv, runs.jsonl), so nothing was written there; choose another output, or set "
            f"overwrite = true in [study] to let the sweep replace its results.csv and runs.jsonl there"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["results.csv", "runs.jsonl"]
    assert (tmp_path / "out" / "results.csv").read_bytes() == b"my own table\n"
    path.write_text(path.read_text().replace('name = "t"', 'name = "t"\noverwrite = true'))
    collected = subprocess.run([SPARSE_DIST, "sweep", "--collect-only", str(path)], cwd=tmp_path,
                               capture_output=True, text=True, timeout=120)
    assert collected.returncode == 0, collected.stderr
    assert (tmp_path / "out" / "results.csv").read_bytes() != b"my own table\n"
    assert json.loads((tmp_path / "out" / ".sparse-dist-sweep.json").read_text()) == {
        "written_by": "sparse-dist sweep", "study": "t"}
    path.write_text(path.read_text().replace("overwrite = true", ""))  # marked as the study's own: goes on
    again = subprocess.run([SPARSE_DIST, "sweep", "--collect-only", str(path)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    path.write_text(path.read_text().replace('name = "t"', 'name = "other"'))  # another study's output: refused
    other = subprocess.run([SPARSE_DIST, "sweep", "--collect-only", str(path)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert other.returncode == 2 and "holds the results of another study, 't'" in other.stderr, other.stderr


def test_a_checkpoint_is_checked_against_the_runs_real_dataset(tmp_path: Path) -> None:
    outside = _small_study(tmp_path, train=f'checkpoint = "{tmp_path / "run.ckpt"}"')
    result = subprocess.run([SPARSE_DIST, "sweep", "--dry-run", str(outside)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr  # absolute, beside the dataset: no false "lies inside ." any more
    assert f"--checkpoint {tmp_path / 'run.ckpt'}" in result.stdout
    inside = _small_study(tmp_path, train=f'checkpoint = "{tmp_path / "data" / "run.ckpt"}"')
    refused = subprocess.run([SPARSE_DIST, "sweep", "--dry-run", str(inside)], cwd=tmp_path, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2
    assert (f"--checkpoint {tmp_path / 'data' / 'run.ckpt'} lies inside the --data dataset directory "
            f"{tmp_path / 'data'}") in refused.stderr


def _processes_below(pid: int) -> list[int]:
    from runners.study.supervisor import descendants

    return descendants(pid)


def test_a_killed_sweep_leaves_no_process_of_its_runs(tmp_path: Path) -> None:
    path = _small_study(tmp_path, epochs=100000)
    sweep = subprocess.Popen([SPARSE_DIST, "sweep", str(path)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not list((tmp_path / "out" / "runs").glob("*.jsonl.partial")) and time.monotonic() < deadline:
            assert sweep.poll() is None
            time.sleep(0.2)
        job = _processes_below(sweep.pid)  # guard, mpiexec, hydra's proxy and the rank (in sessions of their own)
        assert len(job) >= 3, job
        sweep.kill()
        sweep.wait(timeout=10)
        deadline = time.monotonic() + 15
        while _alive(job) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(job), _alive(job)
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
            sweep.wait()


def _alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` that still run (a zombie waiting for PID 1 to reap it does not)."""
    running = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                if handle.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                    running.append(pid)
        except OSError:
            pass
    return running
