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


def decisions(study: Path, row: dict[str, str]) -> str:
    """``sN: count, from epoch E[, to exact][ (gave up)][, epoch B's weights at the end]`` of a guarded run's
    decisions, or '' without any."""
    path = study / "runs" / f"{row['run']}.jsonl"
    final: dict[str, Any] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "final":
            final = record
    guard = final.get("guard") or {}
    taken = guard.get("decisions") or []
    restored = guard.get("restored_at_end")
    at_end = f", epoch {restored['restored_epoch']}'s weights at the end" if restored else ""
    if not taken:
        return f"s{row['seed']}: 0{at_end}" if restored else ""
    exact = " to exact," if str(guard.get("ended_with")) in ("exact", "none") else ""
    gave_up = " (gave up)" if any(d.get("gave_up") for d in taken) else ""
    return f"s{row['seed']}: {len(taken)}, from epoch {taken[0]['epoch']}{exact}{gave_up}".rstrip(",") + at_end


def summary(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.fmean(values):.4f} ± {statistics.pstdev(values):.4f} ({len(values)})"


def main(study: Path) -> None:
    rows = list(csv.DictReader((study / "results.csv").open()))
    finals: dict[tuple[str, int, str, bool], list[float]] = defaultdict(list)
    notes: dict[tuple[str, int, str], list[str]] = defaultdict(list)
    for row in rows:
        key = configuration(row["run"])
        finals[key].append(float(row["final_test"]))
        if key[3]:
            note = decisions(study, row)
            if note:
                notes[key[:3]].append(note)
    print("| graph | P | configuration | guarded (default) | unguarded | guarded - exact | tightenings (seed: count, "
          "first epoch) |")
    print("|---|---|---|---|---|---|---|")
    for graph, ranks, name in sorted({key[:3] for key in finals}):
        guarded, unguarded = finals.get((graph, ranks, name, True), []), finals.get((graph, ranks, name, False), [])
        exact_name = "exact sage" if name.endswith("sage") else "exact"
        exact = finals.get((graph, ranks, exact_name, True), [])
        gap = (f"{100 * (statistics.fmean(guarded) - statistics.fmean(exact)):+.2f} pt"
               if guarded and exact and name != exact_name else "")
        print(f"| {graph} | {ranks} | {name} | {summary(guarded) if guarded else '-'} | "
              f"{summary(unguarded) if unguarded else '-'} | {gap} | {'; '.join(notes[(graph, ranks, name)])} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
