"""Study files, run planning and result collection (single process, no MPI)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from runners.study.collect import CSV_COLUMNS, broadcast_fraction, summarise_run
from runners.study.spec import Study, StudyError, load_study
from runners.sweep_cmd import launcher_for, prepare_command, run_command, train_flags

GOOD = """
[study]
name = "s"
output = "out"
ranks = [1, 2, 3, 4]
replication = [1, 2]
plans = ["dense-bcast", "p2p"]
policies = ["exact", "bns:keep=0.1", "sancus-e:eps=1"]
seeds = [0, 1]
epochs = 5
warmup = 2

[train]
hidden = 8
weight_decay_scope = "all"

[[dataset]]
name = "syn"
synthetic = { nodes = 1000, degree = 4, features = 8, classes = 3 }
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


def test_runs_cross_plans_policies_and_skip_what_cannot_run(tmp_path: Path) -> None:
    study = load_study(_write(tmp_path, GOOD))
    runs, skipped = study.runs()
    # per (P, c): dense-bcast x {exact, sancus-e} + p2p x {exact, bns} = 4 configurations, 2 seeds
    valid_pc = [(p, c) for p in (1, 2, 3, 4) for c in (1, 2) if p % c == 0]
    assert len(runs) == len(valid_pc) * 4 * 2
    assert {(r.plan, r.policy) for r in runs} == {("dense-bcast", "exact"), ("dense-bcast", "sancus-e:eps=1"),
                                                  ("p2p", "exact"), ("p2p", "bns:keep=0.1")}
    assert any("P=3 c=2" in line for line in skipped) and any("dense-bcast + bns" in line for line in skipped)
    assert len({r.run_id for r in runs}) == len(runs)
    assert study.output == Path.cwd() / "out"  # relative to where sweep runs, not to the study file
    # every row-group count P/c of the study divides the shard count
    assert study.parts_for(study.datasets[0]) == 12
    sancus = next(r for r in runs if r.policy == "sancus-e:eps=1")
    assert (sancus.sample, sancus.stale) == ("none", "sancus-e:eps=1")


def test_grid_plans_run_exact_on_the_ranks_that_fit_them_as_train_grid(tmp_path: Path) -> None:
    text = GOOD.replace('plans = ["dense-bcast", "p2p"]', 'plans = ["p2p", "grid:2,2,1", "grid:auto"]')
    runs, skipped = load_study(_write(tmp_path, text)).runs()
    grid = [r for r in runs if r.plan.startswith("grid:")]
    assert {(r.plan, r.ranks, r.replication, r.policy) for r in grid} == (
        {("grid:2,2,1", 4, 1, "exact")} | {("grid:auto", p, 1, "exact") for p in (1, 2, 3, 4)})
    assert "P=2 c=1 grid:2,2,1: X * Y * Z = 4, not P" in skipped
    assert "P=2 c=2 grid:auto: the process grid is the layout; it takes no replication" in skipped
    assert any(line.startswith("grid:auto + bns:keep=0.1: the process grid runs exact") for line in skipped)
    study = load_study(_write(tmp_path, text))
    fixed = next(r for r in grid if r.plan == "grid:2,2,1")
    command = run_command(study, fixed, "mpiexec")
    assert command[command.index("--grid") + 1] == "2,2,1" and "--plan" not in command
    assert "grid-2x2x1" in fixed.run_id and ":" not in fixed.run_id and "," not in fixed.run_id
    with pytest.raises(StudyError, match="expected grid:X,Y,Z"):
        load_study(_write(tmp_path, GOOD.replace('plans = ["dense-bcast", "p2p"]', 'plans = ["grid:2,2"]')))


def test_weak_scaling_sizes_per_rank_count(tmp_path: Path) -> None:
    text = GOOD.replace('name = "s"', 'name = "s"\nscaling = "weak"').replace(
        "synthetic = { nodes = 1000, degree = 4, features = 8, classes = 3 }",
        'synthetic = { degree = 4, features = 8, classes = 3 }\nnodes_per_rank = 500\nsizes = { "3" = 1234 }')
    study = load_study(_write(tmp_path, text))
    runs, _ = study.runs()
    nodes = {r.ranks: r.nodes for r in runs}
    assert nodes == {1: 500, 2: 1000, 3: 1234, 4: 2000}
    assert len({study.prepared_dir(r) for r in runs}) == 4


