"""Small datasets the tests write as shards (no project code beyond the shard writer under test)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from runners.data.datasets import BUILTIN_PLANETOID, GraphData, load_planetoid
from runners.data.shards import write_shards


def random_directed(n: int = 200, classes: int = 4, seed: int = 0) -> GraphData:
    """A non-symmetric graph with a few isolated nodes and zero feature rows."""
    rng = np.random.default_rng(seed)
    adjacency = sp.random(n, n, density=0.03, format="csr", random_state=rng)
    adjacency.data[:] = 1.0
    features = rng.random((n, 12)).astype(np.float32)
    features[:5] = 0.0
    masks = {split: rng.random(n) < 0.3 for split in ("train", "val", "test")}
    return GraphData("random-directed", adjacency, features, rng.integers(0, classes, n), masks, classes)


def write(data: GraphData, directory: Path, parts: int = 12, partitioner: str = "random") -> Path:
    write_shards(data, directory, parts, partitioner, seed=1)
    return directory


def cora() -> GraphData:
    return load_planetoid(BUILTIN_PLANETOID, "cora")
