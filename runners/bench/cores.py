"""``sparse-dist bench cores``: what a node's cores give, ranks x threads, with dropout and without.

A driver, not an MPI job: for each node split ``R x T``, ranks x threads (``--node-splits``; default from the cores
this process may use: ``1 x 1``, ``R x 1`` for every power of two ``R`` up to the cores, ``1 x C`` and ``C/2 x 2``),
and each dropout of
``--dropouts`` it launches ``mpiexec -n R sparse-dist train --threads T`` on the dataset and reads the run's epoch
records. A split's step is the median over epochs 3 to ``--epochs`` of the slowest rank's ``time.total``; beside it
the slowest rank's ``masks + dropout``, ``exchange`` (own seconds) and ``exchange_wait`` (waiting for late
partners), each the median of the same epochs. Speed-up is ``1 x 1``'s step over the split's; efficiency the
speed-up per core. Runs go one after another (timing is the point), each under ``--timeout``; the JSON keeps the
load average when the bench started, the code's commit and the machine's cores beside the rows.

``--synthetic NODES``: the planted-class graph (as ``prepare synthetic --degree 15 --features 128 --classes 47``)
in as many METIS parts as the largest ``R``, written under ``--scratch`` and removed at the end (this command
wrote it); ``--data``: a prepared dataset whose parts every ``R`` divides. ``--out``: the table as JSON (written to
a temporary name, then renamed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runners.argtypes import at_least
from runners.launcher_path import find_mpiexec
from runners.perf.node_split import NodeSplit
from runners.results import code_provenance
from runners.study.collect import write_atomically

WARMUP_EPOCHS = 2
"""Epochs left out of every median (the first allocates, the second settles the allocator)."""


@dataclass(frozen=True)
class NodeSplitRun:
    """One split at one dropout: medians of its timed epochs, seconds (the slowest rank's). ``dropout_part``: the
    median of ``masks + dropout``; ``parts``: the median of every part the epoch records time (``local_spmm``,
    ``dense``, ``masks``, ``dropout``, ``exchange``, ``exchange_wait``, ...), each its own median (so they need not
    sum to ``step``)."""

    ranks: int
    threads: int
    dropout: float
    step: float
    dropout_part: float
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def exchange(self) -> float:
        """Own seconds in the exchanges (the wait for late partners apart)."""
        return self.parts.get("exchange", 0.0)

    @property
    def exchange_wait(self) -> float:
        """Seconds waiting in the exchanges for late partners."""
        return self.parts.get("exchange_wait", 0.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", help="a prepared dataset whose parts every split's ranks divide")
    source.add_argument("--synthetic", type=at_least(2), help="nodes of a planted-class graph made for the bench")
    parser.add_argument("--node-splits", default=None,
                        help="comma-separated RxT (ranks x threads), e.g. 1x1,8x1,1x16,8x2 (default: from the cores "
                             "this process may use, module docstring)")
    parser.add_argument("--dropouts", default="0.5,0", help="comma-separated dropouts (default: %(default)s)")
    parser.add_argument("--epochs", type=at_least(WARMUP_EPOCHS + 1), default=8,
                        help="epochs a run; the medians take epochs 3 on (default: %(default)s)")
    parser.add_argument("--hidden", type=at_least(1), default=128, help="hidden width (default: %(default)s)")
    parser.add_argument("--layers", type=at_least(1), default=3, help="layers (default: %(default)s)")
    parser.add_argument("--timeout", type=at_least(1), default=600, help="seconds a run (default: %(default)s)")
    parser.add_argument("--scratch", default=None, help="where --synthetic's graph is written (default: the "
                                                        "system's temporary directory)")
    parser.add_argument("--out", default=None, help="the table as JSON")


def default_node_splits(cores: int) -> list[NodeSplit]:
    """``1 x 1``, ``R x 1`` for powers of two ``R <= cores``, ``1 x cores`` and ``cores/2 x 2`` (even cores, >= 4):
    the splits a node's scaling is read from, fewer than every divisor (:func:`runners.perf.node_split.node_splits`)
    so that the bench fits in minutes."""
    splits = [NodeSplit(1, 1)]
    ranks = 2
    while ranks <= cores:
        splits.append(NodeSplit(ranks, 1))
        ranks *= 2
    splits.append(NodeSplit(1, cores))
    if cores % 2 == 0 and cores >= 4:
        splits.append(NodeSplit(cores // 2, 2))
    return list(dict.fromkeys(splits))


def parse_node_splits(text: str) -> list[NodeSplit]:
    """``"1x1,8x2"`` -> ``[NodeSplit(1, 1), NodeSplit(8, 2)]``; a ValueError in one sentence for anything else."""
    splits = []
    for item in text.split(","):
        ranks, sep, threads = item.strip().lower().partition("x")
        if not sep or not ranks.isdigit() or not threads.isdigit() or int(ranks) < 1 or int(threads) < 1:
            raise ValueError(f"--node-splits: {item.strip()!r} is not RxT with R, T >= 1 (e.g. 8x2)")
        splits.append(NodeSplit(int(ranks), int(threads)))
    return splits


def read_node_split_run(path: Path, ranks: int, threads: int, dropout: float) -> NodeSplitRun:
    """The medians of a train results file's epoch records after :data:`WARMUP_EPOCHS`."""
    epochs = [record for record in map(json.loads, path.read_text().splitlines())
              if record.get("type") == "epoch" and record["epoch"] > WARMUP_EPOCHS]
    if not epochs:
        raise ValueError(f"{path}: no epoch past the first {WARMUP_EPOCHS}")

    def median(*parts: str) -> float:
        return statistics.median(sum(record["time"].get(part, {}).get("max", 0.0) for part in parts)
                                 for record in epochs)

    names = sorted({name for record in epochs for name in record["time"]} - {"total"})
    return NodeSplitRun(ranks, threads, dropout, median("total"), median("masks", "dropout"),
                        {name: median(name) for name in names})


def _prepare(nodes: int, parts: int, scratch: Path) -> Path:
    out = scratch / "graph"
    subprocess.run([sys.executable, "-m", "runners.cli", "prepare", "synthetic", "--nodes", str(nodes), "--degree",
                    "15", "--features", "128", "--classes", "47", "--parts", str(parts), "--out", str(out)],
                   check=True, capture_output=True, text=True, timeout=3600)
    return out


def _run(mpiexec: str, data: Path, ranks: int, threads: int, dropout: float, args: argparse.Namespace,
         out: Path) -> NodeSplitRun:
    command = [mpiexec, "-n", str(ranks), sys.executable, "-m", "runners.cli", "train", "--data", str(data),
               "--threads", str(threads), "--dropout", f"{dropout:g}", "--epochs", str(args.epochs),
               "--eval-every", str(args.epochs * 10), "--hidden", str(args.hidden), "--layers", str(args.layers),
               "--seed", "0", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout,
                          env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise RuntimeError(f"{ranks} x {threads} at dropout {dropout:g} ended {done.returncode}: {said}")
    return read_node_split_run(out, ranks, threads, dropout)


def table(runs: list[NodeSplitRun]) -> list[dict[str, Any]]:
    """A row per split and dropout with its speed-up and efficiency against ``1 x 1`` at the same dropout."""
    single = {run.dropout: run.step for run in runs if run.ranks == run.threads == 1}
    rows = []
    for run in runs:
        row: dict[str, Any] = {**asdict(run), "exchange": run.exchange, "exchange_wait": run.exchange_wait}
        base = single.get(run.dropout)
        row["speedup"] = base / run.step if base else None
        row["efficiency"] = base / run.step / (run.ranks * run.threads) if base else None
        row["dropout_share"] = run.dropout_part / run.step
        rows.append(row)
    return rows


def main(comm: object, args: argparse.Namespace) -> int:
    try:
        splits = (parse_node_splits(args.node_splits) if args.node_splits
                  else default_node_splits(len(os.sched_getaffinity(0))))
        dropouts = [float(item) for item in args.dropouts.split(",")]
    except ValueError as exc:
        print(f"sparse-dist bench cores: error: {exc}", file=sys.stderr)
        return 2
    load_at_start = os.getloadavg()[0]
    mpiexec = find_mpiexec()
    if mpiexec is None:
        print("sparse-dist bench cores: error: no mpiexec beside the Python interpreter or on PATH", file=sys.stderr)
        return 2
    scratch = Path(tempfile.mkdtemp(prefix="sparse-dist-cores-", dir=args.scratch))
    try:
        largest = max(split.ranks_per_node for split in splits)
        data = _prepare(args.synthetic, largest, scratch) if args.synthetic else Path(args.data)
        runs = []
        for split in splits:
            ranks, threads = split.ranks_per_node, split.threads
            for dropout in dropouts:
                run = _run(mpiexec, data, ranks, threads, dropout, args, scratch / f"r{ranks}t{threads}d{dropout:g}")
                print(f"{ranks:>3} x {threads:<3} dropout {dropout:<4g} step {run.step:.3f} s, masks + dropout "
                      f"{run.dropout_part:.3f} s, exchange {run.exchange:.3f} s, wait {run.exchange_wait:.3f} s",
                      flush=True)
                runs.append(run)
    except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired, ValueError) as exc:
        print(f"sparse-dist bench cores: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    rows = table(runs)
    _print_table(rows)
    if args.out:
        record = {"command": "bench cores", "argv": sys.argv, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "code": code_provenance(), "cpu_count": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)),
                  "load_at_start": load_at_start, "rows": rows}
        write_atomically(Path(args.out), lambda handle: json.dump(record, handle, indent=1))
    return 0


