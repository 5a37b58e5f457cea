"""Write a tiny node-property dataset in OGB's on-disk layout (as the OGB zip unpacks)."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np


def _write_csv(path: Path, rows: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as handle:
        for row in np.atleast_2d(rows) if rows.ndim > 1 else rows[:, None]:
            handle.write(",".join(str(v) for v in row) + "\n")


def write_tiny_arxiv(root: Path, n: int = 30, seed: int = 0) -> Path:
    """``root/ogbn_arxiv`` with n nodes, directed edges, 4 features, 40 classes, OGB's 'time' split."""
    rng = np.random.default_rng(seed)
    directory = root / "ogbn_arxiv"
    edges = rng.integers(0, n, size=(3 * n, 2))
    _write_csv(directory / "raw" / "edge.csv.gz", edges)
    _write_csv(directory / "raw" / "num-node-list.csv.gz", np.array([n]))
    _write_csv(directory / "raw" / "num-edge-list.csv.gz", np.array([len(edges)]))
    _write_csv(directory / "raw" / "node-feat.csv.gz", rng.standard_normal((n, 4)).round(4))
    _write_csv(directory / "raw" / "node-label.csv.gz", rng.integers(0, 40, n))
    _write_csv(directory / "raw" / "node_year.csv.gz", rng.integers(2000, 2020, n))
    order = rng.permutation(n)
    for name, part in zip(("train", "valid", "test"), np.split(order, [n // 2, 3 * n // 4])):
        _write_csv(directory / "split" / "time" / f"{name}.csv.gz", np.sort(part))
    (directory / "RELEASE_v1.txt").write_text("tiny test copy\n")
    return directory
