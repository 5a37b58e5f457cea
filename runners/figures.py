"""The figures of ``sparse-dist plot`` (matplotlib, Agg); :mod:`runners.plot_cmd` lists them and imports
this module only when it draws, so no other command pays for importing matplotlib."""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from algorithms.policies import AxisSpec  # noqa: E402
from runners.emulate.network import parse_bandwidth  # noqa: E402
from runners.study.collect import SPREAD_COLUMNS, ResultsError, read_csv  # noqa: E402
from runners.time_to_accuracy import curve  # noqa: E402

PARTS = (("t_local_spmm", "local SpMM"), ("t_dense", "dense"), ("t_exchange", "exchange"),
         ("t_exchange_wait", "exchange wait"), ("t_allreduce", "allreduce"), ("t_allreduce_wait", "allreduce wait"))
WAITS = ("t_exchange_wait", "t_allreduce_wait")
"""Waits for late partners (``sparse_dist.comm``'s "Waits"): drawn hatched; 0 where a table predates them (its
``t_exchange`` and ``t_allreduce`` hold them)."""


def _part(row: dict[str, Any], key: str) -> float:
    """A breakdown column of ``row`` (a wait missing from an older table: 0)."""
    value = row.get(key)
    return 0.0 if value is None and key in WAITS else float(value)


def label(row: dict[str, Any]) -> str:
    """``plan policy`` (``p2p fp16`` for a compressed exact run, ``p2p bns:p=0.1 + int8`` otherwise)."""
    c = f", c={row['replication']}" if int(row["replication"]) > 1 else ""
    c = f" {row['variant']}{c}" if row.get("variant") else c
    compress = str(row.get("compress") or "none")
    if compress == "none":
        return f"{row['plan']} {row['policy']}{c}"
    return f"{row['plan']} {compress if row['policy'] == 'exact' else row['policy'] + ' + ' + compress}{c}"


