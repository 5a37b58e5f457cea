"""``sparse-dist sweep STUDY.toml``: run every job of a scaling study and collect the results.

Not an MPI program itself: it launches each run as ``mpiexec -n P`` (or
``srun --mpi=pmi2 -n P`` when it runs inside a Slurm allocation), one after
the other, with a time limit per run. A study with a ``[network]`` table runs
each job through ``sparse-dist emulate`` instead (an emulated cluster of
P / ranks_per_node nodes at the run's bandwidth; ``runs/RUN.network.json``
keeps the links' byte counters), with the study's timeout given to
``emulate`` so that it tears its network down before the sweep would kill it. A run whose results file is complete
(it exists and ends with its ``final`` record) is skipped, so a killed study
resumes where it stopped: a run killed midway leaves only ``RUN.jsonl.partial``
(the records it streamed; :class:`runners.results.ResultsWriter`), which does
not count as done, and its re-run starts that file afresh (truncated, never
appended to) and renames it to ``RUN.jsonl`` when it completes. Synthetic
datasets are prepared once per size under ``OUTPUT/data``.

Output, under the study's ``output`` directory (only into one the sweep made or marked as this study's,
or with ``overwrite = true`` in ``[study]``: :mod:`runners.study.output`):

* ``.sparse-dist-sweep.json``: the mark that the directory holds this study's results;
* ``runs/RUN.jsonl`` and ``runs/RUN.log``: each run's results and its output (``runs/RUN.jsonl.partial``
  while it runs, or after it was killed);
* ``results.csv``: one row per finished run (:mod:`runners.study.collect`), rewritten after each run;
* ``runs.jsonl``: every record of every run, tagged with ``run``, written when the sweep ends
  (``--collect-only`` rebuilds both from the finished runs).

Each results file is read once per sweep, so collecting stays linear in the number of runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from runners.launcher_path import find_mpiexec
from runners.output_lock import OutputLocks
from runners.study.collect import is_complete, read_records, summarise_run, write_csv, write_raw
from runners.study.output import claim_output, output_problem
from runners.study.datasets import RMAT_KEYS
from runners.study.plans import plan_flags
from runners.study.spec import Run, Study, StudyError, load_study
from runners.study.train_table import train_flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study file (TOML)")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and the commands, run nothing")
    parser.add_argument("--collect-only", action="store_true", help="only rebuild results.csv from finished runs")


def _python_command() -> list[str]:
    return [sys.executable, "-m", "runners.cli"]


def _mpiexec() -> str:
    found = find_mpiexec()
    if found is None:
        raise StudyError("no mpiexec found beside the Python interpreter or on PATH; install an MPI "
                         "(pip install mpich) or run the study inside a Slurm allocation")
    return found


def launcher_for(study: Study) -> str:
    """``srun`` inside a Slurm allocation (when ``launcher = "auto"``), else ``mpiexec``."""
    if study.launcher != "auto":
        return study.launcher
    if study.network is not None:
        return "mpiexec"  # through `sparse-dist emulate`, which drives hydra's mpiexec itself
    return "srun" if os.environ.get("SLURM_JOB_ID") and shutil.which("srun") else "mpiexec"


def launch_prefix(launcher: str, ranks: int, extra: list[str]) -> list[str]:
    if launcher == "srun":
        return ["srun", "--mpi=pmi2", "--kill-on-bad-exit=1", "-n", str(ranks), *extra]
    return [_mpiexec(), "-n", str(ranks), *extra]


EMULATE_GRACE = 30.0
"""Seconds the sweep waits beyond the study's timeout for ``emulate`` to stop the job and tear down."""


def emulate_prefix(study: Study, run: Run) -> list[str]:
    """``sparse-dist emulate ... --`` for a run of a study with a ``[network]`` table."""
    network = study.network
    assert network is not None and run.bandwidth is not None
    nodes = network.nodes_for(run.ranks)
    latency = ["--latency", network.latency] if network.latency else []
    return [*_python_command(), "emulate", "--nodes", str(nodes), "--ranks-per-node", str(network.ranks_per_node),
            "--bandwidth", run.bandwidth, *latency, "--timeout", f"{study.timeout:g}",
            "--report", str(study.runs_dir / f"{run.run_id}.network.json"), "--"]


