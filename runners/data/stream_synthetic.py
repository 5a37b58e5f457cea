"""Synthetic graphs far larger than memory, written as shards in two streaming passes.

``prepare synthetic --stream`` never holds the whole graph:

1. Edges are generated in chunks (clustered communities as in
   :mod:`runners.data.synthetic`, or R-MAT with skewed degrees) and each edge is
   appended, in both directions (the graph is undirected), to the bucket
   file of the part that owns its row. Memory: one chunk.
2. Each part's bucket is read back, sorted into CSR (duplicates collapse to
   weight 1, self-loops dropped) and written as that part's shard together
   with its planted features, labels and split masks, generated per node
   from seeded chunks. Memory: one part.

Parts are contiguous blocks of node ids (communities are contiguous, so this
is a good partition for the clustered graph); METIS needs the whole graph in
memory and is not offered here. Labels: class ``community % classes`` with
``label_noise`` random relabels; features: bag-of-words drawn ``signal``
from the node's own class words (as :func:`runners.data.datasets.planted_classes`).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np

from runners.data.partition import BoundaryAccumulator
from runners.data.shards import (FORMAT_VERSION, ShardError, finish_dataset, output_problem, part_file,
                                 removed_on_failure, sha256_file)
from runners.data.stages import progress_line as _progress
from runners.data.synthetic import CHUNK_ROWS


def _edges_clustered(chunk: int, first: int, stop: int, n: int, degree: int, community: int, mixing: float,
                     seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, chunk])
    rows = np.arange(first, stop, dtype=np.int64)
    base = (rows // community) * community
    size = np.minimum(community, n - base)
    inside = base[:, None] + (rng.random((rows.size, degree)) * size[:, None]).astype(np.int64)
    outside = rng.integers(0, n, size=(rows.size, degree), dtype=np.int64)
    cols = np.where(rng.random((rows.size, degree)) < mixing, outside, inside)
    return np.repeat(rows, degree), cols.ravel()


def _edges_rmat(chunk: int, count: int, n: int, seed: int,
                probabilities: tuple[float, float, float, float] = (0.57, 0.19, 0.19, 0.05)) -> tuple[np.ndarray, np.ndarray]:
    """``count`` R-MAT edges (Chakrabarti et al.) over ``2**ceil(log2 n)`` ids, folded into ``[0, n)``."""
    rng = np.random.default_rng([seed, chunk, 1])
    levels = max(1, int(np.ceil(np.log2(max(n, 2)))))
    src = np.zeros(count, dtype=np.int64)
    dst = np.zeros(count, dtype=np.int64)
    cumulative = np.cumsum(probabilities)
    for _ in range(levels):
        quadrant = np.searchsorted(cumulative, rng.random(count) * cumulative[-1])
        src = (src << 1) | (quadrant >= 2)
        dst = (dst << 1) | (quadrant % 2 == 1)
    return src % n, dst % n


def _node_data(first: int, stop: int, classes: int, features: int, community: int, label_noise: float,
               words: int, signal: float, split: tuple[float, float, float], seed: int) -> dict[str, np.ndarray]:
    """Planted labels, features and masks of nodes ``[first, stop)``, independent of the part boundaries."""
    pieces: dict[str, list[np.ndarray]] = {k: [] for k in ("features", "labels", "train", "val", "test")}
    for chunk in range(first // CHUNK_ROWS, (stop - 1) // CHUNK_ROWS + 1 if stop > first else first // CHUNK_ROWS):
        lo, hi = chunk * CHUNK_ROWS, (chunk + 1) * CHUNK_ROWS
        rng = np.random.default_rng([seed, chunk, 2])
        ids = np.arange(lo, hi)
        labels = (ids // community) % classes
        relabel = rng.random(ids.size) < label_noise
        labels = np.where(relabel, rng.integers(0, classes, ids.size), labels)
        block = max(features // classes, 1)
        own = (labels[:, None] * block + rng.integers(0, block, size=(ids.size, words))) % features
        chosen = np.where(rng.random((ids.size, words)) < signal, own, rng.integers(0, features, (ids.size, words)))
        x = np.zeros((ids.size, features), dtype=np.float32)
        np.add.at(x, (np.repeat(np.arange(ids.size), words), chosen.ravel()), 1.0)
        draw = rng.random(ids.size)
        take = slice(max(first - lo, 0), min(stop, hi) - lo)
        pieces["features"].append(x[take])
        pieces["labels"].append(labels[take].astype(np.int64))
        pieces["train"].append((draw < split[0])[take])
        pieces["val"].append(((draw >= split[0]) & (draw < split[0] + split[1]))[take])
        pieces["test"].append(((draw >= split[0] + split[1]) & (draw < sum(split)))[take])
    return {k: np.concatenate(v) if v else np.empty(0) for k, v in pieces.items()}


def write_streamed_synthetic(out_dir: str | Path, *, nodes: int, degree: int, parts: int, graph: str = "clustered",
                             classes: int = 8, features: int = 128, community: int = 500, mixing: float = 0.05,
                             label_noise: float = 0.3, words: int = 20, signal: float = 0.15,
                             split: tuple[float, float, float] = (0.1, 0.1, 0.3), seed: int = 0,
                             overwrite: bool = False, progress: bool = True) -> dict:
    """Generate and shard an undirected synthetic graph with bounded memory; returns meta."""
    out_dir = Path(out_dir)
    problem = output_problem(out_dir, overwrite)
    if problem:
        raise ShardError(problem)
    if graph not in ("clustered", "rmat"):
        raise ValueError(f"streamed synthetic graph must be 'clustered' or 'rmat', got {graph!r}")
    offsets = np.concatenate(([0], np.cumsum([nodes // parts + (1 if i < nodes % parts else 0)
                                              for i in range(parts)]))).astype(np.int64)
    id_type = np.int32 if nodes < 2**31 else np.int64
    with removed_on_failure(out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")) as temporary:
        (temporary / "buckets").mkdir()
        buckets = [open(temporary / "buckets" / f"{p}.bin", "wb") for p in range(parts)]
        chunks = (nodes + CHUNK_ROWS - 1) // CHUNK_ROWS
        started = time.perf_counter()
        try:
            for chunk in range(chunks):
                first, stop = chunk * CHUNK_ROWS, min((chunk + 1) * CHUNK_ROWS, nodes)
                if graph == "clustered":
                    src, dst = _edges_clustered(chunk, first, stop, nodes, degree, community, mixing, seed)
                else:
                    src, dst = _edges_rmat(chunk, (stop - first) * degree, nodes, seed)
                both_rows = np.concatenate([src, dst])
                both_cols = np.concatenate([dst, src])
                owner = np.searchsorted(offsets[1:], both_rows, side="right")
                order = np.argsort(owner, kind="stable")
                bounds = np.searchsorted(owner[order], np.arange(parts + 1))
                for p in range(parts):
                    picked = order[bounds[p]:bounds[p + 1]]
                    if picked.size:
                        np.stack([both_rows[picked], both_cols[picked]], axis=1).astype(id_type).tofile(buckets[p])
                if progress:
                    _progress("generating edges (chunks)", chunk + 1, chunks, started)
        finally:
            for handle in buckets:
                handle.close()

        files: dict[str, str] = {}
        statistics = BoundaryAccumulator(offsets)
        started = time.perf_counter()
        for p in range(parts):
            lo, hi = int(offsets[p]), int(offsets[p + 1])
            pairs = np.fromfile(temporary / "buckets" / f"{p}.bin", dtype=id_type).reshape(-1, 2).astype(np.int64)
            (temporary / "buckets" / f"{p}.bin").unlink()
            keys = np.unique((pairs[:, 0] - lo) * nodes + pairs[:, 1])  # sorted by row, then column; deduplicated
            del pairs
            rows, cols = keys // nodes, keys % nodes
            keep = rows + lo != cols
            rows, cols = rows[keep], cols[keep]
            indptr = np.searchsorted(rows, np.arange(hi - lo + 1))
            node_data = _node_data(lo, hi, classes, features, community, label_noise, words, signal, split, seed)
            name = part_file(p)
            np.savez(temporary / name, indptr=indptr.astype(np.int64), indices=cols.astype(np.int64),
                     data=np.ones(cols.size, dtype=np.float32), **node_data)
            files[name] = sha256_file(temporary / name)
            statistics.add_part(p, cols, int(node_data["train"].sum()))
            if progress:
                _progress("writing parts", p + 1, parts, started)
        shutil.rmtree(temporary / "buckets")
        np.save(temporary / "permutation.npy", np.arange(nodes, dtype=np.int64))
        files["permutation.npy"] = sha256_file(temporary / "permutation.npy")
        stats = statistics.summary()
        meta = {"format_version": FORMAT_VERSION, "name": f"synthetic-{graph}-{nodes}", "num_nodes": nodes,
                "num_edges": int(sum(stats["edges"])), "feature_dim": features, "num_classes": classes,
                "multilabel": False, "partitioner": "block", "partition_seed": seed, "num_parts": parts,
                "row_offsets": offsets.tolist(), "permutation_file": "permutation.npy", "files": files,
                "feature_norm": "row",
                "partition_stats": stats}
        return finish_dataset(temporary, out_dir, meta)
