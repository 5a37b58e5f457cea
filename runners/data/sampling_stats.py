"""What a partition means for sampled mini-batch training, per part, and a side-by-side table.

For a ``part_of`` over the original graph (row ``v`` lists the nodes ``v``
aggregates from):

* nodes, training, validation and test nodes per part, and each one's
  balance ``max / mean`` over parts (1.0 is perfect; ``-`` where a set is empty);
* the edge cut: adjacency entries whose column another part owns;
* ``khop_remote_rows``: rows of ``X`` owned by other parts inside the
  ``hops``-hop in-neighbourhood of the part's training nodes (full fanout:
  every row an epoch of exact K-hop sampling from that part's seeds can read);
* per batch of ``batch_size`` seeds drawn from the part's training nodes with
  ``fanouts`` (hop 1, the seeds' own neighbours, first, as PyG's
  ``num_neighbors``; up to ``f`` in-neighbours per node per hop, uniformly
  without replacement, as DGL's ``sample_neighbors``): ``batch_input_rows``
  (distinct nodes whose ``X`` row the batch reads: seeds and every sampled
  node), ``batch_remote_rows`` (those another part owns: the feature pull) and
  ``batch_remote_sample_rows`` (frontier nodes of hops 1..K whose adjacency
  row another part samples: the sampling requests). Each is the mean over
  ``batches`` batches drawn with a seeded generator: an estimate by
  simulation of the sampler, not a formula; it moves with the seed by a few
  percent at the default four batches.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from runners.data.bytegnn_partition import KINDS, row_entries

DEFAULT_FANOUT = 10
DEFAULT_BATCH_SIZE = 1024
DEFAULT_BATCHES = 4
CUT_BLOCK = 1 << 22
"""Adjacency entries the edge cut is counted over at once (memory only)."""


def balance(counts: np.ndarray) -> float | None:
    """``max / mean`` of per-part counts; None when all are zero."""
    mean = float(np.mean(counts))
    return float(np.max(counts)) / mean if mean > 0 else None


def _khop_reach(transposed: sp.csr_matrix, seeds: np.ndarray, hops: int) -> np.ndarray:
    """Boolean: the nodes within ``hops`` hops of ``seeds`` along in-edges (``transposed`` is ``A^T``)."""
    reach = np.zeros(transposed.shape[0], dtype=bool)
    reach[seeds] = True
    frontier = reach.astype(np.float32)
    for _ in range(hops):
        new = (transposed @ frontier > 0) & ~reach
        if not new.any():
            break
        reach |= new
        frontier = new.astype(np.float32)
    return reach


def sample_batch(rows: sp.csr_matrix, seeds: np.ndarray, fanouts: list[int],
                 rng: np.random.Generator) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(input_nodes, frontiers)``: every distinct node a sampled batch reads, and the frontier of each hop
    (``frontiers[0]`` the seeds) whose rows were sampled; a fanout below 1 takes every in-neighbour."""
    frontier = np.unique(seeds)
    frontiers, seen = [], [frontier]
    for fanout in fanouts:
        frontiers.append(frontier)
        position, columns = row_entries(rows, frontier)
        if fanout > 0 and columns.size:
            # entries come grouped by row; a random key inside each group and the first ``fanout`` of each
            order = np.argsort(position + rng.random(columns.size), kind="stable")
            counts = np.bincount(position, minlength=frontier.size)
            first = np.repeat(np.cumsum(counts) - counts, counts)
            columns = columns[order][np.arange(columns.size) - first < fanout]
        frontier = np.unique(columns)
        seen.append(frontier)
    return np.unique(np.concatenate(seen)), frontiers