def _series(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows per configuration (dataset, plan, policy, c), sorted by P; seeds averaged. A study of several
    datasets names each line ``dataset: plan policy`` (one line per dataset, never one across them)."""
    grouped: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[(row["dataset"], label(row), int(row["world_size"]))].append(row)
    several = len({row["dataset"] for row in rows}) > 1
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for (dataset, name, _), runs in sorted(grouped.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        merged = dict(runs[0])
        for key in ("epoch_time", "exchange_bytes"):
            merged[key] = float(np.mean([float(r[key]) for r in runs]))
        for key, _ in PARTS:
            merged[key] = float(np.mean([_part(r, key) for r in runs]))
        merged.update(_pooled_spread(runs))
        series[f"{dataset}: {name}" if several else name].append(merged)
    return series


def _pooled_spread(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """A configuration's epoch-time spread over its runs (seeds): the median of their medians, the least min and the
    largest max; None where a results table predates these columns."""
    if any(r.get(key) in (None, "") for r in runs for key in SPREAD_COLUMNS):
        return dict.fromkeys(SPREAD_COLUMNS)
    return {"epoch_time_median": float(np.median([float(r["epoch_time_median"]) for r in runs])),
            "epoch_time_min": min(float(r["epoch_time_min"]) for r in runs),
            "epoch_time_max": max(float(r["epoch_time_max"]) for r in runs)}


def ideal_times(ranks: np.ndarray, times: np.ndarray, scaling: str) -> np.ndarray:
    """Perfect scaling from a series' first point: ``T_first * P_first / P`` (strong), ``T_first`` (weak)."""
    return times[0] * ranks[0] / ranks if scaling == "strong" else np.full(ranks.shape, times[0])


def plot_scaling(rows: list[dict[str, Any]], scaling: str, path: Path, dpi: int) -> None:
    fig, (ax_time, ax_eff) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = _series(rows)
    spread = all(r["epoch_time_median"] is not None for runs in series.values() for r in runs)
    for name, runs in series.items():
        ranks = np.array([int(r["world_size"]) for r in runs])
        times = np.array([r["epoch_time_median"] if spread else r["epoch_time"] for r in runs])
        line, = ax_time.plot(ranks, times, marker="o", ls=_style(runs[0]), label=name)
        if spread:  # whiskers: the fastest and slowest timed epoch of the point's runs
            ax_time.errorbar(ranks, times, yerr=[times - np.array([r["epoch_time_min"] for r in runs]),
                                                 np.array([r["epoch_time_max"] for r in runs]) - times],
                             fmt="none", capsize=3, color=line.get_color(), lw=0.9)
        ax_time.plot(ranks, ideal_times(ranks, times, scaling), ls=":", lw=0.9, color=line.get_color())
        if ranks[0] == 1 or scaling == "weak":
            base = times[0] * (ranks[0] if scaling == "strong" else 1)
            efficiency = base / (ranks * times) if scaling == "strong" else base / times
            ax_eff.plot(ranks, efficiency, marker="o", ls=_style(runs[0]), color=line.get_color(), label=name)
    all_ranks = sorted({int(r["world_size"]) for r in rows})
    for ax in (ax_time, ax_eff):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_ranks, [str(p) for p in all_ranks])
        ax.set_xlabel("MPI ranks P")
        ax.grid(True, which="both", alpha=0.3)
    ax_time.set_yscale("log")
    ax_time.set_ylabel("epoch s, slowest rank" + (" (median; bars: min, max)" if spread else " (mean)"))
    sizes = sorted({int(r["nodes"]) for r in rows if r.get("nodes")})
    what = f"{sizes[0]:,} nodes" if scaling == "strong" and len(sizes) == 1 else \
        f"{sizes[0]:,} to {sizes[-1]:,} nodes" if sizes else ""
    datasets = ", ".join(sorted({str(r["dataset"]) for r in rows}))
    ax_time.set_title(f"{scaling} scaling: epoch time ({datasets}, {what}; dotted: ideal)", fontsize=9)
    ax_time.legend(fontsize=7, loc="upper left")
    ax_eff.set_ylabel("parallel efficiency" + (" T1/(P TP)" if scaling == "strong" else " T1/TP"))
    ax_eff.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax_eff.set_ylim(0, 1.2)
    ax_eff.set_title(f"{scaling} scaling: parallel efficiency")
    ax_eff.legend(fontsize=7, loc="lower left")
    for ax in (ax_time, ax_eff):
        _shade_oversubscribed(ax, rows)
    _note_threads(fig, rows)
    _save(fig, path, dpi)


def _note_threads(fig: plt.Figure, rows: list[dict[str, Any]]) -> None:
    threads = sorted({r["threads_per_rank"] for r in rows if r.get("threads_per_rank") is not None})
    cpus = sorted({r["cpu_count"] for r in rows if r.get("cpu_count")})
    text = f"threads per rank: {', '.join(map(str, threads))}" if threads else ""
    if cpus:
        text += f"; CPUs per node: {', '.join(map(str, cpus))}"
    fig.text(0.01, 0.01, text + "; warm-up epochs excluded", fontsize=7, color="grey")


def oversubscribed(row: dict[str, Any]) -> bool:
    """More threads on the node than it has CPUs (known from newer results files only)."""
    if not row.get("cpu_count") or not row.get("ranks_on_node") or not row.get("threads_per_rank"):
        return False
    return int(row["ranks_on_node"]) * int(row["threads_per_rank"]) > int(row["cpu_count"])


def _shade_oversubscribed(ax: plt.Axes, rows: list[dict[str, Any]]) -> None:
    crowded = sorted({int(r["world_size"]) for r in rows if oversubscribed(r)})
    if crowded:
        ax.axvspan(crowded[0] / 2 ** 0.25, max(crowded) * 2 ** 0.25, color="grey", alpha=0.12, lw=0)
        ax.text(crowded[0], ax.get_ylim()[0], " more threads than CPUs", fontsize=7, color="dimgrey",
                va="bottom", ha="left")