def test_weak_scaling_of_an_rmat_graph_adds_log2_p_to_its_scale(tmp_path: Path) -> None:
    text = GOOD.replace('name = "s"', 'name = "s"\nscaling = "weak"').replace("ranks = [1, 2, 3, 4]", "ranks = [1, 2, 4]").replace(
        "synthetic = { nodes = 1000, degree = 4, features = 8, classes = 3 }",
        "rmat = { scale = 9, edge_factor = 8, features = 8, classes = 3 }")
    study = load_study(_write(tmp_path, text))
    runs, _ = study.runs()
    assert {r.ranks: r.nodes for r in runs} == {1: 512, 2: 1024, 4: 2048}
    scales = {}
    for run in runs:
        command = prepare_command(study, run)
        scales[run.ranks] = command[command.index("rmat") + 1:]
    assert {ranks: [flag for flag in flags if flag.startswith("--scale=")] for ranks, flags in scales.items()} == {
        1: ["--scale=9"], 2: ["--scale=10"], 4: ["--scale=11"]}
    assert all("--edge-factor=8" in flags for flags in scales.values())
    strong = load_study(_write(tmp_path, text.replace('scaling = "weak"', 'scaling = "strong"')))
    assert {r.nodes for r in strong.runs()[0]} == {None}  # one graph, its scale as written
    with pytest.raises(StudyError, match="power of two, not 3"):
        load_study(_write(tmp_path, text.replace("ranks = [1, 2, 4]", "ranks = [1, 3]"))).runs()


@pytest.mark.parametrize("change,field", [
    (("epochs = 5", "epochs = 5\nbogus = 1"), "unknown field(s) ['bogus']"),
    (('plans = ["dense-bcast", "p2p"]', 'plans = ["allgather"]'), "study.plans"),
    (('"bns:keep=0.1"', '"bns:q=0.1"'), "study.policies"),
    (("warmup = 2", "warmup = 5"), "study.warmup"),
    (("ranks = [1, 2, 3, 4]", "ranks = [0, 2]"), "study.ranks"),
    (("hidden = 8", "epochs = 3"), "[train] sets ['epochs']"),
    (("synthetic = { nodes = 1000,", 'path = "x"\nsynthetic = { nodes = 1000,'), "exactly one of 'path'"),
    (("name = \"syn\"", "name = \"a b\""), "dataset[0].name"),
    (("classes = 3 }", "classes = 3, homophily = 1.5 }"), "synthetic.homophily: expected a share in [0, 1]"),
])
def test_bad_study_files_name_the_file_and_field(tmp_path: Path, change: tuple[str, str], field: str) -> None:
    path = _write(tmp_path, GOOD.replace(*change))
    with pytest.raises(StudyError) as error:
        load_study(path).runs()
    assert str(path) in str(error.value) and field in str(error.value)


@pytest.mark.parametrize("change,sentence", [
    (("hidden = 8", "hiden = 16"), "[train] hiden: not an option of `sparse-dist train`; did you mean hidden?"),
    (("hidden = 8", "lr = -1"), "[train] lr = -1: argument --lr: must be a finite number > 0 and <= 10, got -1"),
    (("hidden = 8", "dropout = 1.0"), "[train] dropout = 1.0: argument --dropout: must be a finite number >= 0 and < 1"),
    (("hidden = 8", 'model = "gcnn"'), "[train] model = 'gcnn': argument --model: invalid choice: 'gcnn'"),
    (("hidden = 8", "heads = 8"), "[train] with plan dense-bcast and policy exact: --heads, --output-heads and "
                                  "--attention-dropout are for --layer-kind gat"),
])
def test_train_keys_and_values_are_checked_by_trains_own_parser(tmp_path: Path, change: tuple[str, str],
                                                                sentence: str) -> None:
    path = _write(tmp_path, GOOD.replace(*change))
    with pytest.raises(StudyError) as error:
        load_study(path)
    assert str(error.value).startswith(f"{path}: ") and sentence in str(error.value), str(error.value)


