"""Partitioners and partition statistics.

A partitioner returns ``part_of[node]``; :func:`relabel` turns it into the
permutation ``order`` (new id -> original id; nodes of part 0 first, each
part's nodes in original order) and row offsets per part. All are
deterministic for a seed.

* ``auto`` (what ``prepare`` uses unless told): ``metis`` when pymetis
  imports, else ``block`` (:func:`resolve_partitioner` says which, and why).
* ``block``: contiguous balanced ranges of the original ids.
* ``random``: a balanced random assignment: a uniformly random permutation of the node ids (seeded), parts
  its equal contiguous ranges.
* ``permute`` (:func:`permute_partition`), for the grid plans (:mod:`runners.data.grid_balance`): a seeded
  random permutation of the node ids stratified by degree, parts its equal contiguous ranges. What is
  permuted: the node ids, once, for rows and columns alike (the written adjacency is ``P A P^T``); one
  permutation serves both because a layer's output rows are the next layer's input rows and a shard's column
  ids are new ids in the same order. A grid's block ``(i, j)`` (near-equal node ranges) then holds about
  ``e_i e_j / nnz`` entries, ``e_i`` the entries of row block ``i``, so its max/mean is about the square of the
  parts' edge imbalance. How it differs from ``random``: a uniform permutation leaves that edge imbalance to
  the hubs (R-MAT SCALE 20, 8 parts: 1.058, and 1.04-1.12 on the 8 x 8 grid over seeds); ``permute`` deals
  the nodes, by degree from the largest (ties in random order), in rounds of ``parts``, each round to the
  parts in a fresh random order, so every part gets one node of each round and the parts' degree sums differ
  by at most the largest degree (SCALE 20, 8 x 8 grid: 1.02 for seeds 0-2). Within a part, nodes keep their
  input order (:func:`relabel`; the features' one streamed pass, which never holds them all, relies on it):
  blocks whose ranges are whole parts (``R`` and ``C`` dividing ``--parts``) do not depend on it; a grid that
  cuts inside a part inherits the input's order there, which for R-MAT is Graph500's uniformly random one.
  Decision on Plexus's "double permutation" (``plexus/utils/dataset.py``, ``double_perm``): it permutes rows
  and columns by two independent permutations, ``A1 = P1 A P2^T``, keeps a second copy ``A2 = P2 A P1^T`` for
  alternate layers (a layer's output comes out in the other order), features in ``P2``'s order and labels in
  both. For an adjacency stored without self-loops one permutation balances as well: ``P A P^T``'s diagonal
  blocks expect ``(n/R - 1) / (n/R)`` of an off-diagonal block's entries, and the max/mean stays the product
  of the heaviest row and column blocks' shares either way. What two buy is GCN's ``I`` (Plexus normalises
  before permuting): with one order the ``n`` self-loops all land in the ``R`` diagonal blocks (``n / R`` more
  each), with two they spread as a random permutation matrix. Not done here: it needs the adjacency twice,
  layers alternating between two orders and shards that are no longer row ranges of one order. The grid reader
  (:mod:`runners.data.grid_reader`) adds ``I`` into the blocks today; a grid that applied GCN's self term as a
  row-local scaling (``D^-1 H``) beside the block SpMM would not carry it, and
  :class:`runners.data.grid_balance.GridBlocks` reports both ``A`` and ``A + I``.
* ``metis-train``: DistDGL's partitioner, METIS k-way with several balance
  constraints at once (:mod:`runners.data.metis_train`).
* ``bytegnn``: ByteGNN's K-hop blocks around the labelled nodes
  (:mod:`runners.data.bytegnn_partition`).
* ``metis``: METIS k-way through pymetis on the symmetrised graph, with the
  communication-volume objective (``OBJTYPE=VOL``, the bytes a p2p exchange
  moves) and node balance; then training nodes are balanced too (as
  DistDGL does) by :func:`balance_training_nodes`. Decision: DistDGL passes
  training nodes to METIS as a second constraint, but pymetis (2025.2.2)
  offers no ``ncon`` and reads a two-column weight array as one constraint,
  which left both nodes and training nodes 20-30% out of balance in our
  tests; so the second constraint is enforced afterwards by swaps that keep
  the node counts. ``metis-train`` is DistDGL's real multi-constraint METIS,
  reached past pymetis's Python layer (:mod:`runners.data.metis_train`).

:func:`partition_statistics` gives the BNS-GCN Table 1 view of a partition:
per part inner nodes, boundary nodes (rows others need), their ratio,
edges, cut edges (entries whose column another part owns), and the
predicted exchange bytes per plan for one 4-byte feature column (multiply by
the width).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from runners.data.bytegnn_partition import bytegnn_partition
from runners.data.metis_train import (MetisUnavailable, metis_kway, metis_library, metis_train_partition,
                                       symmetric_pattern)
from sparse_dist.layout import Grid, RowLayout
from sparse_dist.plans import PLANS
from sparse_dist.predict import predict_spmm_bytes

PARTITIONERS = ("block", "random", "permute", "metis", "metis-train", "bytegnn")
DEFAULT_HOPS = 2
"""K of ``bytegnn``'s K-hop blocks and of the sampling statistics, unless told."""
AUTO = "auto"


