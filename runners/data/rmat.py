"""R-MAT (Graph500) power-law graphs whose labels need the graph: ``sparse-dist prepare rmat``.

The graph is Graph500's Kronecker generator (Chakrabarti, Zhan & Faloutsos' R-MAT with the Graph500
reference code's parameters): ``2**scale`` vertices and ``edge_factor * 2**scale`` directed edge draws,
each edge choosing one quadrant of the adjacency matrix per level, ``scale`` levels deep, with
probabilities ``A, B, C, D`` (default 0.57, 0.19, 0.19, 0.05; the reference code draws the row bit with
``P(1) = C + D``, then the column bit with ``P(1) = B / (A + B)`` or ``D / (C + D)``, as here). Then, as
Graph500 does:

* vertex labels are permuted at random (a permutation from the seed), so ids carry no locality;
* the graph is undirected: every edge is stored in both directions; duplicate edges merge into one edge
  of weight 1 and self-loops are dropped (Graph500's kernel 1 ignores both; GCN adds its own self-loops);
* vertices no edge touches (many, at Graph500's parameters) are counted and reported, and kept or
  dropped (``isolated``).

Node data (:func:`node_data`): features are ``features`` values uniform in ``[-1, 1)``; a hidden linear
map ``W`` (features x classes, uniform in ``[-1, 1)``) scores every vertex, ``s = X W``, and a vertex's
class is the argmax of the scores propagated two hops over the graph, ``argmax_c (Â Â s)[v, c]`` with GCN's
``Â = D^-1/2 (A + I) D^-1/2``. So the class of a vertex of degree ``d`` depends on its own features only
through a weight of about ``1 / (d + 1)`` and on its neighbourhood's through the rest: an MLP on the
features alone is poor, a 2-layer GCN can represent the rule exactly. (Classes taken from the top bits of
the pre-permutation id, which R-MAT's bias toward quadrant A links more often, were tried first: R-MAT is
not homophilous enough for that to help a GCN: a vertex of the upper half has about 80% of its neighbours
in the lower half, as the lower half's own vertices do.) Splits: uniform random, 10% train, 10%
validation, 30% test, as :func:`runners.data.datasets.planted_classes`.

Why a numpy generator and not networkit's ``RmatGenerator`` (networkit 11 is on PyPI): this one is a few
dozen lines with no compiled dependency to install on a fresh clone within CI's time; its random numbers
are the raw 64-bit words of PCG64 seeded by ``SeedSequence([seed, stream, chunk])``, whose streams numpy
guarantees across versions (unlike ``Generator`` methods and unlike networkit's generator, whose OpenMP
threads make the graph depend on the thread count), and every quantity derived from them here is integer
arithmetic or an exact float, so a seed gives the same graph, bit for bit, on any numpy and any machine;
and it draws edges in chunks of :data:`CHUNK_EDGES` into row buckets that are merged (duplicates removed)
as they grow, so the memory is the merged graph plus one chunk, never the raw edge list in int64 twice
over, which SCALE 22 (``4.2M`` vertices, ``67M`` edge draws) needs on a 24 GiB machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from runners.data.datasets import GraphData
from runners.data.stages import NoStages, Stages
from runners.data.stages import progress_line as _progress
from sparse_dist.splitmix import unit_floats

GRAPH500 = (0.57, 0.19, 0.19, 0.05)
"""Graph500's R-MAT quadrant probabilities A, B, C, D."""
EDGE_FACTOR = 16
"""Graph500's edge factor: edge draws per vertex."""
CHUNK_EDGES = 1 << 20
"""Edges drawn per chunk (each chunk its own seeded stream, so the graph does not depend on anything else)."""
ROW_CHUNK = 1 << 16
"""Vertices whose features (and split draws) come from one seeded stream."""
BUCKET_ROWS = 1 << 18
"""Rows per bucket of the edge merge (memory only: the graph does not depend on it)."""
MERGE_AT = 1 << 22
"""Pending keys a bucket may hold before it merges them, at least (memory only)."""
ENTRY_BLOCK = 1 << 22
"""Adjacency entries per row block of the label propagation (memory only: each row's sum is the same)."""
FEATURE_BLOCK = 1 << 16
"""Vertices whose features the shard writer generates at once (memory only: any range gives the same rows)."""
SPLIT = (0.1, 0.1, 0.3)
"""Train, validation, test fractions (as :func:`runners.data.datasets.planted_classes`)."""
_EDGES, _PERMUTATION, _FEATURES, _HIDDEN, _SPLIT = range(1, 6)
"""Stream ids: each kind of draw has its own streams, so changing one never moves another."""
_PROGRESS_AFTER = 2.0
"""Seconds a stage runs before it prints progress lines."""