STYLES = {"exact": "-", "bns": "--", "sancus-e": ":", "sancus-a": ":", "sancus-h": "-."}


def _style(row: dict[str, Any]) -> Any:
    if str(row.get("compress") or "none") != "none":
        return (0, (6, 2, 1, 2))  # compressed: dash-dot, apart from every policy's own style
    return STYLES.get(str(row["policy"]).split(":")[0].split("+")[0], "-")


def plot_breakdown(rows: list[dict[str, Any]], path: Path, dpi: int) -> None:
    series = _series(rows)
    bars = [(name, run) for name, runs in series.items() for run in runs]
    # one cluster of bars per configuration, a gap between clusters
    positions, x = [], 0.0
    for index, (name, run) in enumerate(bars):
        if index and name != bars[index - 1][0]:
            x += 0.6
        positions.append(x)
        x += 1.0
    fig, ax = plt.subplots(figsize=(max(6.0, 0.42 * x + 2), 4.6))
    bottom = np.zeros(len(bars))
    for key, name in PARTS:
        values = np.array([run[key] for _, run in bars])
        ax.bar(positions, values, bottom=bottom, label=name, hatch="//" if key in WAITS else None)
        bottom += values
    ax.set_xticks(positions, [f"{name}  P={run['world_size']}" for name, run in bars], rotation=75,
                  ha="right", fontsize=7)
    ax.set_ylabel("seconds per epoch (mean over ranks)")
    ax.set_title("epoch time breakdown per configuration")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    _note_threads(fig, rows)
    _save(fig, path, dpi)


def plot_bytes(rows: list[dict[str, Any]], path: Path, dpi: int) -> None:
    series = _series(rows)
    ranks = sorted({int(r["world_size"]) for r in rows if int(r["world_size"]) > 1})
    if not ranks:
        return
    fig, ax = plt.subplots(figsize=(9, 4.4))
    width = 0.8 / max(len(series), 1)
    for k, (name, runs) in enumerate(series.items()):
        by_p = {int(r["world_size"]): r["exchange_bytes"] for r in runs}
        values = [by_p.get(p, np.nan) / 1e6 for p in ranks]
        ax.bar(np.arange(len(ranks)) + (k - (len(series) - 1) / 2) * width, values, width, label=name)
    ax.set_xticks(range(len(ranks)), [f"P={p}" for p in ranks])
    ax.set_yscale("log")
    ax.set_ylabel("exchange MB per epoch (all ranks, forward + backward)")
    ax.set_title("communication volume per plan and policy")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    _save(fig, path, dpi)


def _epochs_by_run(directory: Path) -> dict[str, list[dict[str, Any]]]:
    raw = directory / "runs.jsonl"
    if not raw.is_file():
        raise ResultsError(f"{raw}: missing (run `sparse-dist sweep` to collect it)")
    epochs: dict[str, list[dict[str, Any]]] = defaultdict(list)
    with open(raw) as handle:
        for line in handle:
            record = json.loads(line)
            if record.get("type") == "epoch":
                epochs[record["run"]].append(record)
    return epochs


def plot_accuracy(rows: list[dict[str, Any]], epochs: dict[str, list[dict[str, Any]]], path: Path, dpi: int) -> bool:
    largest = max(int(r["world_size"]) for r in rows)
    chosen = [r for r in rows if int(r["world_size"]) == largest and int(r["seed"]) == min(int(x["seed"]) for x in rows)]
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    drawn = False
    for row in chosen:
        records = [e for e in epochs.get(row["run"], []) if "test_acc" in e or "test_f1" in e]
        if not records:
            continue
        key = "test_acc" if "test_acc" in records[0] else "test_f1"
        ax.plot([e["epoch"] for e in records], [e[key] for e in records], label=label(row), lw=1.2, ls=_style(row))
        drawn = True
    if not drawn:
        plt.close(fig)
        return False
    ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"test accuracy per epoch, P={largest} ({chosen[0]['dataset']}); exact runs coincide")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, path, dpi)
    return True


