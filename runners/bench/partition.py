"""``sparse-dist bench partition``: several partitioners on one graph, side by side (a single-process step,
as ``prepare``: under mpiexec, ranks other than 0 return at once).

Reads the graph and its training/validation/test sets back from a prepared
dataset (``--data``, in the original node ids: the stored permutation is
undone, so every partitioner sees the graph ``prepare`` read), partitions it
with each of ``--partitioners`` into ``--parts`` parts (default: the
dataset's) and prints, per partitioner, the balance of nodes and of the three
sets, the edge cut, the remote rows of the full ``--hops``-hop neighbourhood of
each part's training nodes, and per-batch estimates for ``--batch-size`` seeds
with ``--fanouts`` (:mod:`runners.data.sampling_stats`), then each one's per-part
table. ``secs`` is the partitioner's own wall time (informational). A line per partitioner gives the
nonzeros per block of the adjacency on the process grids 2x2, 2x4, 4x4, 8x8 (max/mean, of ``A`` and of GCN's
``A + I``; :mod:`runners.data.grid_balance`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from runners.argtypes import at_least, int_list
from runners.argtypes import seed as seed_number
from runners.data.grid_balance import blocks_from_partition, grid_line
from runners.data.partition import DEFAULT_HOPS, PARTITIONERS, partition
from runners.data.sampling_stats import (DEFAULT_BATCH_SIZE, DEFAULT_BATCHES, format_comparison, format_part_table,
                                         sampling_statistics)
from runners.data.shards import read_meta, read_part, read_permutation

DEFAULT_PARTITIONERS = "metis,metis-train,bytegnn"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="dataset directory made by `sparse-dist prepare`")
    parser.add_argument("--partitioners", default=DEFAULT_PARTITIONERS,
                        help=f"comma-separated, from {', '.join(PARTITIONERS)} (default: {DEFAULT_PARTITIONERS})")
    parser.add_argument("--parts", type=at_least(1), default=None, help="number of parts (default: the dataset's)")
    parser.add_argument("--hops", type=at_least(1), default=DEFAULT_HOPS,
                        help="K: bytegnn's block radius and the sampling depth of the statistics (default: %(default)s)")
    parser.add_argument("--fanouts", type=int_list(1), default=None,
                        help="sampled in-neighbours per node per hop, hop 1 first, one per hop (default: 10 each)")
    parser.add_argument("--batch-size", type=at_least(1), default=DEFAULT_BATCH_SIZE,
                        help="seeds per batch for the per-batch estimate (default: %(default)s)")
    parser.add_argument("--batches", type=at_least(1), default=DEFAULT_BATCHES,
                        help="batches drawn per part for the per-batch estimate (default: %(default)s)")
    parser.add_argument("--seed", type=seed_number, default=0, help="seed of the partitioners and the sampled batches")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def check_arguments(args: argparse.Namespace) -> str | None:
    """Unknown partitioner names and a fanout list of the wrong length are refused before anything is read."""
    names = [name.strip() for name in args.partitioners.split(",")]
    unknown = [name for name in names if name not in PARTITIONERS]
    if unknown or not all(names):
        return (f"--partitioners {args.partitioners}: unknown {', '.join(repr(n) for n in unknown) or 'empty name'}; "
                f"choose from {', '.join(PARTITIONERS)}")
    return fanouts_problem(args.fanouts, args.hops)


def fanouts_problem(fanouts: list[int] | None, hops: int) -> str | None:
    """A sentence when ``--fanouts`` does not give one fanout per hop."""
    if fanouts is not None and len(fanouts) != hops:
        return (f"--fanouts {','.join(map(str, fanouts))} gives {len(fanouts)} hop(s) but --hops is {hops}; "
                f"give one fanout per hop")
    return None


def read_graph(data_dir: str | Path) -> tuple[sp.csr_matrix, dict[str, np.ndarray], dict[str, Any]]:
    """The whole adjacency and the train/val/test masks of a prepared dataset, in the original node ids."""
    meta = read_meta(data_dir)
    order = read_permutation(Path(data_dir), meta)
    pieces = [read_part(Path(data_dir), meta, index) for index in range(meta["num_parts"])]
    offsets = meta["row_offsets"]
    rows = np.concatenate([offsets[index] + np.repeat(np.arange(piece["indptr"].size - 1, dtype=np.int64),
                                                      np.diff(piece["indptr"]))
                           for index, piece in enumerate(pieces)])
    indices = np.concatenate([piece["indices"] for piece in pieces]).astype(np.int64)
    n = int(meta["num_nodes"])
    adjacency = sp.csr_matrix((np.concatenate([piece["data"] for piece in pieces]), (order[rows], order[indices])),
                              shape=(n, n))
    masks = {}
    for name in ("train", "val", "test"):
        mask = np.zeros(n, dtype=bool)
        mask[order] = np.concatenate([piece[name] for piece in pieces]).astype(bool)
        masks[name] = mask
    return adjacency, masks, meta


def main(comm: object, args: argparse.Namespace) -> int:
    if getattr(comm, "rank", 0) != 0:
        return 0
    adjacency, masks, meta = read_graph(args.data)
    parts = args.parts or int(meta["num_parts"])
    names = [name.strip() for name in args.partitioners.split(",")]
    results = []
    for name in names:
        start = time.perf_counter()
        part_of = partition(name, adjacency, parts, args.seed, masks["train"], masks=masks, hops=args.hops)
        seconds = time.perf_counter() - start
        stats = sampling_statistics(adjacency, part_of, masks, args.hops, args.fanouts, args.batch_size,
                                    args.batches, args.seed)
        stats["grid_balance"] = blocks_from_partition(adjacency, part_of, parts).report()
        results.append((name, seconds, stats))
    fanouts = results[0][2]["fanouts"] if results else []
    print(f"{meta['name']}: {meta['num_nodes']} nodes, {parts} parts, hops {args.hops}; per batch: "
          f"{args.batch_size} seeds, fanouts {','.join(map(str, fanouts))}, mean of {args.batches} batches per part")
    print("\n".join(format_comparison(results)))
    print("grid balance: nonzeros per block of the relabelled adjacency on R x C process-grid blocks, max/mean, "
          "A [A + I]:")
    for name, _, stats in results:
        print(f"  {name:<13}{grid_line(stats['grid_balance'])}")
    for name, _, stats in results:
        print(f"\n{name}:")
        print("\n".join(format_part_table(stats)))
    if args.json:
        print(json.dumps({"data": str(args.data), "parts": parts,
                          "results": {name: {"seconds": seconds, **stats} for name, seconds, stats in results}}))
    return 0