def _words(seed: int, stream: int, chunk: int, count: int) -> np.ndarray:
    """``count`` raw 64-bit words of PCG64 seeded by ``SeedSequence([seed, stream, chunk])``: fixed across
    numpy versions (NEP 19 guarantees the bit generators' and SeedSequence's streams)."""
    return np.random.PCG64(np.random.SeedSequence([seed, stream, chunk])).random_raw(count)


def _threshold(probability: float) -> np.uint64:
    """The 32-bit threshold ``t`` with ``P(u >= t) = 1 - probability`` for ``u`` uniform on ``[0, 2**32)``."""
    return np.uint64(min(max(round(probability * 2**32), 0), 2**32))


def check_abcd(abcd: tuple[float, ...]) -> str | None:
    """Why ``abcd`` is not four R-MAT quadrant probabilities (each in ``[0, 1]``, summing to 1), or None."""
    if len(abcd) != 4 or not all(np.isfinite(abcd)) or min(abcd) < 0 or abs(sum(abcd) - 1) > 1e-6:
        return f"expected four probabilities A,B,C,D >= 0 summing to 1 (Graph500: 0.57,0.19,0.19,0.05), got {abcd}"
    if abcd[0] + abcd[1] == 0 or abcd[2] + abcd[3] == 0:
        return f"A + B and C + D must both be above 0 (the row bit needs both values), got {abcd}"
    return None


def edge_chunk(scale: int, chunk: int, count: int, seed: int, abcd: tuple[float, ...] = GRAPH500
               ) -> tuple[np.ndarray, np.ndarray]:
    """Sources and targets (int64, pre-permutation ids in ``[0, 2**scale)``) of ``count`` R-MAT edges of
    chunk ``chunk``: per level one raw word per edge, its high 32 bits drawing the row bit, its low 32 bits
    the column bit (Graph500's kronecker_generator, conditioned the same way)."""
    a, b, c, d = abcd
    row_one = _threshold(a + b)  # row bit 1 with P = C + D
    column_one = (_threshold(a / (a + b)), _threshold(c / (c + d)))  # column bit 1 with B/(A+B), D/(C+D)
    low = np.uint64(0xFFFFFFFF)
    src = np.zeros(count, dtype=np.int64)
    dst = np.zeros(count, dtype=np.int64)
    words = np.random.PCG64(np.random.SeedSequence([seed, _EDGES, chunk]))
    for _ in range(scale):
        word = words.random_raw(count)
        row_bit = (word >> np.uint64(32)) >= row_one
        column_bit = (word & low) >= np.where(row_bit, column_one[1], column_one[0])
        src = (src << 1) | row_bit
        dst = (dst << 1) | column_bit
    return src, dst


def vertex_permutation(scale: int, seed: int) -> np.ndarray:
    """Graph500's random relabelling: ``new_id[old]``, a uniformly random permutation of ``2**scale`` ids,
    the stable argsort of raw words (no ``Generator.permutation``, whose algorithm numpy may change)."""
    keys = _words(seed, _PERMUTATION, 0, 1 << scale)
    order = np.argsort(keys, kind="stable")
    new_id = np.empty(order.size, dtype=np.int64)
    new_id[order] = np.arange(order.size, dtype=np.int64)
    return new_id


def _distinct(keys: np.ndarray) -> np.ndarray:
    """``keys`` sorted (in place) without repeats (``np.unique`` of numpy 2.3 hashes first: 20 times slower here)."""
    keys.sort()
    if keys.size < 2:
        return keys
    fresh = np.empty(keys.size, dtype=bool)
    fresh[0] = True
    np.not_equal(keys[1:], keys[:-1], out=fresh[1:])
    return keys[fresh]


