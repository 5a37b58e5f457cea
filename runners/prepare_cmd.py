"""``sparse-dist prepare``: turn a dataset into a directory of shards, once (single process)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from runners.data.datasets import load_edge_list, load_ogb, planted_classes
from runners.data.planetoid import BUILTIN_PLANETOID, load_planetoid
from runners.data.grid_balance import blocks_from_shards, grid_line
from runners.data.partition import AUTO, DEFAULT_HOPS, PARTITIONERS, resolve_partitioner
from runners.data.sampling_stats import DEFAULT_BATCH_SIZE, DEFAULT_FANOUT, format_part_table, sampling_statistics
from runners.data.rmat import (EDGE_FACTOR, GRAPH500, check_abcd, expected_isolated, expected_top_degree,
                               rmat_dataset_bounded)
from runners.data.sampling_stats import balance
from runners.data.sbm import measured_homophily, stochastic_blocks
from runners.data.stages import Stages
from runners.data.stream_synthetic import write_streamed_synthetic
from runners.argtypes import at_least, number
from runners.argtypes import seed as seed_number
from runners.data.shards import (ShardError, clear_leftovers, dataset_problem, output_problem, read_permutation,
                                 write_shards)
from runners.prepare_resources import (check_prepare_resources, prepare_memory, prepare_rmat_memory, rmat_entries,
                                       shard_bytes)

EPILOG = """\
edge-list input (prepare edgelist --edges E --node-features X.npy --labels Y [options]):
  --edges E          one edge per line: "src dst", two integer node ids separated by
                     spaces or tabs; "#" starts a comment, blank lines are skipped
                     (or an E x 2 integer array as .npy, or a single-array .npz).
                     Node ids are 0-based rows of the features file, 0 <= id < N.
                     Edge "u v" means node u aggregates from node v (row u, column v
                     of the adjacency). The graph is kept DIRECTED as given; pass
                     --symmetrize to add every reverse edge. Duplicate edges
                     collapse to one edge of weight 1; self-loops are dropped (GCN
                     adds its own).
  --node-features X  .npy (or single-array .npz), N x F numbers, all finite; row i
                     holds node i. Not row-normalised (train --feature-norm auto).
                     float64 features are kept as float64 (train --dtype float64
                     sees them bitwise); any other type is stored as float32.
  --labels Y         class ids, one per node: .npy/.npz of N integers, or text with
                     one id per line ("#" comments). Without --num-classes, C is the
                     number of distinct ids and they must be exactly 0..C-1; with
                     --num-classes C they must lie in 0..C-1. Multi-label: an N x C
                     array of 0/1 (.npy/.npz, or text with C columns).
  --masks M.npz      boolean arrays "train", "val", "test" of length N; without it a
                     seeded uniform random split by --split train,val,test fractions
                     (default 0.1,0.1,0.8; a node may be in no split).

example:
  $ cat edges.txt
  # src dst
  0 1
  1 2
  $ sparse-dist prepare edgelist --edges edges.txt --node-features x.npy \\
        --labels labels.txt --symmetrize --parts 2 --out data/mygraph