def plot_sancus(rows: list[dict[str, Any]], epochs: dict[str, list[dict[str, Any]]], path: Path, dpi: int) -> bool:
    largest = max(int(r["world_size"]) for r in rows)
    chosen = [r for r in rows if int(r["world_size"]) == largest
              and not AxisSpec.parse("stale", r["stale"] or "none").is_none and epochs.get(r["run"])]
    if not chosen:
        return False
    fig, axes = plt.subplots(len(chosen), 1, figsize=(9, 1.2 + 1.6 * len(chosen)), squeeze=False)
    for ax, row in zip(axes[:, 0], chosen):
        records = epochs[row["run"]]
        groups = int(row["world_size"]) // int(row["replication"])
        layers = sorted({d["layer"] for e in records for d in e["broadcasts"]})
        grid = np.full((len(layers) * groups, len(records)), np.nan)
        for column, record in enumerate(records):
            for decision in record["broadcasts"]:
                base = layers.index(decision["layer"]) * groups
                grid[base:base + groups, column] = 0.0
                for owner in decision["active"]:
                    grid[base + owner, column] = 1.0
        ax.imshow(grid, aspect="auto", cmap="Blues", vmin=-0.3, vmax=1.0, interpolation="nearest",
                  extent=(0.5, len(records) + 0.5, len(layers) * groups - 0.5, -0.5))
        ax.set_yticks(range(len(layers) * groups),
                      [f"L{layer} owner {j}" for layer in layers for j in range(groups)], fontsize=6)
        sent = np.nansum(grid) / np.sum(~np.isnan(grid))
        ax.set_title(f"{label(row)}, P={largest}: dark = broadcast, light = cached ({sent:.0%} sent)", fontsize=9)
    axes[-1, 0].set_xlabel("epoch")
    fig.tight_layout()
    _save(fig, path, dpi)
    return True


def plot_audit(rows: list[dict[str, Any]], epochs: dict[str, list[dict[str, Any]]], path: Path, dpi: int) -> bool:
    """The audit's per-layer relative errors over epochs; False (nothing written) where no run has audits."""
    largest = max(int(r["world_size"]) for r in rows)
    seed = min(int(r["seed"]) for r in rows)
    audited = {r["run"]: [e for e in epochs.get(r["run"], []) if "audit" in e] for r in rows
               if int(r["world_size"]) == largest and int(r["seed"]) == seed}
    chosen = [r for r in rows if audited.get(r["run"])]
    if not chosen:
        return False
    layers = max(len(e["audit"]["layer_error"]) for r in chosen for e in audited[r["run"]])
    fig, axes = plt.subplots(1, layers, figsize=(4.2 * layers, 3.8), squeeze=False)
    for layer, ax in enumerate(axes[0]):
        for row in chosen:
            points = [(e["epoch"], e["audit"]["layer_error"][layer]) for e in audited[row["run"]]
                      if layer < len(e["audit"]["layer_error"])]
            # exact runs (and exchange-free layers) audit to zero: drawn at the axis floor, not dropped
            ax.plot([p[0] for p in points], [max(p[1], 1e-9) for p in points], marker="o", ms=3, lw=1.2,
                    ls=_style(row), label=label(row))
        ax.set_yscale("log")
        ax.set_xlabel("epoch")
        ax.set_title(f"layer {layer} output", fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0, 0].set_ylabel("relative error vs exact forward")
    axes[0, -1].legend(fontsize=7)
    fig.suptitle(f"audit, P={largest} ({chosen[0]['dataset']}); 1e-9 = exact", fontsize=10)
    _save(fig, path, dpi)
    return True