def metis_available() -> bool:
    """Whether pymetis (METIS) imports here."""
    try:
        import pymetis  # noqa: F401
    except ImportError:
        return False
    return True


def metis_train_available() -> bool:
    """Whether METIS's multi-constraint k-way entry point (``metis-train``) can be reached here."""
    try:
        metis_library()
    except MetisUnavailable:
        return False
    return True


def resolve_partitioner(kind: str, contiguous_only: bool = False,
                        skewed_degrees: bool = False) -> tuple[str, str | None]:
    """The partitioner ``kind`` stands for, and a note to print when ``auto`` could not pick METIS.

    ``auto`` is ``metis`` when pymetis imports (a small boundary: fewer bytes per exchange and, for
    the stale policies, better accuracy than contiguous blocks), else ``block``. ``contiguous_only``
    (a streamed graph, written in contiguous blocks) makes ``auto`` mean ``block`` without a note.
    ``skewed_degrees`` (a power-law graph, such as ``prepare rmat``'s) makes ``auto`` mean ``metis-train``
    where METIS's multi-constraint entry point is reachable: METIS balancing vertices alone gives the hubs'
    part most of the edges, and on R-MAT SCALE 20 its slowest rank's local SpMM was 1.6-3.7x the mean at
    P = 2-8 and the epoch 1.15-1.84x metis-train's, which balances the degree too (docs/results.md).
    """
    if kind != AUTO:
        return kind, None
    if contiguous_only:
        return "block", None
    if metis_available():
        if skewed_degrees and metis_train_available():
            return "metis-train", None
        return "metis", None
    return "block", ("pymetis does not import, so the partition is contiguous blocks (--partitioner block); "
                     "install pymetis for METIS")