"""


SAMPLING_VIEW_ENTRIES = 1 << 26
"""Adjacency entries above which ``prepare`` leaves out the K-hop sampling view (R-MAT SCALE 22 has 128M)."""
SYNTHETIC_WORDS = 20
"""Words per node of the planted-classes generator (:func:`runners.data.datasets.planted_classes`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", choices=("planetoid", "synthetic", "rmat", "edgelist", "ogb"),
                        help="planetoid: ind.NAME.* files; synthetic: planted classes; rmat: a Graph500 R-MAT "
                             "power-law graph whose labels need the graph (--scale S); edgelist: your own graph; "
                             "ogb: an OGB node-property dataset (--name ogbn-arxiv --root DIR)")
    parser.add_argument("--out", required=True, help="dataset directory to create")
    parser.add_argument("--name", default=None,
                        help="planetoid: dataset name in the file names (default: cora); edgelist: dataset name")
    parser.add_argument("--root", default=None,
                        help=f"planetoid: directory of the ind.NAME.* files (default: built-in {BUILTIN_PLANETOID}); "
                             "ogb: the directory holding ogbn_NAME/")
    parser.add_argument("--parts", type=at_least(1), default=2, help="number of shards, >= 1 (default: 2)")
    parser.add_argument("--partitioner", choices=(AUTO, *PARTITIONERS), default=AUTO,
                        help="how nodes are split into parts (default: auto = metis when pymetis imports, "
                             "metis-train for rmat's power-law graphs, else block with a printed note; synthetic "
                             "--stream always writes contiguous blocks). metis: small boundary, fewest exchange bytes; metis-train: DistDGL's "
                             "multi-constraint METIS (training/validation/test/other nodes and edges balanced); "
                             "bytegnn: ByteGNN's K-hop blocks around labelled nodes (--hops); block: contiguous "
                             "ranges of the input ids; random: balanced random (a uniformly random permutation of the "
                             "ids, parts its equal ranges); permute: for the grid plans, a random permutation dealt "
                             "by degree so that parts and adjacency blocks hold equal entries; prints each grid's "
                             "nonzeros per block, max/mean")
    parser.add_argument("--hops", type=at_least(1), default=None,
                        help=f"K: bytegnn's block radius and the depth of the K-hop sampling statistics printed "
                             f"at the end, >= 1 (default: {DEFAULT_HOPS})")
    parser.add_argument("--seed", type=seed_number, default=0,
                        help="seed of the partitioner, the random split and the synthetic graph, >= 0 (default: 0)")
    parser.add_argument("--nodes", type=at_least(1), default=100_000,
                        help="synthetic: number of nodes, >= 1 (default: %(default)s)")
    parser.add_argument("--classes", type=at_least(2), default=8,
                        help="synthetic, rmat: number of classes, >= 2 (default: %(default)s)")
    parser.add_argument("--degree", type=at_least(1), default=10,
                        help="synthetic: out-edges per node before symmetrising, >= 1 (default: %(default)s)")
    parser.add_argument("--features", type=at_least(1), default=128,
                        help="synthetic, rmat: feature width, >= 1 (default: %(default)s)")
    parser.add_argument("--scale", type=at_least(1), default=None,
                        help="rmat: 2^SCALE vertices (Graph500's SCALE; required for rmat)")
    parser.add_argument("--edge-factor", type=at_least(1), default=EDGE_FACTOR,
                        help="rmat: edge draws per vertex, before duplicates merge (default: Graph500's %(default)s)")
    parser.add_argument("--abcd", default=",".join(map(str, GRAPH500)),
                        help="rmat: R-MAT quadrant probabilities A,B,C,D, each >= 0, summing to 1 "
                             "(default: Graph500's %(default)s)")
    parser.add_argument("--isolated", choices=("keep", "drop"), default="keep",
                        help="rmat: keep the vertices no edge touches (Graph500 does) or drop them "
                             "(default: %(default)s); their number is printed either way")
    parser.add_argument("--edges", help="edgelist: 'src dst' pairs (text, .npy or .npz; format below)")
    parser.add_argument("--node-features", help="edgelist: features .npy (nodes x width)")
    parser.add_argument("--labels", help="edgelist: class ids (.npy or text, one per node), or nodes x classes of 0/1")
    parser.add_argument("--num-classes", type=at_least(1), default=None,
                        help="edgelist: number of classes C, ids 0..C-1 (default: the number of distinct ids, "
                             "which must then be 0..C-1)")
    parser.add_argument("--masks", help="edgelist: .npz with boolean train/val/test (default: random split)")
    parser.add_argument("--split", default="0.1,0.1,0.8", help="edgelist: train,val,test fractions")
    parser.add_argument("--symmetrize", action="store_true", help="edgelist: add every reverse edge")
    parser.add_argument("--directed", action="store_true", help="ogb: keep the graph directed (default: symmetrise)")
    parser.add_argument("--download", action="store_true", help="ogb: let ogb download the data if absent")
    parser.add_argument("--homophily", type=number(0.0, 1.0), default=None,
                        help="synthetic: a stochastic block model instead of planted communities: classes are the "
                             "blocks, a node's edges stay in its class with this probability (1/classes: no "
                             "communities; below: heterophilous; every partition of it is high-cut); features as "
                             "the planted classes' (runners/data/sbm.py)")
    parser.add_argument("--stream", action="store_true",
                        help="synthetic: generate and shard in two streaming passes with bounded memory "
                             "(block partition), for graphs larger than memory")
    parser.add_argument("--graph", choices=("clustered", "rmat"), default="clustered",
                        help="synthetic --stream: clustered communities or R-MAT skewed degrees")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing dataset directory made by prepare (one holding only the files "
                             "its meta.json lists); anything else at --out is refused, never removed")


def _split(text: str) -> tuple[float, ...] | None:
    try:
        split = tuple(float(x) for x in text.split(","))
    except ValueError:
        return None
    return split if len(split) == 3 and min(split) >= 0 and sum(split) <= 1 + 1e-9 else None


