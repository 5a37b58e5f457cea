"""The convergence suite's table (docs/results.md, "How accurate each policy is"): final test accuracy per
graph, P and configuration, guarded (the default) beside unguarded, against exact at the same P.

Run from the repository root after ``sparse-dist sweep runners/study/studies/convergence.toml``::

    .venv/bin/python docs/convergence_table.py results/convergence

Reads the study's ``results.csv`` (one row per finished run) and each run's JSON lines for the guard's
decisions (the ``final`` record's ``guard``). A configuration is the run name without its seed and without
``_unguarded``; means and standard deviations (population, over the seeds present) are of ``final_test``.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def configuration(run: str) -> tuple[str, int, str, bool]:
    """``(graph, P, configuration, guarded)`` of a run name such as ``cora_P4_c1_p2p_bns_keep=0.1_unguarded_s2``."""
    match = re.fullmatch(r"(?P<graph>[a-z0-9-]+)_P(?P<p>\d+)_c\d+_(?P<rest>.+)_s\d+", run)
    if match is None:
        raise ValueError(f"not a convergence run name: {run!r}")
    rest = match["rest"]
    guarded = "unguarded" not in rest
    rest = rest.replace("_sage-unguarded", "_sage").replace("_unguarded", "")
    rest = re.sub(r"^(p2p|dense-bcast)_", "", rest).replace("_", " ")
    return match["graph"], int(match["p"]), rest, guarded


BIAS_REASON = "under the policy against"
"""Words of the bias signal's reasons (:func:`algorithms.training.bias.strikes`); other reasons are falls."""


def run_records(study: Path, row: dict[str, str]) -> list[dict[str, Any]]:
    path = study / "runs" / f"{row['run']}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def reference_cost(records: list[dict[str, Any]]) -> tuple[int, float] | None:
    """The bias signal's interval K and its readings' seconds (the slowest rank's) over the epochs' seconds, or
    None where it never read."""
    epochs = [r for r in records if r.get("type") == "epoch"]
    seconds = sum(r["guard_reference"]["seconds"]["max"] for r in epochs if r.get("guard_reference"))
    every = next((r["guard_reference"]["every"] for r in epochs if r.get("guard_reference")), 0)
    steps = sum(float(r["time"]["total"]["max"]) for r in epochs if isinstance(r.get("time"), dict))
    return (int(every), seconds / steps) if every and steps > 0 else None


def decisions(records: list[dict[str, Any]], seed: str) -> str:
    """``sN: count (F falls, B bias), from epoch E[, to exact][ (gave up)][, epoch B's weights at the end]`` of a
    guarded run's decisions, or '' without any."""
    final: dict[str, Any] = {}
    for record in records:
        if record.get("type") == "final":
            final = record
    guard = final.get("guard") or {}
    taken = guard.get("decisions") or []
    restored = guard.get("restored_at_end")
    at_end = f", epoch {restored['restored_epoch']}'s weights at the end" if restored else ""
    if not taken:
        return f"s{seed}: 0{at_end}" if restored else ""
    exact = " to exact," if str(guard.get("ended_with")) in ("exact", "none") else ""
    gave_up = " (gave up)" if any(d.get("gave_up") for d in taken) else ""
    bias = sum(BIAS_REASON in str(d.get("reason")) for d in taken)
    kinds = f" ({len(taken) - bias} fall{'s' * (len(taken) - bias != 1)}, {bias} bias)"
    return f"s{seed}: {len(taken)}{kinds}, from epoch {taken[0]['epoch']}{exact}{gave_up}".rstrip(",") + at_end


def summary(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.fmean(values):.4f} ± {statistics.pstdev(values):.4f} ({len(values)})"


def main(study: Path) -> None:
    rows = list(csv.DictReader((study / "results.csv").open()))
    finals: dict[tuple[str, int, str, bool], list[float]] = defaultdict(list)
    notes: dict[tuple[str, int, str], list[str]] = defaultdict(list)
    costs: dict[tuple[str, int, str], list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        key = configuration(row["run"])
        finals[key].append(float(row["final_test"]))
        if key[3]:
            records = run_records(study, row)
            note = decisions(records, row["seed"])
            if note:
                notes[key[:3]].append(note)
            cost = reference_cost(records)
            if cost is not None:
                costs[key[:3]].append(cost)
    print("| graph | P | configuration | guarded (default) | unguarded | guarded - exact | bias reference: K, its "
          "share of the epochs' time | tightenings (seed: count (falls, bias), first epoch) |")
    print("|---|---|---|---|---|---|---|---|")
    for graph, ranks, name in sorted({key[:3] for key in finals}):
        guarded, unguarded = finals.get((graph, ranks, name, True), []), finals.get((graph, ranks, name, False), [])
        exact_name = "exact sage" if name.endswith("sage") else "exact"
        exact = finals.get((graph, ranks, exact_name, True), [])
        gap = (f"{100 * (statistics.fmean(guarded) - statistics.fmean(exact)):+.2f} pt"
               if guarded and exact and name != exact_name else "")
        spent = costs.get((graph, ranks, name), [])
        reference = (f"K {'/'.join(str(k) for k in sorted({k for k, _ in spent}))}, "
                     f"{100 * statistics.fmean(share for _, share in spent):.1f}%" if spent else "")
        print(f"| {graph} | {ranks} | {name} | {summary(guarded) if guarded else '-'} | "
              f"{summary(unguarded) if unguarded else '-'} | {gap} | {reference} | "
              f"{'; '.join(notes[(graph, ranks, name)])} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