class _Bucket:
    """The distinct ``(row - first) * n + column`` keys of one range of rows, merged as they grow (once the
    pending keys outnumber both the merged ones and ``merge_at``)."""

    def __init__(self, merge_at: int = MERGE_AT) -> None:
        self.merged = np.empty(0, dtype=np.int64)
        self.pending: list[np.ndarray] = []
        self.pending_size = 0
        self.merge_at = merge_at

    def add(self, keys: np.ndarray) -> None:
        self.pending.append(keys)
        self.pending_size += keys.size
        if self.pending_size > max(self.merged.size, self.merge_at):
            self.merge()

    def merge(self) -> np.ndarray:
        if self.pending:
            self.merged = _distinct(np.concatenate([self.merged, *self.pending]))
            self.pending, self.pending_size = [], 0
        return self.merged


@dataclass(frozen=True)
class RmatGraph:
    """An undirected R-MAT graph: ``adjacency`` (symmetric CSR, weight 1, no self-loops, ids after the
    permutation and after dropping isolated vertices where asked), ``new_id`` (pre-permutation id -> id in
    ``adjacency``, -1 for a dropped vertex), ``isolated`` (vertices no edge touches, before any drop) and
    ``draws`` (directed edges drawn)."""

    adjacency: sp.csr_matrix
    new_id: np.ndarray
    isolated: int
    draws: int