def _abcd(text: str) -> tuple[float, ...] | None:
    try:
        abcd = tuple(float(x) for x in text.split(","))
    except ValueError:
        return None
    return abcd if check_abcd(abcd) is None else None


def check_arguments(args: argparse.Namespace) -> str | None:
    """Flag combinations argparse cannot check, and an ``--out`` prepare may not write (refused before MPI starts
    and before any input is read; checked again when the new dataset is swapped into place)."""
    problem = output_problem(args.out, args.overwrite)
    if problem:
        return f"--out {problem}"
    if args.source == "synthetic" and args.classes > args.features:
        return (f"--classes {args.classes} is more than --features {args.features}: the synthetic graph plants each "
                f"class in its own features; give --features {args.classes} or more")
    if args.source == "synthetic" and args.stream and args.partitioner not in (AUTO, "block"):
        return ("prepare synthetic --stream writes contiguous blocks; use --partitioner block "
                "(or leave --partitioner out)")
    if args.homophily is not None and (args.source != "synthetic" or args.stream):
        return "--homophily makes prepare synthetic's stochastic block model; it has no meaning with --stream or other sources"
    if args.source == "synthetic" and args.stream and args.hops is not None:
        return "prepare synthetic --stream prints no K-hop statistics and uses no bytegnn blocks; leave --hops out"
    if args.source == "rmat" and args.scale is None:
        return "prepare rmat needs --scale S (2^S vertices; Graph500's smallest benchmark class is --scale 26)"
    if args.source == "rmat" and _abcd(args.abcd) is None:
        return (f"--abcd {args.abcd}: expected four probabilities A,B,C,D >= 0 summing to 1 with A + B and C + D "
                f"above 0, e.g. Graph500's {','.join(map(str, GRAPH500))}")
    if args.source == "ogb" and (not args.name or not args.root):
        return "prepare ogb needs --name (e.g. ogbn-arxiv) and --root DIR"
    if args.source == "edgelist":
        missing = [flag for flag, value in (("--edges", args.edges), ("--node-features", args.node_features),
                                            ("--labels", args.labels)) if not value]
        if missing:
            return f"prepare edgelist needs {', '.join(missing)}"
        if _split(args.split) is None:
            return (f"--split {args.split}: expected three non-negative fractions train,val,test summing to "
                    f"at most 1, e.g. 0.1,0.1,0.8")
    return None