def _bandwidths(rows: list[dict[str, Any]]) -> list[Any]:
    """The study's bandwidths, slowest first, ``unlimited`` last; ``[None]`` without a ``[network]`` table."""
    found = {r.get("bandwidth") for r in rows}
    if found == {None}:
        return [None]
    return sorted(found - {None}, key=lambda b: parse_bandwidth(str(b)) or float("inf"))


def plot_accuracy_time(rows: list[dict[str, Any]], epochs: dict[str, list[dict[str, Any]]], path: Path,
                       dpi: int) -> bool:
    """Validation accuracy against wall seconds since launch; False (nothing written) where no run has ``wall``."""
    largest = max(int(r["world_size"]) for r in rows)
    seed = min(int(r["seed"]) for r in rows)
    chosen = [r for r in rows if int(r["world_size"]) == largest and int(r["seed"]) == seed
              and curve(epochs.get(r["run"], []))]
    if not chosen:
        return False
    bandwidths = [b for b in _bandwidths(rows) if any(r.get("bandwidth") == b for r in chosen)]
    fig, axes = plt.subplots(1, len(bandwidths), figsize=(6.5 * len(bandwidths), 4.4), squeeze=False, sharey=True)
    for ax, bandwidth in zip(axes[0], bandwidths):
        for row in (r for r in chosen if r.get("bandwidth") == bandwidth):
            points = curve(epochs[row["run"]])
            ax.plot([p[1] for p in points], [p[2] for p in points], lw=1.2, ls=_style(row),
                            label=f"{label(row)} ({row['dataset']})" if len({r["dataset"] for r in chosen}) > 1
                            else label(row))
        for target in {float(r["target_acc"]) for r in chosen if r.get("target_acc") is not None}:
            ax.axhline(target, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("wall seconds since launch (slowest rank, evaluation included)")
        ax.set_title(f"P={largest}" + (f", bandwidth {bandwidth}" if bandwidth is not None else ""), fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0, 0].set_ylabel("validation accuracy")
    axes[0, -1].legend(fontsize=7)
    fig.suptitle(f"validation accuracy against wall time ({', '.join(sorted({r['dataset'] for r in chosen}))}); "
                 "dotted: time-to-accuracy target", fontsize=10)
    _save(fig, path, dpi)
    return True


AGAINST_BANDWIDTH = (
    ("time_to_target", "tta-bandwidth.png", "time to target validation accuracy (s since launch)",
     "time-to-accuracy against bandwidth"),
    ("epoch_time", "epoch-time-bandwidth.png", "epoch time (s, slowest rank, warm-up excluded)",
     "epoch time against bandwidth"),
    ("t_exchange", "exchange-bandwidth.png", "own exchange time (s per epoch, mean over ranks)",
     "own time in the SpMM exchanges (posting, copies, transfer) against bandwidth"),
    ("t_exchange_wait", "exchange-wait-bandwidth.png",
     "exchange wait for late partners (s per epoch, mean over ranks)",
     "time in the SpMM exchanges waiting for partners not yet posted (imbalance) against bandwidth"),
)
"""The ``[network]`` figures: (results.csv column, file, y label, title), one line per plan and policy."""


def plot_against_bandwidth(rows: list[dict[str, Any]], column: str, ylabel: str, title: str, path: Path,
                           dpi: int) -> bool:
    """``column`` against the emulated bandwidth, one line per plan and policy, one panel per dataset and P;
    False (nothing written) without a ``bandwidth`` column or a value of ``column``."""
    networked = [r for r in rows if r.get("bandwidth") is not None and r.get(column) is not None]
    if not networked:
        return False
    bandwidths = _bandwidths(networked)
    positions = {b: k for k, b in enumerate(bandwidths)}  # evenly spaced, slowest left, unlimited right
    panels = sorted({(r["dataset"], int(r["world_size"])) for r in networked})
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.4), squeeze=False)
    for ax, (dataset, ranks) in zip(axes[0], panels):
        grouped: dict[str, dict[Any, list[float]]] = defaultdict(lambda: defaultdict(list))
        styles: dict[str, Any] = {}
        for row in networked:
            if row["dataset"] == dataset and int(row["world_size"]) == ranks:
                grouped[label(row)][row["bandwidth"]].append(float(row[column]))  # seeds averaged
                styles[label(row)] = _style(row)
        for name, by_bandwidth in grouped.items():
            ordered = sorted(by_bandwidth, key=positions.__getitem__)
            ax.plot([positions[b] for b in ordered], [float(np.mean(by_bandwidth[b])) for b in ordered],
                    marker="o", ls=styles[name], label=name)
        ax.set_xticks(range(len(bandwidths)), [str(b) for b in bandwidths])
        ax.set_xlabel("emulated bandwidth per node link")
        if all(float(np.mean(v)) > 0 for values in grouped.values() for v in values.values()):
            ax.set_yscale("log")  # a zero (an exchange-free run) stays on a linear axis
        ax.set_title(f"{dataset}, P={ranks}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0, 0].set_ylabel(ylabel)
    axes[0, -1].legend(fontsize=7)
    if column == "time_to_target":
        targets = sorted({round(float(r["target_acc"]), 4) for r in networked if r.get("target_acc") is not None})
        title += f" (target {', '.join(map(str, targets))}; no point: never reached)"
    fig.suptitle(title, fontsize=10)
    _save(fig, path, dpi)
    return True


def _save(fig: plt.Figure, path: Path, dpi: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.tmp.png")
    fig.tight_layout()
    fig.savefig(temporary, dpi=dpi)
    plt.close(fig)
    temporary.replace(path)


def draw(args: argparse.Namespace) -> int:
    """Every figure :mod:`runners.plot_cmd` lists, for ``args.results`` into ``args.out``; prints each path."""
    directories = [Path(d) for d in args.results]
    rows: list[dict[str, Any]] = []
    epochs: dict[str, list[dict[str, Any]]] = {}
    for directory in directories:
        rows += read_csv(directory / "results.csv")
        epochs.update(_epochs_by_run(directory))
    if not rows:
        raise ResultsError(f"{', '.join(map(str, directories))}: no finished runs to plot")
    out = Path(args.out) if args.out else directories[0] / "figures"
    written: list[Path] = []
    for scaling in ("strong", "weak"):
        subset = [r for r in rows if r["scaling"] == scaling]
        if subset:
            plot_scaling(subset, scaling, out / f"scaling-{scaling}.png", args.dpi)
            written.append(out / f"scaling-{scaling}.png")
    strong_or_all = [r for r in rows if r["scaling"] == "strong"] or rows
    plot_breakdown(strong_or_all, out / "breakdown.png", args.dpi)
    written.append(out / "breakdown.png")
    if any(int(r["world_size"]) > 1 for r in strong_or_all):
        plot_bytes(strong_or_all, out / "bytes.png", args.dpi)
        written.append(out / "bytes.png")
    if plot_accuracy(strong_or_all, epochs, out / "accuracy.png", args.dpi):
        written.append(out / "accuracy.png")
    if plot_sancus(strong_or_all, epochs, out / "sancus-broadcasts.png", args.dpi):
        written.append(out / "sancus-broadcasts.png")
    if plot_audit(strong_or_all, epochs, out / "audit.png", args.dpi):
        written.append(out / "audit.png")
    if plot_accuracy_time(strong_or_all, epochs, out / "accuracy-time.png", args.dpi):
        written.append(out / "accuracy-time.png")
    for column, name, ylabel, title in AGAINST_BANDWIDTH:
        if plot_against_bandwidth(rows, column, ylabel, title, out / name, args.dpi):
            written.append(out / name)
    for path in written:
        print(path)
    return 0
