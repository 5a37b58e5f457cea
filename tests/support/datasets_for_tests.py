"""Small datasets the tests write as shards (no project code beyond the shard writer under test)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from runners.data.datasets import GraphData
from runners.data.planetoid import BUILTIN_PLANETOID, load_planetoid
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



def across_halves(n: int = 2000, classes: int = 4, degree: int = 8, across: float = 0.8, width: int = 16,
                  noise: float = 1.0, seed: int = 0) -> GraphData:
    """A graph whose information crosses the cut: nodes ``[0, n/2)`` and ``[n/2, n)`` are the two halves (parts
    of the ``block`` partitioner at 2 parts); each node draws ``degree`` neighbours, each of its own class in the
    other half with probability ``across`` (else any node of its own half), symmetrised. Features are the class's
    centre plus Gaussian noise of ``noise`` standard deviations, so that alone they classify poorly and the
    neighbours across the cut carry the labels. Splits 20 / 40 / 40 % at random."""
    rng = np.random.default_rng(seed)
    half = n // 2
    labels = rng.integers(0, classes, n)
    side = (np.arange(n) >= half).astype(np.int64)
    members = {(s, c): np.flatnonzero((side == s) & (labels == c)) for s in (0, 1) for c in range(classes)}
    rows = np.repeat(np.arange(n), degree)
    crossing = rng.random(rows.size) < across
    columns = np.where(side[rows] == 0, rng.integers(0, half, rows.size), rng.integers(half, n, rows.size))
    for (s, c), pool in members.items():  # a crossing draw: the node's class, in the other half
        chosen = crossing & (side[rows] == 1 - s) & (labels[rows] == c)
        columns[chosen] = rng.choice(pool, int(chosen.sum()))
    adjacency = sp.csr_matrix((np.ones(rows.size), (rows, columns)), shape=(n, n))
    adjacency = ((adjacency + adjacency.T) > 0).astype(np.float64).tocsr()
    adjacency.setdiag(0)
    adjacency.eliminate_zeros()
    centres = rng.normal(size=(classes, width))
    features = (centres[labels] + noise * rng.normal(size=(n, width))).astype(np.float32)
    split = rng.random(n)
    masks = {"train": split < 0.2, "val": (split >= 0.2) & (split < 0.6), "test": split >= 0.6}
    return GraphData("across-halves", adjacency, features, labels, masks, classes)