def sampling_statistics(adjacency: sp.spmatrix, part_of: np.ndarray, masks: dict[str, np.ndarray], hops: int,
                        fanouts: list[int] | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                        batches: int = DEFAULT_BATCHES, seed: int = 0, symmetric: bool = False) -> dict[str, Any]:
    """The module docstring's figures for ``part_of`` (``fanouts`` default: :data:`DEFAULT_FANOUT` per hop);
    ``symmetric``: the adjacency equals its transpose (R-MAT's), so no transposed copy is made."""
    rows = sp.csr_matrix(adjacency)
    rows.sort_indices()
    part_of = np.asarray(part_of, dtype=np.int64)
    parts = int(part_of.max()) + 1 if part_of.size else 1
    fanouts = list(fanouts) if fanouts is not None else [DEFAULT_FANOUT] * hops
    stats: dict[str, Any] = {"parts": parts, "hops": hops, "fanouts": fanouts, "batch_size": batch_size,
                             "batches": batches, "nodes": np.bincount(part_of, minlength=parts).tolist()}
    for name in KINDS:
        mask = masks.get(name)
        counts = np.bincount(part_of[np.asarray(mask, dtype=bool)], minlength=parts) if mask is not None \
            else np.zeros(parts, dtype=np.int64)
        stats[name] = counts.tolist()
        stats[f"{name}_balance"] = balance(counts)
    stats["nodes_balance"] = balance(np.asarray(stats["nodes"]))
    cut = 0
    for lo in range(0, rows.nnz, CUT_BLOCK):  # a block of entries at a time: never an int64 array per entry
        entries = np.arange(lo, min(lo + CUT_BLOCK, rows.nnz))
        row_part = part_of[np.searchsorted(rows.indptr, entries, side="right") - 1]
        cut += int(np.count_nonzero(row_part != part_of[rows.indices[entries]]))
    stats["cut_edges"] = cut
    stats["edges"] = int(rows.nnz)
    transposed = rows if symmetric else sp.csr_matrix(rows.T, dtype=np.float32)
    train = np.asarray(masks["train"], dtype=bool)
    rng = np.random.default_rng(seed)
    remote, batch_input, batch_remote, batch_requests = [], [], [], []
    for part in range(parts):
        seeds = np.flatnonzero(train & (part_of == part))
        reach = _khop_reach(transposed, seeds, hops)
        remote.append(int((reach & (part_of != part)).sum()))
        drawn = [sample_batch(rows, rng.choice(seeds, size=min(batch_size, seeds.size), replace=False),
                              fanouts, rng) for _ in range(batches if seeds.size else 0)]
        batch_input.append(float(np.mean([inputs.size for inputs, _ in drawn])) if drawn else 0.0)
        batch_remote.append(float(np.mean([(part_of[inputs] != part).sum() for inputs, _ in drawn]))
                            if drawn else 0.0)
        batch_requests.append(float(np.mean([sum(int((part_of[f] != part).sum()) for f in frontiers[1:])
                                             for _, frontiers in drawn])) if drawn else 0.0)
    stats.update(khop_remote_rows=remote, batch_input_rows=batch_input, batch_remote_rows=batch_remote,
                 batch_remote_sample_rows=batch_requests)
    return stats


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_part_table(stats: dict[str, Any]) -> list[str]:
    """Per-part lines: nodes, the three sets, K-hop remote rows and the per-batch estimates."""
    lines = [f"{'part':>5}{'nodes':>10}{'train':>8}{'val':>8}{'test':>8}{'khop-remote':>13}"
             f"{'batch-in':>10}{'batch-remote':>14}{'batch-req':>11}"]
    for part in range(stats["parts"]):
        lines.append(f"{part:>5}{stats['nodes'][part]:>10}{stats['train'][part]:>8}{stats['val'][part]:>8}"
                     f"{stats['test'][part]:>8}{stats['khop_remote_rows'][part]:>13}"
                     f"{stats['batch_input_rows'][part]:>10.0f}{stats['batch_remote_rows'][part]:>14.0f}"
                     f"{stats['batch_remote_sample_rows'][part]:>11.0f}")
    lines.append(f"balance (max/mean): nodes {_ratio(stats['nodes_balance'])}, train {_ratio(stats['train_balance'])}, "
                 f"val {_ratio(stats['val_balance'])}, test {_ratio(stats['test_balance'])}; edge cut "
                 f"{stats['cut_edges']} of {stats['edges']} entries "
                 f"({100 * stats['cut_edges'] / max(stats['edges'], 1):.1f}%)")
    return lines


def format_comparison(results: list[tuple[str, float, dict[str, Any]]]) -> list[str]:
    """One line per partitioner ``(name, seconds, stats)``: balances, cut, remote rows (sum and worst part)."""
    lines = [f"{'partitioner':<13}{'secs':>7}{'nodes':>7}{'train':>7}{'val':>7}{'test':>7}{'cut%':>7}"
             f"{'khop-remote':>13}{'(max part)':>11}{'batch-remote':>14}{'(max part)':>11}{'batch-req':>11}"]
    for name, seconds, stats in results:
        lines.append(
            f"{name:<13}{seconds:>7.1f}{_ratio(stats['nodes_balance']):>7}{_ratio(stats['train_balance']):>7}"
            f"{_ratio(stats['val_balance']):>7}{_ratio(stats['test_balance']):>7}"
            f"{100 * stats['cut_edges'] / max(stats['edges'], 1):>7.1f}"
            f"{sum(stats['khop_remote_rows']):>13}{max(stats['khop_remote_rows']):>11}"
            f"{np.mean(stats['batch_remote_rows']):>14.0f}{max(stats['batch_remote_rows']):>11.0f}"
            f"{np.mean(stats['batch_remote_sample_rows']):>11.0f}")
    return lines