def main(comm: object, args: argparse.Namespace) -> int:
    rank = getattr(comm, "rank", 0)
    if rank != 0:
        return 0  # prepare is a single-process step; extra ranks have nothing to do
    start = time.perf_counter()
    problem = output_problem(args.out, args.overwrite)  # before any input is read
    if problem:
        raise ShardError(f"--out {problem}")
    for leftover in clear_leftovers(args.out):  # what a killed prepare of this --out left beside it
        print(f"sparse-dist prepare: {'removed' if leftover.removed else 'kept'} {leftover.path}: {leftover.why}",
              flush=True)
    if args.source == "synthetic":  # its size is known from the flags: refuse before generating anything
        problem = dataset_problem(args.nodes, args.parts, None)
        if problem:
            raise ShardError(f"prepare synthetic: {problem}")
        edges = 2 * args.nodes * args.degree  # symmetrised; duplicates make it a little less
        # the block model's generator: six int64/float64 arrays an edge draw, and the word draws
        generator = None if args.homophily is None else 48 * args.degree + 4 * 8 * SYNTHETIC_WORDS
        check_prepare_resources(args.out, None if args.stream else prepare_memory(
            args.nodes, edges, args.features, args.parts, words=SYNTHETIC_WORDS, generator_per_node=generator),
            shard_bytes(args.nodes, edges, args.features))
    if args.source == "rmat":  # its size is known from the flags: refuse before generating anything
        nodes = 1 << args.scale
        problem = dataset_problem(nodes, args.parts, None)
        if problem:
            raise ShardError(f"prepare rmat: {problem}")
        entries = rmat_entries(args.scale, args.edge_factor)
        partitioner_kind, _ = resolve_partitioner(args.partitioner, skewed_degrees=True)
        check_prepare_resources(args.out, prepare_rmat_memory(nodes, entries, args.features, args.parts,
                                                              partitioner_kind, args.classes),
                                shard_bytes(nodes, entries, args.features), hint="--partitioner random or a "
                                "smaller --scale")
    stages = Stages()
    streamed = args.source == "synthetic" and args.stream
    partitioner, note = resolve_partitioner(args.partitioner, contiguous_only=streamed,
                                            skewed_degrees=args.source == "rmat")  # R-MAT: power-law degrees
    if note:
        print(f"note: {note}", flush=True)
    if streamed:
        meta = write_streamed_synthetic(args.out, nodes=args.nodes, degree=args.degree, parts=args.parts,
                                        graph=args.graph, classes=args.classes, features=args.features,
                                        seed=args.seed, overwrite=args.overwrite)
        _report(meta, args.out, time.perf_counter() - start)
        return 0
    if args.source == "planetoid":
        data = load_planetoid(args.root or BUILTIN_PLANETOID, args.name or "cora")
    elif args.source == "ogb":
        data = load_ogb(args.name, args.root, symmetrize=not args.directed, allow_download=args.download)
    elif args.source == "rmat":
        data = _rmat(args, stages)
    elif args.source == "edgelist":
        data = load_edge_list(args.edges, args.node_features, args.labels, masks=args.masks,
                              split=_split(args.split), symmetrize=args.symmetrize, seed=args.seed, name=args.name,
                              num_classes=args.num_classes)
    elif args.homophily is not None:
        if args.nodes < args.classes:
            raise ShardError(f"prepare synthetic --homophily: --nodes {args.nodes} is fewer than --classes "
                             f"{args.classes}; every block needs a node")
        data = stochastic_blocks(args.nodes, args.classes, args.degree, args.homophily, args.features, seed=args.seed)
        print(f"stochastic block model: {args.classes} classes, homophily {args.homophily:g} asked, "
              f"{measured_homophily(data):.3f} of the symmetrised entries join a class to itself", flush=True)
    else:
        data = planted_classes(nodes=args.nodes, classes=args.classes, degree=args.degree,
                               features=args.features, seed=args.seed)
    if args.source not in ("synthetic", "rmat"):  # known once loaded: the disk the shards need
        check_prepare_resources(args.out, None, shard_bytes(int(data.num_nodes), int(data.adjacency.nnz),
                                                            int(data.features.shape[1])))
    hops = args.hops or DEFAULT_HOPS
    meta = write_shards(data, args.out, args.parts, partitioner, args.seed, overwrite=args.overwrite, hops=hops,
                        symmetric=args.source == "rmat", stages=stages, progress=True)
    _report(meta, args.out, time.perf_counter() - start)
    if partitioner == "permute":
        with stages.stage("grid balance"):
            _report_grid(meta, args.out)
    if int(data.adjacency.nnz) > SAMPLING_VIEW_ENTRIES:
        print(f"K-hop sampling view skipped: the graph has {int(data.adjacency.nnz)} adjacency entries, more than "
              f"{SAMPLING_VIEW_ENTRIES} (it simulates every part's batches over the whole graph: about a minute at "
              f"R-MAT SCALE 18 on a loaded 2-core machine, growing with the graph)")
    else:
        with stages.stage("sampling view"):
            _report_sampling(data, meta, args.out, hops, args.seed, symmetric=args.source == "rmat")
    print("stages (seconds; resident set size in GiB: at the start and end of the stage, its peak, and the "
          "process's peak so far):")
    print("\n".join(stages.table()), flush=True)
    return 0


def _rmat(args: argparse.Namespace, stages: Stages) -> object:
    """The R-MAT graph of ``prepare rmat`` (:mod:`runners.data.rmat`, bounded memory), its isolated vertices
    and top degree said beside the model's exact expectation."""
    abcd = _abcd(args.abcd)
    started = time.perf_counter()
    data, graph = rmat_dataset_bounded(args.scale, args.edge_factor, features=args.features, classes=args.classes,
                                       abcd=abcd, seed=args.seed, drop_isolated=args.isolated == "drop",
                                       progress=True, stages=stages)
    n = 1 << args.scale
    isolated, spread = expected_isolated(args.scale, args.edge_factor, abcd)
    top, top_spread = expected_top_degree(args.scale, args.edge_factor, abcd)
    degree = np.diff(data.adjacency.indptr)
    print(f"rmat: SCALE {args.scale}, edge factor {args.edge_factor}, A,B,C,D {','.join(f'{p:g}' for p in abcd)}: "
          f"{graph.draws} edge draws -> {data.adjacency.nnz // 2} distinct undirected edges "
          f"({data.adjacency.nnz} stored entries; duplicates merged, self-loops dropped) "
          f"[{time.perf_counter() - started:.1f} s]", flush=True)
    print(f"rmat: {graph.isolated} isolated vertices ({100 * graph.isolated / n:.1f}% of {n}; R-MAT expects "
          f"{isolated:.0f} +- {spread:.0f}), {'dropped' if args.isolated == 'drop' else 'kept'}; max degree "
          f"{int(degree.max()) if degree.size else 0} (expected {top:.0f} +- {top_spread:.0f}); labels: argmax of "
          f"the hidden scores of the features propagated two hops (docs/guide/prepare.md)", flush=True)
    return data