def rmat_graph(scale: int, edge_factor: int = EDGE_FACTOR, *, abcd: tuple[float, ...] = GRAPH500, seed: int = 0,
               drop_isolated: bool = False, progress: bool = False, bucket_rows: int = BUCKET_ROWS,
               merge_at: int = MERGE_AT) -> RmatGraph:
    """The Graph500 R-MAT graph of ``2**scale`` vertices and ``edge_factor * 2**scale`` edge draws.

    Memory: the merged graph (8 bytes a distinct stored entry while merging, up to as many again pending in
    the buckets, then the CSR's 4 for the column id and 4 for the weight, written into place bucket by bucket
    as the keys are freed) and one chunk of :data:`CHUNK_EDGES` draws. ``bucket_rows`` and ``merge_at`` set
    how the merge is split (memory only: the graph is the same for any values). Deterministic from ``seed``
    (module docstring)."""
    problem = check_abcd(abcd)
    if problem:
        raise ValueError(f"rmat: {problem}")
    n = 1 << scale
    draws = edge_factor * n
    new_id = vertex_permutation(scale, seed)
    rows_per_bucket = min(n, bucket_rows)
    buckets = [_Bucket(merge_at) for _ in range((n + rows_per_bucket - 1) // rows_per_bucket)]
    chunks = (draws + CHUNK_EDGES - 1) // CHUNK_EDGES
    started = time.perf_counter()
    for chunk in range(chunks):
        src, dst = edge_chunk(scale, chunk, min(CHUNK_EDGES, draws - chunk * CHUNK_EDGES), seed, abcd)
        src, dst = new_id[src], new_id[dst]
        loop = src == dst
        rows = np.concatenate([src[~loop], dst[~loop]])
        columns = np.concatenate([dst[~loop], src[~loop]])
        del src, dst, loop
        bucket = rows // rows_per_bucket
        keys = (rows - bucket * rows_per_bucket) * n + columns
        del rows, columns
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(len(buckets) + 1))
        for index, piece in enumerate(buckets):
            if bounds[index + 1] > bounds[index]:
                piece.add(_distinct(keys[order[bounds[index]:bounds[index + 1]]]))
        if progress and time.perf_counter() - started > _PROGRESS_AFTER:
            _progress("rmat: drawing edges (chunks)", chunk + 1, chunks, started)
    index_type = np.int32 if n <= np.iinfo(np.int32).max else np.int64
    sizes = [piece.merge().size for piece in buckets]  # every bucket merged: the exact number of entries
    indices = np.empty(sum(sizes), dtype=index_type)  # pages are touched as buckets fill them
    degree = np.zeros(n, dtype=np.int64)
    at = 0
    for index, piece in enumerate(buckets):
        keys = piece.merged
        buckets[index] = _Bucket()  # release the merged keys once converted
        del piece
        first = index * rows_per_bucket
        degree[first:first + rows_per_bucket] = np.bincount(keys // n, minlength=min(rows_per_bucket, n - first))
        np.remainder(keys, n, out=keys)
        indices[at:at + keys.size] = keys
        at += keys.size
        del keys
    isolated = degree == 0
    if drop_isolated and isolated.any():
        kept = np.cumsum(~isolated) - 1
        for lo in range(0, indices.size, ENTRY_BLOCK):  # renumbered in place, a block at a time
            indices[lo:lo + ENTRY_BLOCK] = kept[indices[lo:lo + ENTRY_BLOCK]]
        degree = degree[~isolated]
        new_id = np.where(isolated[new_id], -1, kept[new_id])
    indptr = np.zeros(degree.size + 1, dtype=np.int64)
    np.cumsum(degree, out=indptr[1:])
    size = degree.size
    adjacency = sp.csr_matrix((np.ones(indices.size, dtype=np.float32), indices, indptr), shape=(size, size))
    adjacency.has_sorted_indices = True  # each bucket's keys are sorted: rows in order, columns within a row
    return RmatGraph(adjacency=adjacency, new_id=new_id, isolated=int(isolated.sum()), draws=draws)


def gcn_operator(adjacency: sp.csr_matrix) -> sp.csr_matrix:
    """GCN's ``Â = D^-1/2 (A + I) D^-1/2`` (float64) of a symmetric adjacency without self-loops."""
    with_loops = sp.csr_matrix(adjacency, dtype=np.float64) + sp.identity(adjacency.shape[0], format="csr")
    scale = 1.0 / np.sqrt(np.asarray(with_loops.sum(axis=1)).ravel())
    return sp.csr_matrix(sp.diags(scale) @ with_loops @ sp.diags(scale))


def features_of(first: int, stop: int, width: int, seed: int) -> np.ndarray:
    """Features of vertices ``[first, stop)``: uniform in ``[-1, 1)`` on a grid of ``2**-23`` (exact float32
    values), from the seeded streams of their :data:`ROW_CHUNK` blocks."""
    pieces = []
    for chunk in range(first // ROW_CHUNK, (stop - 1) // ROW_CHUNK + 1 if stop > first else 0):
        lo = chunk * ROW_CHUNK
        rows = min(stop - lo, ROW_CHUNK)  # a stream's first rows are the same however many are drawn
        words = _words(seed, _FEATURES, chunk, rows * width).reshape(rows, width)
        block = (words >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-23) - np.float32(1.0)
        pieces.append(block[max(first - lo, 0):])
    return np.concatenate(pieces) if pieces else np.empty((0, width), dtype=np.float32)


def _hidden(width: int, classes: int, seed: int) -> np.ndarray:
    """The hidden map ``W`` (``width x classes``, uniform in ``[-1, 1)``) of the labels."""
    return unit_floats(_words(seed, _HIDDEN, 0, width * classes)).reshape(width, classes) * 2.0 - 1.0


def _split_masks(n: int, seed: int) -> dict[str, np.ndarray]:
    """Train, validation and test masks: one uniform draw per vertex against :data:`SPLIT`."""
    blocks = (n + ROW_CHUNK - 1) // ROW_CHUNK
    draw = np.concatenate([unit_floats(_words(seed, _SPLIT, block, min(ROW_CHUNK, n - block * ROW_CHUNK)))
                           for block in range(blocks)]) if n else np.empty(0)
    train, val, test = SPLIT
    return {"train": draw < train, "val": (draw >= train) & (draw < train + val),
            "test": (draw >= train + val) & (draw < train + val + test)}


def node_data(adjacency: sp.csr_matrix, width: int, classes: int, seed: int, hops: int = 2,
              progress: bool = False) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Features (N x ``width`` float32), labels (N int64) and split masks of the graph (module docstring):
    class = argmax of ``Â^hops X W`` for a hidden ``W`` drawn from ``seed``. Everything in memory, the
    operator included: the reference :func:`node_labels` is checked against."""
    n = adjacency.shape[0]
    hidden = _hidden(width, classes, seed)
    features = np.empty((n, width), dtype=np.float32)
    scores = np.empty((n, classes), dtype=np.float64)
    started = time.perf_counter()
    blocks = (n + ROW_CHUNK - 1) // ROW_CHUNK
    for block in range(blocks):
        lo, hi = block * ROW_CHUNK, min((block + 1) * ROW_CHUNK, n)
        features[lo:hi] = features_of(lo, hi, width, seed)
        scores[lo:hi] = features[lo:hi].astype(np.float64) @ hidden
        if progress and time.perf_counter() - started > _PROGRESS_AFTER:
            _progress("rmat: features (blocks of vertices)", block + 1, blocks, started)
    operator = gcn_operator(adjacency)
    for _ in range(hops):
        scores = operator @ scores
    del operator
    labels = np.argmax(scores, axis=1).astype(np.int64)
    return features, labels, _split_masks(n, seed)


def _row_blocks(indptr: np.ndarray, entries: int) -> list[tuple[int, int]]:
    """Consecutive row ranges of about ``entries`` adjacency entries each (a row is never split)."""
    n = indptr.size - 1
    bounds = np.searchsorted(indptr, np.arange(0, int(indptr[-1]) + 1, max(entries, 1)), side="right") - 1
    cuts = sorted({0, n, *(int(b) for b in bounds if 0 < b < n)})
    return list(zip(cuts[:-1], cuts[1:]))


def node_labels(adjacency: sp.csr_matrix, width: int, classes: int, seed: int, hops: int = 2,
                progress: bool = False, entries: int = ENTRY_BLOCK) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The labels and masks of :func:`node_data`, bit for bit, in bounded memory: features are generated a
    block of vertices at a time and only their scores ``X W`` kept (``N x classes``), and ``Â`` is built and
    applied a row block of about ``entries`` adjacency entries at a time, by the same scipy operations as
    :func:`gcn_operator` on those rows (each row's products and their order are the same, so each sum is)."""
    n = adjacency.shape[0]
    hidden = _hidden(width, classes, seed)
    scores = np.empty((n, classes), dtype=np.float64)
    started = time.perf_counter()
    blocks = (n + ROW_CHUNK - 1) // ROW_CHUNK
    for block in range(blocks):
        lo, hi = block * ROW_CHUNK, min((block + 1) * ROW_CHUNK, n)
        scores[lo:hi] = features_of(lo, hi, width, seed).astype(np.float64) @ hidden
        if progress and time.perf_counter() - started > _PROGRESS_AFTER:
            _progress("rmat: feature scores X W (blocks of vertices)", block + 1, blocks, started)
    adjacency = sp.csr_matrix(adjacency)
    scale = 1.0 / np.sqrt(np.diff(adjacency.indptr).astype(np.float64) + 1.0)  # row sums of A + I, exact
    right = sp.diags(scale, format="csr")  # what ``@ sp.diags(scale)`` converts it to, once
    ranges = _row_blocks(adjacency.indptr, entries)
    started = time.perf_counter()
    for hop in range(hops):
        propagated = np.empty_like(scores)
        for done, (lo, hi) in enumerate(ranges, 1):
            rows = sp.csr_matrix(adjacency[lo:hi], dtype=np.float64)
            rows = rows + sp.eye(hi - lo, n, k=lo, format="csr")
            operator = sp.csr_matrix(sp.diags(scale[lo:hi]) @ rows @ right)
            propagated[lo:hi] = operator @ scores
            del rows, operator
            if progress and time.perf_counter() - started > _PROGRESS_AFTER:
                _progress(f"rmat: labels, hop {hop + 1} of {hops} (row blocks)", done, len(ranges), started)
        scores = propagated
    labels = np.argmax(scores, axis=1).astype(np.int64)
    return labels, _split_masks(n, seed)


class RmatFeatures:
    """The features of an R-MAT dataset, never held whole: ``rows(lo, hi)`` generates vertices
    ``[lo, hi)`` (:func:`features_of`); the shard writer asks for blocks in order and routes each row to
    its part's file. ``shape`` and ``dtype`` as the array's would be."""

    def __init__(self, nodes: int, width: int, seed: int) -> None:
        self.shape = (nodes, width)
        self.dtype = np.dtype(np.float32)
        self.seed = seed

    def rows(self, lo: int, hi: int) -> np.ndarray:
        return features_of(lo, min(hi, self.shape[0]), self.shape[1], self.seed)


def _rmat_meta(scale: int, edge_factor: int, abcd: tuple[float, ...], seed: int, graph: RmatGraph,
               drop_isolated: bool) -> dict:
    return {"feature_norm": "none",
            "generator": {"kind": "rmat", "scale": scale, "edge_factor": edge_factor, "abcd": list(abcd),
                          "seed": seed, "isolated": graph.isolated,
                          "isolated_vertices": "dropped" if drop_isolated else "kept",
                          "labels": "argmax of (D^-1/2 (A+I) D^-1/2)^2 X W, W hidden"}}


def rmat_dataset(scale: int, edge_factor: int = EDGE_FACTOR, *, features: int = 128, classes: int = 8,
                 abcd: tuple[float, ...] = GRAPH500, seed: int = 0, drop_isolated: bool = False,
                 progress: bool = False) -> tuple[GraphData, RmatGraph]:
    """The R-MAT graph with its node data, all in memory, as :func:`runners.data.shards.write_shards` takes it."""
    graph = rmat_graph(scale, edge_factor, abcd=abcd, seed=seed, drop_isolated=drop_isolated, progress=progress)
    x, labels, masks = node_data(graph.adjacency, features, classes, seed, progress=progress)
    data = GraphData(name=f"rmat-s{scale}-e{edge_factor}", adjacency=graph.adjacency, features=x, labels=labels,
                     masks=masks, num_classes=classes,
                     meta_extra=_rmat_meta(scale, edge_factor, abcd, seed, graph, drop_isolated))
    return data, graph


def rmat_dataset_bounded(scale: int, edge_factor: int = EDGE_FACTOR, *, features: int = 128, classes: int = 8,
                         abcd: tuple[float, ...] = GRAPH500, seed: int = 0, drop_isolated: bool = False,
                         progress: bool = False, stages: Stages | NoStages | None = None,
                         bucket_rows: int = BUCKET_ROWS, merge_at: int = MERGE_AT, entries: int = ENTRY_BLOCK
                         ) -> tuple[GraphData, RmatGraph]:
    """:func:`rmat_dataset`'s dataset in bounded memory (what ``prepare rmat`` uses): the features are
    :class:`RmatFeatures` (generated again, a block at a time, as the shards are written), the labels come
    from :func:`node_labels`. ``stages`` times and measures the generation and the labels; ``bucket_rows``,
    ``merge_at`` and ``entries`` set the memory chunks only (the dataset is the same for any values)."""
    stages = stages or NoStages()
    with stages.stage("generate edges"):
        graph = rmat_graph(scale, edge_factor, abcd=abcd, seed=seed, drop_isolated=drop_isolated,
                           progress=progress, bucket_rows=bucket_rows, merge_at=merge_at)
    with stages.stage("labels (2 hops)"):
        labels, masks = node_labels(graph.adjacency, features, classes, seed, progress=progress, entries=entries)
    n = graph.adjacency.shape[0]
    data = GraphData(name=f"rmat-s{scale}-e{edge_factor}", adjacency=graph.adjacency,
                     features=RmatFeatures(n, features, seed), labels=labels, masks=masks, num_classes=classes,
                     meta_extra=_rmat_meta(scale, edge_factor, abcd, seed, graph, drop_isolated))
    return data, graph


def _kron(scale: int, zero: float, one: float) -> np.ndarray:
    """``kron([zero, one], ...)`` ``scale`` times: entry ``v`` is the product over ``v``'s bits."""
    vector = np.ones(1)
    for _ in range(scale):
        vector = np.kron(vector, [zero, one])
    return vector


def expected_isolated(scale: int, edge_factor: int = EDGE_FACTOR, abcd: tuple[float, ...] = GRAPH500
                      ) -> tuple[float, float]:
    """The expected number of isolated vertices of the R-MAT graph, exactly, and its standard deviation as
    if vertices were independent: a draw touches ``v`` other than by a self-loop with probability
    ``r_v = R_v + C_v - 2 p_vv`` (row and column marginals and the diagonal, products over ``v``'s bits), so
    ``v`` is isolated with probability ``(1 - r_v) ** draws``. O(2**scale)."""
    a, b, c, d = abcd
    touch = _kron(scale, a + b, c + d) + _kron(scale, a + c, b + d) - 2 * _kron(scale, a, d)
    alone = np.exp(edge_factor * (1 << scale) * np.log1p(-np.minimum(touch, 1.0)))
    return float(alone.sum()), float(np.sqrt((alone * (1 - alone)).sum()))


def expected_top_degree(scale: int, edge_factor: int = EDGE_FACTOR, abcd: tuple[float, ...] = GRAPH500
                        ) -> tuple[float, float]:
    """The expected degree (distinct neighbours) of pre-permutation vertex 0, the largest for ``A`` above
    ``B``, ``C`` and ``D``, and its standard deviation as if the pairs were independent: ``u`` is a
    neighbour unless no draw is ``(0, u)`` or ``(u, 0)``, probability ``(1 - p_0u - p_u0) ** draws``."""
    a, b, c, _ = abcd
    either = (_kron(scale, a, b) + _kron(scale, a, c))[1:]
    present = -np.expm1(edge_factor * (1 << scale) * np.log1p(-either))
    return float(present.sum()), float(np.sqrt((present * (1 - present)).sum()))