def test_a_misspelt_train_key_stops_a_dry_run(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = _write(tmp_path, GOOD.replace("hidden = 8", "hiden = 16"))
    result = subprocess.run([sys.executable, "-m", "runners.cli", "sweep", str(path), "--dry-run"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == (f"sparse-dist sweep: error: {path}: [train] hiden: not an option of `sparse-dist train`; "
                             f"did you mean hidden?\n")
    assert result.stdout == ""


def test_a_reader_that_leaves_ends_a_dry_run_quietly(tmp_path: Path) -> None:
    """``sweep --dry-run STUDY | head``: the reader closed the pipe before the first line; the command stops
    with 128 + SIGPIPE and no traceback."""
    import signal
    import subprocess
    import sys

    path = _write(tmp_path, GOOD)
    process = subprocess.Popen([sys.executable, "-m", "runners.cli", "sweep", str(path), "--dry-run"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # before its imports are done: its first line meets a closed pipe
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGPIPE, stderr
    assert stderr == ""


def test_missing_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(StudyError, match="not found"):
        load_study(tmp_path / "nope.toml")
    with pytest.raises(StudyError, match="not valid TOML"):
        load_study(_write(tmp_path, "[study\n"))


def test_train_flags_and_launcher_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert train_flags({"hidden": 8, "weight_decay_scope": "all", "resume": True, "x": False}) == \
        ["--hidden", "8", "--weight-decay-scope", "all", "--resume"]
    study = load_study(_write(tmp_path, GOOD))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert launcher_for(study) == "mpiexec"
    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert launcher_for(study) == "srun"


def _epoch(n: int, total: float, parts: tuple[float, float, float, float], sent: float,
           broadcasts: list | None = None) -> dict:
    spread = lambda v: {"min": v, "mean": v, "max": v}  # noqa: E731
    names = ("local_spmm", "dense", "exchange", "allreduce")
    return {"type": "epoch", "epoch": n, "loss": 1.0,
            "time": {"total": {"min": total / 2, "mean": total * 0.75, "max": total},
                     **{k: spread(v) for k, v in zip(names, parts)}},
            "bytes": {phase: {"sent": spread(sent), "recv": spread(sent)}
                      for phase in ("forward", "backward", "grad_allreduce", "other")},
            "broadcasts": broadcasts or []}


CONFIG = {"type": "config", "world_size": 2, "replication": 1, "plan": "p2p", "sample": "none", "stale": "none",
          "seed": 0, "model": "gcn", "hidden": 8, "layers": 2, "dtype": "float32", "data": "d"}


def _raced_row(config: dict, best: float, extra: dict) -> dict:
    """The study row of a two-epoch run whose validation accuracy climbs to ``best``."""
    epochs = [{**_epoch(n, 1.0, (0.1, 0.2, 0.3, 0.4), 100), "val_acc": best * n / 2, "wall": float(n)} for n in (1, 2)]
    final = {"type": "final", "epochs": 2, "test_acc": 0.5, "val_acc": 0.4, "peak_memory_per_rank": [{"rss": 7}]}
    return summarise_run([config, *epochs, final], 0, {"dataset": "d", "policy": "exact", **extra})


def _shipped_study(monkeypatch: pytest.MonkeyPatch, name: str) -> Study:
    """A study file of runners/study/studies, loaded from the repository root as the docs run it."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    return load_study(root / "runners" / "study" / "studies" / name)


def test_summary_leaves_out_warmup_epochs() -> None:
    config = CONFIG
    epochs = [_epoch(1, 10.0, (9, 9, 9, 9), 1e9), _epoch(2, 1.0, (0.1, 0.2, 0.3, 0.4), 100),
              _epoch(3, 3.0, (0.3, 0.4, 0.5, 0.6), 300)]
    final = {"type": "final", "epochs": 3, "test_acc": 0.5, "val_acc": 0.4, "peak_memory_per_rank": [{"rss": 7}]}
    row = summarise_run([config, {"type": "environment", "threads_per_rank": 1}, *epochs, final], 1, {"run": "x"})
    assert row["epoch_time"] == pytest.approx(2.0) and row["epoch_time_std"] == pytest.approx(1.0)
    assert row["epoch_time_mean_rank"] == pytest.approx(1.5)
    assert row["t_local_spmm"] == pytest.approx(0.2) and row["t_allreduce"] == pytest.approx(0.5)
    # (forward + backward sent mean) * world size, averaged over the two timed epochs
    assert row["exchange_bytes"] == pytest.approx((200 * 2 + 600 * 2) / 2)
    assert row["final_test"] == 0.5 and row["peak_rss_max"] == 7 and row["run"] == "x"


def test_summary_states_the_timed_epochs_spread() -> None:
    """Median, min and max are of the slowest rank's time over the timed epochs only, the warm-up left out."""
    parts = (0.1, 0.1, 0.1, 0.1)
    epochs = [_epoch(1, 50.0, parts, 1), _epoch(2, 1.0, parts, 1), _epoch(3, 6.0, parts, 1), _epoch(4, 2.0, parts, 1)]
    final = {"type": "final", "epochs": 4, "test_acc": 0.5, "val_acc": 0.4, "peak_memory_per_rank": [{"rss": 7}]}
    row = summarise_run([CONFIG, *epochs, final], 1, {"run": "x"})
    assert row["epoch_time"] == pytest.approx(3.0)  # the mean, unlike the median below
    assert (row["epoch_time_median"], row["epoch_time_min"], row["epoch_time_max"]) == (2.0, 1.0, 6.0)
    assert {"epoch_time_median", "epoch_time_min", "epoch_time_max"} <= set(CSV_COLUMNS)


def test_broadcast_fraction_counts_active_owners() -> None:
    epochs = [{"broadcasts": [{"layer": 0, "owners": 4, "active": [0, 2]}, {"layer": 1, "owners": 4, "active": []}]},
              {"broadcasts": [{"layer": 0, "owners": 4, "active": [0, 1, 2, 3]}]}]
    assert broadcast_fraction(epochs, 4) == pytest.approx(6 / 12)
    assert broadcast_fraction([{"broadcasts": []}], 4) is None


def test_the_single_process_tools_never_start_mpi() -> None:
    import subprocess
    import sys

    probe = ("import runners.cli, runners.sweep_cmd, runners.perf_model_cmd, runners.plot_cmd, runners.study.spec\n"
             "from mpi4py import MPI\n"
             "print(MPI.Is_initialized())")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_output_is_relative_to_the_current_directory_and_a_dataset_path_to_the_study(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README runs `sweep runners/study/studies/NAME.toml` from the repository root and reads `results/NAME`."""
    studies, work = tmp_path / "repo" / "studies", tmp_path / "work"
    studies.mkdir(parents=True)
    work.mkdir()
    monkeypatch.chdir(work)
    text = GOOD.replace('output = "out"', 'output = "results/s"').replace(
        'synthetic = { nodes = 1000, degree = 4, features = 8, classes = 3 }', 'path = "../data/cora"')
    study = load_study(_write(studies, text))
    assert study.output == work / "results" / "s"
    assert study.datasets[0].path == tmp_path / "repo" / "data" / "cora"
    absolute = load_study(_write(studies, GOOD.replace('output = "out"', f'output = "{tmp_path / "abs"}"')))
    assert absolute.output == tmp_path / "abs"
    default = load_study(_write(studies, GOOD.replace('output = "out"\n', "")))
    assert default.output == work / "results" / "s"


def test_the_shipped_studies_write_where_the_readme_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(__file__).resolve().parents[2]
    for name in ("tiny", "clustered-strong", "clustered-weak"):
        assert _shipped_study(monkeypatch, f"{name}.toml").output == root / "results" / name


def test_compression_is_crossed_with_plans_and_policies(tmp_path: Path) -> None:
    from runners.sweep_cmd import run_command

    text = GOOD.replace("epochs = 5", 'epochs = 5\ncompress = ["none", "int8, feedback"]')
    study = load_study(_write(tmp_path, text))
    runs, _ = study.runs()
    plain, _ = load_study(_write(tmp_path, GOOD)).runs()
    assert len(runs) == 2 * len(plain)
    assert {r.compress for r in runs} == {"none", "int8,feedback"}  # written as train --compress prints it
    squeezed = next(r for r in runs if r.compress != "none" and r.plan == "p2p" and r.policy == "bns:keep=0.1")
    assert squeezed.run_id == "syn-n1000_P1_c1_p2p_bns_keep=0.1_int8_feedback_s0"
    assert {r.run_id for r in plain} <= {r.run_id for r in runs}  # ids of uncompressed runs are unchanged
    command = run_command(study, squeezed, "mpiexec")
    assert command[command.index("--compress") + 1] == "int8,feedback"
    assert "--compress" not in run_command(study, plain[0], "mpiexec")


def test_a_policy_table_pins_its_plans_and_compressions(tmp_path: Path) -> None:
    text = GOOD.replace('policies = ["exact", "bns:keep=0.1", "sancus-e:eps=1"]',
                        'policies = ["exact", { policy = "sancus-e:eps=1", plans = ["dense-bcast"] },\n'
                        '            { policy = "exact", plans = ["p2p"], compress = ["fp16", "bf16"] }]')
    study = load_study(_write(tmp_path, text))
    assert [(plan, str(policy), compress) for plan, policy, compress in study.configurations()] == [
        ("dense-bcast", "exact", "none"), ("dense-bcast", "sancus-e:eps=1", "none"),
        ("p2p", "exact", "none"), ("p2p", "exact", "fp16"), ("p2p", "exact", "bf16")]
    runs, skipped = study.runs()
    valid_pc = [(p, c) for p in (1, 2, 3, 4) for c in (1, 2) if p % c == 0]
    assert len(runs) == len(valid_pc) * 5 * 2  # (P, c) pairs x configurations x seeds
    assert all(line.endswith("c does not divide P") for line in skipped)  # sancus-e never meets p2p


@pytest.mark.parametrize("change,sentence", [
    (("epochs = 5", 'epochs = 5\ncompress = ["int9"]'),
     "study.compress: --compress 'int9': compression format must be one of ('fp16', 'bf16', 'int8', 'int4', 'int2'), "
     "got 'int9'"),
    (("epochs = 5", 'epochs = 5\ncompress = ["fp16", "fp16"]'), "study.compress: each compression once"),
    (('"sancus-e:eps=1"', '{ policy = "sancus-e:eps=1", plans = ["sparse-bcast"] }'),
     "study.policies[2].plans: ['sparse-bcast'] not in study.plans ['dense-bcast', 'p2p']"),
    (('"sancus-e:eps=1"', '{ policy = "exact", compress = ["bf16:stochastic"] }'),
     "study.policies[2].compress: --compress 'bf16:stochastic': stochastic rounding is an integer format's option, "
     "not bf16's"),
    (('"sancus-e:eps=1"', '{ policy = "bns:keep=0.1", plan = "p2p" }'), "study.policies[2]: unknown field(s) ['plan']"),
    (('"sancus-e:eps=1"', '{ policy = "exact", plans = ["p2p"] }'),
     "study.policies: plan p2p, policy exact, compress none comes from two entries"),
    (("hidden = 8", 'compress = "fp16"'), "[train] sets ['compress'], which the study itself decides per run"),
    (('name = "syn"', 'name = "syn"\nepochs = 2'), "dataset[0].epochs (2) must be above study.warmup (2)"),
])
def test_compression_and_policy_tables_are_refused_at_load_in_one_sentence(tmp_path: Path, change: tuple[str, str],
                                                                           sentence: str) -> None:
    import subprocess
    import sys

    path = _write(tmp_path, GOOD.replace(*change))
    result = subprocess.run([sys.executable, "-m", "runners.cli", "sweep", str(path), "--dry-run"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr.startswith(f"sparse-dist sweep: error: {path}: ") and sentence in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_dataset_trains_its_own_epochs(tmp_path: Path) -> None:
    from runners.sweep_cmd import run_command

    text = GOOD + '\n[[dataset]]\nname = "small"\nsynthetic = { nodes = 100, degree = 4, features = 8, classes = 3 }\n' \
                  'epochs = 40\n'
    study = load_study(_write(tmp_path, text))
    runs, _ = study.runs()
    epochs = {r.dataset.name: run_command(study, r, "mpiexec") for r in runs}
    assert {name: command[command.index("--epochs") + 1] for name, command in epochs.items()} == \
        {"syn": "5", "small": "40"}


def test_results_carry_the_compression_and_the_default_target_ignores_compressed_runs(tmp_path: Path) -> None:
    from runners.study.collect import read_csv, write_csv

    def row(compress: str | None, best: float) -> dict:
        run_config = CONFIG if compress is None else {**CONFIG, "compress": compress}
        return _raced_row(run_config, best, {"run": f"r-{compress}"})

    rows = [row(None, 0.5), row("fp16", 0.9)]  # a results file older than --compress reads as "none"
    write_csv(tmp_path / "results.csv", rows)
    table = {r["run"]: r for r in read_csv(tmp_path / "results.csv")}
    assert table["r-None"]["compress"] == "none" and table["r-fp16"]["compress"] == "fp16"
    assert [r["target_acc"] for r in table.values()] == pytest.approx([0.98 * 0.5] * 2)  # not 0.98 x fp16's 0.9


def test_the_emulated_policies_study_runs_the_issues_configurations(monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(__file__).resolve().parents[2]
    study = _shipped_study(monkeypatch, "emulated-policies.toml")
    runs, skipped = study.runs()
    assert skipped == []
    configurations = {(r.plan, r.policy, r.compress) for r in runs}
    assert configurations == {
        ("p2p", "exact", "none"), ("sparse-bcast", "exact", "none"), ("dense-bcast", "exact", "none"),
        ("p2p", "bns:keep=0.1", "none"), ("p2p", "psc:budget=0.1", "none"), ("p2p", "dgs:nodes=0.5", "none"),
        ("p2p", "pipe:tau=1", "none"), ("dense-bcast", "sancus-e:eps=1", "none"), ("p2p", "exact", "fp16"),
        ("p2p", "exact", "int8,feedback")}
    assert len(runs) == 2 * 2 * 4 * len(configurations)  # datasets x P x bandwidths x configurations
    assert {r.bandwidth for r in runs} == {"unlimited", "10gbit", "1gbit", "200mbit"}
    assert {(r.dataset.name, r.ranks, study.epochs_for(r.dataset)) for r in runs} == {
        (name, ranks, epochs) for name, epochs in (("syn200k", 40), ("cora", 100)) for ranks in (2, 4)}
    assert study.network is not None and study.network.ranks_per_node == 1
    assert study.output == root / "results" / "emulated-policies"


def test_figure_labels_name_the_compression() -> None:
    from runners.figures import label

    row = {"plan": "p2p", "policy": "exact", "replication": 1}
    assert label(row) == label({**row, "compress": "none"}) == "p2p exact"
    assert label({**row, "compress": "fp16"}) == "p2p fp16"
    assert label({**row, "policy": "bns:keep=0.1", "compress": "int8,feedback"}) == "p2p bns:keep=0.1 + int8,feedback"


VARIANTS = ('policies = ["exact", "bns:keep=0.1", "sancus-e:eps=1"]',
            'policies = ["exact", { policy = "exact", plans = ["p2p"], name = "minibatch", '
            'train = { mode = "minibatch", fanouts = "5,5", batch-size = 16, hidden = 4 } }]')


def test_a_variant_runs_its_own_train_options_after_the_studys(tmp_path: Path) -> None:
    from runners.sweep_cmd import run_command

    study = load_study(_write(tmp_path, GOOD.replace(*VARIANTS)))
    runs, _ = study.runs()
    variants = [r for r in runs if r.variant]
    assert {(r.plan, r.policy) for r in variants} == {("p2p", "exact")} and len(variants) == len(runs) // 3
    plain = next(r for r in runs if not r.variant and r.plan == "p2p" and r.ranks == 2 and r.replication == 1)
    twin = next(r for r in variants if (r.ranks, r.replication, r.seed) == (plain.ranks, 1, plain.seed))
    assert twin.run_id == plain.run_id.replace("_exact_s", "_exact_minibatch_s")
    command = run_command(study, twin, "mpiexec")
    assert command[-8:] == ["--mode", "minibatch", "--fanouts", "5,5", "--batch-size", "16", "--hidden", "4"]
    hidden = [i for i, word in enumerate(command) if word == "--hidden"]
    assert [command[i + 1] for i in hidden] == ["8", "4"]  # [train]'s first, the variant's last: argparse keeps it
    assert "--mode" not in run_command(study, plain, "mpiexec")


@pytest.mark.parametrize("entry,sentence", [
    ('{ policy = "exact", name = "mb" }', "give 'name' and 'train' together"),
    ('{ policy = "exact", name = "m b", train = { mode = "minibatch" } }', "use letters, digits, '.' or '-'"),
    ('{ policy = "exact", name = "mb", train = { epochs = 3 } }', "train sets ['epochs'], which the study itself"),
    ('{ policy = "exact", name = "mb", train = { mode = "minibatch", fanouts = "0" } }', "variant mb's train"),
])
def test_a_variant_is_refused_at_load_in_one_sentence(tmp_path: Path, entry: str, sentence: str) -> None:
    text = GOOD.replace('policies = ["exact", "bns:keep=0.1", "sancus-e:eps=1"]', f'policies = ["exact", {entry}]')
    with pytest.raises(StudyError) as caught:
        load_study(_write(tmp_path, text))
    assert sentence in str(caught.value), str(caught.value)


def test_the_default_target_is_never_a_variants_and_labels_name_it(tmp_path: Path) -> None:
    from runners.figures import label
    from runners.study.collect import read_csv, write_csv

    def row(variant: str, mode: str, best: float) -> dict:
        return _raced_row({**CONFIG, "mode": mode}, best, {"run": f"r-{variant}", "variant": variant})

    write_csv(tmp_path / "results.csv", [row("", "full", 0.5), row("minibatch", "minibatch", 0.9)])
    table = {r["run"]: r for r in read_csv(tmp_path / "results.csv")}
    assert table["r-minibatch"]["mode"] == "minibatch" and table["r-"]["mode"] == "full"
    assert [r["target_acc"] for r in table.values()] == pytest.approx([0.98 * 0.5] * 2)  # not 0.98 x 0.9
    assert label({"plan": "p2p", "policy": "exact", "replication": 1, "variant": "minibatch"}) == "p2p exact minibatch"


def test_the_minibatch_study_races_minibatch_against_full_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    study = _shipped_study(monkeypatch, "minibatch-vs-full.toml")
    runs, skipped = study.runs()
    assert skipped == []
    assert {(r.ranks, r.policy, r.variant) for r in runs} == {
        (p, policy, variant) for p in (2, 4) for policy, variant in (
            ("exact", ""), ("bns:keep=0.1", ""), ("pipe:tau=1", ""), ("exact", "minibatch"),
            ("exact", "minibatch-prefetch"))}
    assert {r.bandwidth for r in runs} == {"1gbit"}


def test_the_measured_subset_of_the_emulated_policies_study_is_its_200k_1gbit_part(
        monkeypatch: pytest.MonkeyPatch) -> None:
    full, _ = _shipped_study(monkeypatch, "emulated-policies.toml").runs()
    subset, skipped = _shipped_study(monkeypatch, "emulated-policies-200k.toml").runs()
    assert skipped == [] and len(subset) == 20
    assert {(r.ranks, r.plan, r.policy, r.compress) for r in subset} == {
        (r.ranks, r.plan, r.policy, r.compress) for r in full if r.dataset.name == "syn200k" and r.bandwidth == "1gbit"}
    overlap = _shipped_study(monkeypatch, "emulated-policies-200k-overlap.toml")
    runs, _ = overlap.runs()
    assert [(r.ranks, r.plan, r.policy, r.compress) for r in runs] == [(r.ranks, r.plan, r.policy, r.compress)
                                                                       for r in subset]
    assert overlap.train.get("overlap-evaluation") is True


def test_a_homophily_makes_the_sweep_prepare_the_block_model(tmp_path: Path) -> None:
    study = load_study(_write(tmp_path, GOOD.replace("classes = 3 }", "classes = 3, homophily = 0.05 }")))
    commands = {tuple(prepare_command(study, run)) for run in study.runs()[0]}
    assert commands and all("--homophily=0.05" in command and "synthetic" in command for command in commands)