def _print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'ranks x threads':<16}{'dropout':>8}{'step s':>9}{'dropout s':>10}{'share':>7}{'exchange s':>11}"
          f"{'wait s':>8}{'speed-up':>9}{'eff':>6}")
    for row in rows:
        speedup = f"{row['speedup']:.2f}" if row["speedup"] else "-"
        efficiency = f"{row['efficiency']:.2f}" if row["efficiency"] else "-"
        print(f"{row['ranks']:>3} x {row['threads']:<10}{row['dropout']:>8g}{row['step']:>9.3f}"
              f"{row['dropout_part']:>10.3f}{row['dropout_share']:>7.0%}{row['exchange']:>11.3f}"
              f"{row['exchange_wait']:>8.3f}{speedup:>9}{efficiency:>6}")
    steps = {(row["ranks"], row["threads"], row["dropout"]): row["step"] for row in rows}
    for (ranks, threads, dropout), step in steps.items():
        if dropout > 0 and (ranks, threads, 0.0) in steps:
            print(f"{ranks} x {threads}: dropout {dropout:g} step / dropout 0 step = "
                  f"{step / steps[(ranks, threads, 0.0)]:.2f}")


__all__ = ["NodeSplitRun", "add_arguments", "default_node_splits", "main", "parse_node_splits", "read_node_split_run",
           "table"]