def run_command(study: Study, run: Run, launcher: str) -> list[str]:
    prefix = (emulate_prefix(study, run) if run.bandwidth is not None
              else launch_prefix(launcher, run.ranks, study.launcher_args))
    epochs = study.epochs_for(run.dataset)
    return [*prefix, *_python_command(), "train",
            "--data", str(study.prepared_dir(run).resolve()), "--out", str(study.results_file(run)),
            *plan_flags(run.plan), "--replication", str(run.replication), "--sample", run.sample,
            "--stale", run.stale, *(["--compress", run.compress] if run.compress != "none" else []),
            "--seed", str(run.seed), "--epochs", str(epochs), "--print-every", str(max(epochs // 4, 1)),
            *train_flags(study.train), *train_flags(dict(run.variant_train))]


def prepare_command(study: Study, run: Run) -> list[str]:
    spec = run.dataset
    if spec.planetoid:
        source, flags = "planetoid", [f"--{key}={value}" for key, value in spec.planetoid.items()]
    elif spec.rmat:  # under weak scaling the run's vertex count, a power of two, sets the scale
        settings = {**spec.rmat, **({"scale": run.nodes.bit_length() - 1} if run.nodes is not None else {})}
        source, flags = "rmat", [f"{RMAT_KEYS[key]}={value}" for key, value in settings.items()]
    else:
        settings = {"nodes": run.nodes, **{k: v for k, v in spec.synthetic.items() if k != "nodes"}}
        source, flags = "synthetic", [f"--{key}={value}" for key, value in settings.items()]
    return [*_python_command(), "prepare", source, "--out", str(study.prepared_dir(run)),
            "--parts", str(study.parts_for(spec)), "--partitioner", spec.partitioner, "--seed", str(spec.seed),
            "--overwrite", *flags]


STOP_GRACE = 10.0
"""Seconds a job has to stop after SIGTERM (its time limit, or the sweep's end) before it is killed whole."""


def _execute(command: list[str], log_path: Path, timeout: float) -> tuple[int | None, float]:
    """Run ``command`` under :mod:`runners.study.supervisor`, output to ``log_path``; rc None when it timed out.

    The supervisor dies with this process (``kill -9`` of the sweep included) and stops the job whole: its time
    limit, Ctrl-C or an error here sends it SIGTERM, and it kills every process of the job still running
    :data:`STOP_GRACE` seconds later."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    supervised = [sys.executable, "-m", "runners.study.supervisor", str(os.getpid()), f"{STOP_GRACE:g}", "--", *command]
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        process = subprocess.Popen(supervised, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        except BaseException:
            _stop(process)
            raise
        if rc is None:
            _stop(process)
            log.write(f"\nsparse-dist sweep: killed after the study's timeout of {timeout:g} s\n")
    return rc, time.perf_counter() - started


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Ask the supervisor to stop its job (SIGTERM, then SIGKILL to the whole job after the grace); kill the supervisor's
    session if it has not finished a while after that."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        process.terminate()
        try:
            process.wait(timeout=STOP_GRACE + 10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _tail(path: Path, lines: int = 6) -> str:
    text = path.read_text(errors="replace").rstrip().splitlines()
    return "\n".join("      " + line for line in text[-lines:])


class StudyTable:
    """The study's finished runs, each results file read once: rows for ``results.csv`` and raw records."""

    def __init__(self, study: Study, launcher: str) -> None:
        self.study, self.launcher = study, launcher
        self.rows: dict[str, dict[str, Any]] = {}
        self.records: dict[str, list[dict[str, Any]]] = {}

    def add(self, run: Run) -> dict[str, Any] | None:
        """Read ``run``'s results if it finished (once); its CSV row, or None."""
        if run.run_id not in self.rows:
            path = self.study.results_file(run)
            if not is_complete(path):
                return None
            records = read_records(path)
            meta_path = self.study.prepared_dir(run) / "meta.json"
            # the run read and checked it; its two sizes only (runners.data.shards would import torch here)
            meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
            extra = {"study": self.study.name, "run": run.run_id, "dataset": run.dataset.name,
                     "nodes": meta.get("num_nodes", run.nodes), "edges": meta.get("num_edges"),
                     "scaling": self.study.scaling, "policy": run.policy, "launcher": self.launcher,
                     "bandwidth": run.bandwidth, "variant": run.variant,
                     "results_file": str(path.relative_to(self.study.output))}
            self.rows[run.run_id] = summarise_run(records, self.study.warmup, extra)
            self.records[run.run_id] = records
        return self.rows[run.run_id]

    def write_csv(self, runs: list[Run]) -> int:
        """``results.csv`` in the study's run order; returns the row count."""
        rows = [self.rows[r.run_id] for r in runs if r.run_id in self.rows]
        write_csv(self.study.output / "results.csv", rows, self.study.target_acc)
        return len(rows)

    def write_raw(self, runs: list[Run]) -> None:
        write_raw(self.study.output / "runs.jsonl",
                  [(r.run_id, self.records[r.run_id]) for r in runs if r.run_id in self.records])


def main(comm: object, args: argparse.Namespace) -> int:
    study = load_study(args.study)
    problem = output_problem(study)  # a dry run says it too: the sweep it shows would stop here
    if problem:
        raise StudyError(problem)
    runs, skipped = study.runs()
    launcher = launcher_for(study)
    for line in skipped:
        print(f"skipped: {line}")
    table = StudyTable(study, launcher)
    locks = OutputLocks()
    if not args.dry_run:
        claim_output(study)
        # one sweep writes an output at a time: a second on the same study.output is refused, naming the holder
        taken = locks.take(study.output / "results.csv", "study.output", overwrite=False)
        if taken:
            raise StudyError(f"{study.source}: {taken}")
    try:
        return _sweep(study, args, runs, launcher, table)
    finally:
        locks.release()


def _sweep(study: Study, args: argparse.Namespace, runs: list[Run], launcher: str, table: StudyTable) -> int:
    """The sweep itself (its output locked unless a dry run): collect only, show, or run what is not done."""
    if args.collect_only:
        for run in runs:
            table.add(run)
        count = table.write_csv(runs)
        table.write_raw(runs)
        print(f"collected {count} finished run(s) into {study.output / 'results.csv'}")
        return 0
    print(f"study {study.name}: {len(runs)} run(s), {study.scaling} scaling, launcher {launcher}, "
          f"output {study.output}", flush=True)
    failures: list[str] = []
    prepared: set[Path] = set()
    width = len(str(len(runs)))
    for index, run in enumerate(runs, 1):
        label = f"[{index:>{width}}/{len(runs)}] {run.run_id}"
        data_dir = study.prepared_dir(run)
        if args.dry_run:
            print(label)
            if run.dataset.path is None and data_dir not in prepared:
                print("    " + " ".join(prepare_command(study, run)))
                prepared.add(data_dir)
            print("    " + " ".join(run_command(study, run, launcher)))
            continue
        if table.add(run) is not None:
            print(f"{label}  done before, skipped", flush=True)
            continue
        if run.dataset.path is None and not (data_dir / "meta.json").is_file() and data_dir not in prepared:
            print(f"{label}  preparing {data_dir} ...", flush=True)
            rc, seconds = _execute(prepare_command(study, run), study.data_dir / f"{run.data_name}.prepare.log",
                                   study.timeout)
            if rc != 0:
                failures.append(f"prepare {run.data_name}")
                print(f"{label}  FAILED to prepare the dataset (see {study.data_dir / (run.data_name + '.prepare.log')})"
                      f"\n{_tail(study.data_dir / f'{run.data_name}.prepare.log')}", flush=True)
                prepared.add(data_dir)
                continue
        prepared.add(data_dir)
        if not (data_dir / "meta.json").is_file():
            failures.append(run.run_id)
            print(f"{label}  FAILED: {data_dir} is not a prepared dataset", flush=True)
            continue
        rc, seconds = _execute(run_command(study, run, launcher), study.log_file(run),
                               study.timeout + (EMULATE_GRACE if run.bandwidth is not None else 0.0))
        row = table.add(run) if rc == 0 else None
        if row is not None:
            shown = f"  test {row['final_test']:.4f}" if row["final_test"] is not None else ""
            print(f"{label}  ran {seconds:.1f} s, epoch {row['epoch_time']:.4f} s{shown}", flush=True)
        else:
            failures.append(run.run_id)
            why = "timed out" if rc is None else f"exit {rc}"
            print(f"{label}  FAILED ({why}; log {study.log_file(run)})\n{_tail(study.log_file(run))}", flush=True)
        table.write_csv(runs)
    if args.dry_run:
        return 0
    count = table.write_csv(runs)
    table.write_raw(runs)
    print(f"collected {count} finished run(s) into {study.output / 'results.csv'} and runs.jsonl")
    if failures:
        print(f"{len(failures)} run(s) failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0