def _report_sampling(data: object, meta: dict, out: str, hops: int, seed: int, symmetric: bool = False) -> None:
    """The partition as mini-batch training sees it (:mod:`runners.data.sampling_stats`), from the written shards'
    permutation, so it describes exactly the partition on disk."""
    order = read_permutation(Path(out), meta)
    part_of = np.repeat(np.arange(meta["num_parts"]), np.diff(meta["row_offsets"]))[np.argsort(order)]
    stats = sampling_statistics(data.adjacency, part_of, data.masks, hops, seed=seed, symmetric=symmetric)
    print(f"K-hop sampling view ({meta['partitioner']}, hops {hops}): khop-remote = rows of X other parts own in "
          f"the {hops}-hop in-neighbourhood of the part's training nodes; per batch of {DEFAULT_BATCH_SIZE} seeds "
          f"with fanout {DEFAULT_FANOUT} per hop (mean of {stats['batches']}): input rows, remote ones, remote "
          f"adjacency rows sampled (`sparse-dist bench partition` compares partitioners)")
    print("\n".join(format_part_table(stats)))


def _report_grid(meta: dict, out: str) -> None:
    """One line: nonzeros per block of the written adjacency on each process grid, max/mean, read back from the
    shards one part at a time (:mod:`runners.data.grid_balance`)."""
    print(f"grid balance ({meta['partitioner']}): nonzeros per block of the adjacency on R x C process-grid blocks, "
          f"max/mean, A [A + I]: {grid_line(blocks_from_shards(out).report())}", flush=True)


def _report(meta: dict, out: str, seconds: float) -> None:
    print(f"prepared {meta['name']}: {meta['num_nodes']} nodes, {meta['num_edges']} edges, "
          f"{meta['feature_dim']} features, {meta['num_classes']} classes, {meta['num_parts']} parts "
          f"({meta['partitioner']}) in {out} [{seconds:.1f} s]")
    if meta.get("feature_dtype") == "float64":
        print("features kept as float64 (as given); train --dtype float64 reads them bitwise, "
              "--dtype float32 rounds them when it loads them")
    print("\n".join(partition_table(meta)), flush=True)


def partition_table(meta: dict) -> list[str]:
    """The partition table of a prepared dataset (``meta.json``'s ``partition_stats``): per part its nodes
    (inner rows), training nodes, boundary rows (its rows some other part needs), their ratio to the inner rows,
    adjacency entries (edges) and cut entries (those whose column another part owns); then each column's
    balance (max / mean over parts), the edge cut and the boundary rows in all."""
    stats = meta["partition_stats"]
    parts = meta["num_parts"]
    train = stats.get("train_nodes") or [0] * parts
    cut = stats.get("cut_edges") or [0] * parts
    lines = [f"partition table ({meta['partitioner']}, {parts} parts):",
             f"{'part':>8}{'nodes':>10}{'train':>9}{'boundary':>10}{'b/inner':>9}{'edges':>12}{'cut edges':>12}"]
    for part in range(parts):
        lines.append(f"{part:>8}{stats['inner_nodes'][part]:>10}{train[part]:>9}{stats['boundary_nodes'][part]:>10}"
                     f"{stats['boundary_over_inner'][part]:>9.3f}{stats['edges'][part]:>12}{cut[part]:>12}")

    def ratio(values: list[int]) -> str:
        value = balance(np.asarray(values, dtype=np.float64))
        return "-" if value is None else f"{value:.3f}"

    lines.append(f"{'max/mean':>8}{ratio(stats['inner_nodes']):>10}{ratio(train):>9}"
                 f"{ratio(stats['boundary_nodes']):>10}{'':>9}{ratio(stats['edges']):>12}{ratio(cut):>12}")
    if "total_cut_edges" in stats:
        edges = max(meta["num_edges"], 1)
        lines.append(f"edge cut: {stats['total_cut_edges']} of {meta['num_edges']} adjacency entries "
                     f"({100 * stats['total_cut_edges'] / edges:.1f}%) have their column in another part; "
                     f"boundary rows (rows other parts need): {stats['total_boundary_nodes']}")
    lines.append("predicted forward exchange bytes per 4-byte feature column: " + ", ".join(
        f"{plan} {value}" for plan, value in stats["predicted_forward_bytes_per_feature"].items()))
    return lines
