"""The shipped ``emulated-policies-smoke.toml`` under ``sparse-dist sweep`` over emulated nodes (as root; skipped
with the reason elsewhere): the crossing of policies, compression and bandwidths, the ``compress`` column, the
bytes each policy moves, resume, and the figures ``plot`` draws against bandwidth. No timing assertions."""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import pytest
from emulation import needs_namespaces
from mpirun import BIN, ROOT

SPARSE_DIST = str(BIN / "sparse-dist")
SMOKE = ROOT / "runners" / "study" / "studies" / "emulated-policies-smoke.toml"


def _sweep(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([SPARSE_DIST, "sweep", str(SMOKE)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
@needs_namespaces
def test_smoke_study_crosses_policies_compression_and_bandwidths(tmp_path: Path) -> None:
    result = _sweep(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    output = tmp_path / "results" / "emulated-policies-smoke"
    with open(output / "results.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((r["policy"], r["compress"], r["bandwidth"]) for r in rows) == sorted(
        (policy, compress, bandwidth) for policy, compress in (("exact", "none"), ("exact", "fp16"))
        for bandwidth in ("unlimited", "1gbit"))
    assert all(r["world_size"] == "2" and r["plan"] == "p2p" and r["epochs"] == "3" for r in rows)
    by = {(r["policy"], r["compress"], r["bandwidth"]): r for r in rows}
    assert by[("exact", "fp16", "1gbit")]["run"].endswith("_p2p_exact_fp16_s0_bw1gbit")
    for bandwidth in ("unlimited", "1gbit"):
        exact = float(by[("exact", "none", bandwidth)]["exchange_bytes"])
        fp16 = float(by[("exact", "fp16", bandwidth)]["exchange_bytes"])
        # 2 bytes a value instead of 4, plus a 2-byte exponent a row: rows of width w travel as (2 w + 2) / (4 w) of
        # exact's bytes, at most 0.625 of them at the narrowest width here (the 4 classes)
        assert exact > 0 and exact / 2 < fp16 <= exact * (0.5 + 1 / (2 * 4))
    for key in by:  # the network changes no arithmetic: the same bytes and accuracy at every bandwidth
        other = by[(key[0], key[1], "1gbit" if key[2] == "unlimited" else "unlimited")]
        assert (by[key]["exchange_bytes"], by[key]["final_test"]) == (other["exchange_bytes"], other["final_test"])
    best = max(float(by[("exact", "none", b)]["best_val"]) for b in ("unlimited", "1gbit"))
    for row in rows:  # every run races to 0.98 x the uncompressed exact run's best, fp16's own best aside
        assert float(row["target_acc"]) == pytest.approx(0.98 * best)
    for row in rows:
        assert (output / "runs" / f"{row['run']}.network.json").is_file()

    again = _sweep(tmp_path)  # resume: every run is complete, none is launched again
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("done before, skipped") == 4 and " ran " not in again.stdout

    plot = subprocess.run([SPARSE_DIST, "plot", str(output), "--dpi", "40"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert plot.returncode == 0, plot.stderr
    drawn = {Path(line).name for line in plot.stdout.split()}
    assert {"tta-bandwidth.png", "epoch-time-bandwidth.png", "exchange-bandwidth.png",
            "exchange-wait-bandwidth.png"} <= drawn