def _balanced_sizes(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def metis_partition(adjacency: sp.spmatrix, parts: int, seed: int = 0, symmetric: bool = False) -> np.ndarray:
    """METIS k-way with the volume objective and node balance (see the module docstring); ``symmetric``:
    ``adjacency`` is already a symmetric CSR without self-loops, indices sorted, and reaches METIS as it is
    (no symmetrised copy; :func:`runners.data.metis_train.metis_kway` gives METIS the arrays once)."""
    n = adjacency.shape[0]
    if parts == 1:
        return np.zeros(n, dtype=np.int64)
    graph = sp.csr_matrix(adjacency) if symmetric else symmetric_pattern(adjacency)
    return metis_kway(graph.indptr, graph.indices, parts, seed, volume=True)


def balance_training_nodes(adjacency: sp.spmatrix, part_of: np.ndarray, train_mask: np.ndarray,
                           tolerance: float = 0.05, symmetric: bool = False) -> np.ndarray:
    """Swap training and non-training nodes between parts until every part holds at most
    ``(1 + tolerance)`` times its share of training nodes; node counts per part do not change.

    Each swap moves, from the fullest part to the emptiest, the training node
    with the most neighbours there, against the non-training node of that
    part with the most neighbours in the fullest one (greedy, deterministic),
    so the cut grows as little as a greedy choice allows. The undirected pattern (a float64 copy of the
    graph; ``symmetric``: the adjacency's own arrays) is built only when a swap is needed.
    """
    part_of = part_of.copy()
    parts = int(part_of.max()) + 1 if part_of.size else 1
    train_mask = np.asarray(train_mask, dtype=bool)
    share = train_mask.sum() / parts
    limit = int(np.floor(share * (1 + tolerance))) if share else 0
    pattern = None
    for _ in range(int(train_mask.sum()) + 1):
        load = np.bincount(part_of[train_mask], minlength=parts)
        full, empty = int(load.argmax()), int(load.argmin())
        if load[full] <= max(limit, load[empty] + 1):
            break
        if pattern is None:
            if symmetric:
                graph = sp.csr_matrix(adjacency)
                pattern = sp.csr_matrix((np.ones(graph.nnz), graph.indices, graph.indptr), shape=graph.shape)
            else:
                pattern = sp.csr_matrix(adjacency, dtype=np.float64)
                pattern = ((pattern + pattern.T) != 0).astype(np.float64).tocsr()
        in_part = [np.asarray(part_of == k, dtype=np.float64) for k in (full, empty)]
        toward_empty = pattern @ in_part[1]
        toward_full = pattern @ in_part[0]
        movers = np.flatnonzero((part_of == full) & train_mask)
        takers = np.flatnonzero((part_of == empty) & ~train_mask)
        if not movers.size or not takers.size:
            break
        mover = movers[np.argmax(toward_empty[movers])]
        taker = takers[np.argmax(toward_full[takers])]
        part_of[mover], part_of[taker] = empty, full
    return part_of


def partition(kind: str, adjacency: sp.csr_matrix, parts: int, seed: int = 0,
              train_mask: np.ndarray | None = None, masks: dict[str, np.ndarray] | None = None,
              hops: int = DEFAULT_HOPS, symmetric: bool = False) -> np.ndarray:
    """``part_of`` for every node (METIS also balances ``train_mask`` when given).

    ``symmetric``: ``adjacency`` is already a symmetric CSR without self-loops, indices sorted (R-MAT's):
    ``metis`` and ``metis-train`` give it to METIS as it is, without a symmetrised copy.

    ``masks`` (boolean ``train``/``val``/``test``; default: ``train_mask`` alone) are what ``metis-train``
    balances and what ``bytegnn`` grows its ``hops``-hop blocks around.
    """
    n = adjacency.shape[0]
    if parts < 1:
        raise ValueError(f"number of parts must be >= 1, got {parts}")
    if kind in ("metis-train", "bytegnn"):
        if masks is None:
            masks = {"train": np.zeros(n, dtype=bool) if train_mask is None else np.asarray(train_mask, dtype=bool)}
        if kind == "metis-train":
            return metis_train_partition(adjacency, parts, masks, seed, symmetric=symmetric)
        return bytegnn_partition(adjacency, parts, masks, hops, seed)
    if kind == "metis":
        part_of = metis_partition(adjacency, parts, seed, symmetric=symmetric)
        if train_mask is not None and parts > 1:
            part_of = balance_training_nodes(adjacency, part_of, train_mask, symmetric=symmetric)
        return part_of
    balanced = np.repeat(np.arange(parts), _balanced_sizes(n, parts))
    if kind == "block":
        return balanced
    if kind == "random":
        return np.random.default_rng(seed).permutation(balanced)
    if kind == "permute":
        return permute_partition(adjacency, parts, seed, symmetric=symmetric)
    raise ValueError(f"unknown partitioner {kind!r}; expected one of {PARTITIONERS}")


def node_degrees(adjacency: sp.csr_matrix, symmetric: bool = False, block: int = 1 << 22) -> np.ndarray:
    """Entries in each node's row plus its column (``symmetric``: twice the row's, no pass over the columns);
    the column counts are summed ``block`` entries at a time (no int64 copy of the column ids)."""
    adjacency = sp.csr_matrix(adjacency)
    n = adjacency.shape[0]
    degree = np.diff(adjacency.indptr).astype(np.int64)
    if symmetric:
        return 2 * degree
    for lo in range(0, adjacency.indices.size, block):
        degree += np.bincount(adjacency.indices[lo:lo + block], minlength=n)
    return degree


def permute_partition(adjacency: sp.csr_matrix, parts: int, seed: int = 0, symmetric: bool = False) -> np.ndarray:
    """``part_of`` of ``permute``: a seeded random permutation stratified by degree, parts its equal ranges
    (module docstring). Nodes by degree (row plus column entries, :func:`node_degrees`) from the largest, ties in
    random order, are dealt in rounds of ``parts``, each round to every part once in a fresh random order; the
    ``n % parts`` lowest go one each to the first ``n % parts`` parts, which are one node larger (as ``block``'s
    and ``random``'s sizes). O(n) memory: the degrees, one draw and the order."""
    rng = np.random.default_rng(seed)
    n = adjacency.shape[0]
    ranked = np.lexsort((rng.permutation(n), -node_degrees(adjacency, symmetric)))
    rounds = n // parts
    part_of = np.empty(n, dtype=np.int64)
    part_of[ranked[:rounds * parts]] = rng.permuted(np.tile(np.arange(parts), (rounds, 1)), axis=1).ravel()
    part_of[ranked[rounds * parts:]] = rng.permutation(n - rounds * parts)
    return part_of


def relabel(part_of: np.ndarray, parts: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, offsets)``: new id ``k`` is original node ``order[k]``; part ``i`` owns ``[offsets[i], offsets[i+1])``."""
    order = np.argsort(part_of, kind="stable")
    counts = np.bincount(part_of, minlength=parts)
    return order.astype(np.int64), np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


class BoundaryAccumulator:
    """Partition statistics gathered one part at a time (the whole graph is never needed at once)."""

    def __init__(self, offsets: np.ndarray) -> None:
        self.offsets = np.asarray(offsets, dtype=np.int64)
        parts = self.offsets.size - 1
        self.needed = np.zeros(int(self.offsets[-1]), dtype=bool)  # rows some other part needs: the B_j
        self.counts = np.zeros((parts, parts), dtype=np.int64)     # |B_ij|
        self.edges = np.zeros(parts, dtype=np.int64)
        self.cut = np.zeros(parts, dtype=np.int64)                 # entries whose column another part owns
        self.train = np.zeros(parts, dtype=np.int64)

    def _owner(self, ids: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offsets[1:], ids, side="right")

    def add_part(self, part: int, columns: np.ndarray, train_rows: int) -> None:
        """Record part ``part``'s row entries (global new column ids) and its number of training rows."""
        lo, hi = self.offsets[part], self.offsets[part + 1]
        outside = columns[(columns < lo) | (columns >= hi)]
        remote = np.unique(outside)
        self.needed[remote] = True
        self.cut[part] = outside.size
        self.counts[part] = np.bincount(self._owner(remote), minlength=self.counts.shape[0])
        self.edges[part] = columns.size
        self.train[part] = train_rows

    def summary(self) -> dict[str, Any]:
        boundary = np.bincount(self._owner(np.flatnonzero(self.needed)), minlength=self.counts.shape[0])
        return boundary_summary(self.offsets, np.diff(self.offsets), boundary, self.counts, self.edges,
                                self.train.tolist(), self.cut)


def partition_statistics(adjacency: sp.csr_matrix, offsets: np.ndarray,
                         train_mask: np.ndarray | None = None) -> dict[str, Any]:
    """Boundary view of a relabelled adjacency (rows aggregate from columns) split at ``offsets``.

    ``train_mask`` (in the relabelled order) gives the training nodes per part.
    """
    adjacency = sp.csr_matrix(adjacency)
    accumulator = BoundaryAccumulator(offsets)
    for part in range(len(offsets) - 1):
        lo, hi = int(offsets[part]), int(offsets[part + 1])
        columns = adjacency.indices[adjacency.indptr[lo]:adjacency.indptr[hi]].astype(np.int64)
        accumulator.add_part(part, columns, int(train_mask[lo:hi].sum()) if train_mask is not None else 0)
    return accumulator.summary()


def boundary_summary(offsets: np.ndarray, inner: np.ndarray, boundary: np.ndarray, counts: np.ndarray,
                     edges: np.ndarray, train: list[int] | None, cut: np.ndarray | None = None) -> dict[str, Any]:
    """The statistics dict from per-part figures; ``counts[i, j] = |B_ij|``, ``boundary[j] = |B_j|``;
    ``cut[i]``: part ``i``'s entries whose column another part owns (left out when not given)."""
    layout = RowLayout(tuple(int(x) for x in offsets))
    parts = layout.parts
    # every plan whose byte model needs only the boundary counts (a pair-counted plan needs the graph's covers)
    predicted = {plan: int(predict_spmm_bytes(Grid(parts), layout, counts, boundary, plan, 1, 4)["forward"][:, 1].sum())
                 for plan, kind in PLANS.items() if not kind.pair_counted}
    stats = {
        "inner_nodes": [int(x) for x in inner], "boundary_nodes": [int(x) for x in boundary], "train_nodes": train,
        "boundary_over_inner": [float(b / i) if i else 0.0 for b, i in zip(boundary, inner)],
        "edges": [int(x) for x in edges], "total_boundary_nodes": int(np.sum(boundary)),
        "predicted_forward_bytes_per_feature": predicted,
    }
    if cut is not None:
        stats["cut_edges"] = [int(x) for x in cut]
        stats["total_cut_edges"] = int(np.sum(cut))
    return stats
