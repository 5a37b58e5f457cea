"""A stochastic block model whose classes are its blocks: graphs of a chosen homophily, for accuracy tests on
shapes nobody tuned a policy for (``prepare synthetic --homophily H``).

Every node draws a class uniformly. Each of its ``degree`` out-edges goes, with probability ``homophily``, to a
uniform node of its own class, else to a uniform node of another class (the other class uniform too); the
graph is then symmetrised, so a node's neighbours are of its own class in about ``homophily`` of its edges.
``homophily`` near ``1 / classes`` is a graph without communities; below it, heterophilous (neighbours mostly
of other classes, where a GCN's mean over neighbours is a worse guess than the node's own features); well
above it, ordinary communities, but spread over the whole id range, so no contiguous or METIS partition cuts
few edges: every partition is high-cut.

Features are bag-of-words counts, as :func:`~runners.data.datasets.planted_classes`' (non-negative, so that
training's default row normalisation applies): each node draws ``words`` words, each from its class's own
``features / classes`` words with probability ``signal`` and uniformly otherwise. Splits are uniform random
(10% train, 10% validation, 30% test, as there).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from runners.data.datasets import GraphData, bag_of_words

SBM_SPLIT = (0.1, 0.1, 0.3)
"""Train, validation and test shares of the nodes."""


def stochastic_blocks(nodes: int, classes: int, degree: int, homophily: float, features: int, *,
                      signal: float = 0.2, words: int = 20, seed: int = 0) -> GraphData:
    """The graph of the module docstring: ``nodes`` nodes in ``classes`` blocks, ``degree`` out-edges per node
    before symmetrising (duplicates merged, no self-loops), float32 features."""
    if nodes < classes or classes < 2 or degree < 1 or features < classes or not 0.0 <= homophily <= 1.0:
        raise ValueError(f"stochastic_blocks: need nodes >= classes >= 2, degree >= 1, features >= classes and "
                         f"0 <= homophily <= 1; got {nodes=}, {classes=}, {degree=}, {features=}, {homophily=}")
    rng = np.random.default_rng([seed, 0x5B3])
    labels = rng.integers(0, classes, size=nodes)
    labels[:classes] = np.arange(classes)  # every class holds a node, so every draw below has a target
    by_class = np.argsort(labels, kind="stable")
    starts = np.concatenate(([0], np.cumsum(np.bincount(labels, minlength=classes))))
    sources = np.repeat(np.arange(nodes), degree)
    own = rng.random(sources.size) < homophily
    shift = rng.integers(1, classes, size=sources.size)  # another class: never the source's own
    target_class = np.where(own, labels[sources], (labels[sources] + shift) % classes)
    size = starts[target_class + 1] - starts[target_class]
    targets = by_class[starts[target_class] + (rng.random(sources.size) * size).astype(np.int64)]
    keep = targets != sources
    directed = sp.csr_matrix((np.ones(int(keep.sum()), dtype=np.float32), (sources[keep], targets[keep])),
                             shape=(nodes, nodes))
    adjacency = ((directed + directed.T) > 0).astype(np.float32).tocsr()
    adjacency.sort_indices()
    feature_matrix = bag_of_words(labels, classes, features, words, signal, rng)
    draw = rng.random(nodes)
    train, val, test = SBM_SPLIT
    masks = {"train": draw < train, "val": (draw >= train) & (draw < train + val),
             "test": (draw >= train + val) & (draw < train + val + test)}
    return GraphData(name=f"sbm-{nodes}-h{homophily:g}", adjacency=adjacency, features=feature_matrix,
                     labels=labels.astype(np.int64), masks=masks, num_classes=classes)


def measured_homophily(data: GraphData) -> float:
    """The share of the adjacency's entries whose two ends share a class (edge homophily)."""
    coo = data.adjacency.tocoo()
    if coo.nnz == 0:
        return float("nan")
    return float(np.mean(data.labels[coo.row] == data.labels[coo.col]))
