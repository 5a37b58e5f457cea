"""``sparse-dist prepare``: turn a dataset into a directory of shards, once (single process)."""

from __future__ import annotations

import argparse
import time

from runners.data.datasets import BUILTIN_PLANETOID, load_edge_list, load_ogb, load_planetoid, planted_classes
from runners.data.partition import PARTITIONERS
from runners.data.stream_synthetic import write_streamed_synthetic
from runners.data.shards import write_shards


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", choices=("planetoid", "synthetic", "edgelist", "ogb"),
                        help="planetoid: ind.NAME.* files; synthetic: planted classes; edgelist: your own graph; "
                             "ogb: an OGB node-property dataset (--name ogbn-arxiv --root DIR)")
    parser.add_argument("--out", required=True, help="dataset directory to create")
    parser.add_argument("--name", default=None,
                        help="planetoid: dataset name in the file names (default: cora); edgelist: dataset name")
    parser.add_argument("--root", default=None,
                        help=f"planetoid: directory of the ind.NAME.* files (default: built-in {BUILTIN_PLANETOID}); "
                             "ogb: the directory holding ogbn_NAME/")
    parser.add_argument("--parts", type=int, default=2, help="number of shards (default: 2)")
    parser.add_argument("--partitioner", choices=PARTITIONERS, default="block")
    parser.add_argument("--seed", type=int, default=0, help="seed of the partitioner and the synthetic graph")
    parser.add_argument("--nodes", type=int, default=100_000, help="synthetic: number of nodes")
    parser.add_argument("--classes", type=int, default=8, help="synthetic: number of classes")
    parser.add_argument("--degree", type=int, default=10, help="synthetic: out-edges per node before symmetrising")
    parser.add_argument("--features", type=int, default=128, help="synthetic: feature width")
    parser.add_argument("--edges", help="edgelist: 'src dst' pairs (text, .npy or .npz)")
    parser.add_argument("--node-features", help="edgelist: features .npy (nodes x width)")
    parser.add_argument("--labels", help="edgelist: labels .npy (class ids, or nodes x classes of 0/1)")
    parser.add_argument("--masks", help="edgelist: .npz with boolean train/val/test (default: random split)")
    parser.add_argument("--split", default="0.1,0.1,0.8", help="edgelist: train,val,test fractions")
    parser.add_argument("--symmetrize", action="store_true", help="edgelist: add every reverse edge")
    parser.add_argument("--directed", action="store_true", help="ogb: keep the graph directed (default: symmetrise)")
    parser.add_argument("--download", action="store_true", help="ogb: let ogb download the data if absent")
    parser.add_argument("--stream", action="store_true",
                        help="synthetic: generate and shard in two streaming passes with bounded memory "
                             "(block partition), for graphs larger than memory")
    parser.add_argument("--graph", choices=("clustered", "rmat"), default="clustered",
                        help="synthetic --stream: clustered communities or R-MAT skewed degrees")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset directory")


def main(comm: object, args: argparse.Namespace) -> int:
    rank = getattr(comm, "rank", 0)
    if rank != 0:
        return 0  # prepare is a single-process step; extra ranks have nothing to do
    start = time.perf_counter()
    if args.source == "synthetic" and args.stream:
        if args.partitioner != "block":
            raise SystemExit("prepare synthetic --stream writes contiguous blocks; use --partitioner block")
        meta = write_streamed_synthetic(args.out, nodes=args.nodes, degree=args.degree, parts=args.parts,
                                        graph=args.graph, classes=args.classes, features=args.features,
                                        seed=args.seed, overwrite=args.overwrite)
        _report(meta, args.out, time.perf_counter() - start)
        return 0
    if args.source == "planetoid":
        data = load_planetoid(args.root or BUILTIN_PLANETOID, args.name or "cora")
    elif args.source == "ogb":
        if not args.name or not args.root:
            raise SystemExit("prepare ogb needs --name (e.g. ogbn-arxiv) and --root DIR")
        data = load_ogb(args.name, args.root, symmetrize=not args.directed, allow_download=args.download)
    elif args.source == "edgelist":
        missing = [flag for flag, value in (("--edges", args.edges), ("--node-features", args.node_features),
                                            ("--labels", args.labels)) if not value]
        if missing:
            raise SystemExit(f"prepare edgelist needs {', '.join(missing)}")
        split = tuple(float(x) for x in args.split.split(","))
        data = load_edge_list(args.edges, args.node_features, args.labels, masks=args.masks,
                              split=split, symmetrize=args.symmetrize, seed=args.seed, name=args.name)
    else:
        data = planted_classes(nodes=args.nodes, classes=args.classes, degree=args.degree,
                               features=args.features, seed=args.seed)
    meta = write_shards(data, args.out, args.parts, args.partitioner, args.seed, overwrite=args.overwrite)
    _report(meta, args.out, time.perf_counter() - start)
    return 0


def _report(meta: dict, out: str, seconds: float) -> None:
    print(f"prepared {meta['name']}: {meta['num_nodes']} nodes, {meta['num_edges']} edges, "
          f"{meta['feature_dim']} features, {meta['num_classes']} classes, {meta['num_parts']} parts "
          f"({meta['partitioner']}) in {out} [{seconds:.1f} s]")
    stats = meta["partition_stats"]
    print(f"{'part':>5}{'inner':>10}{'train':>8}{'boundary':>10}{'b/inner':>9}{'edges':>12}")
    for part in range(meta["num_parts"]):
        print(f"{part:>5}{stats['inner_nodes'][part]:>10}{stats['train_nodes'][part]:>8}"
              f"{stats['boundary_nodes'][part]:>10}{stats['boundary_over_inner'][part]:>9.3f}{stats['edges'][part]:>12}")
    print("predicted forward exchange bytes per 4-byte feature column: " + ", ".join(
        f"{plan} {value}" for plan, value in stats["predicted_forward_bytes_per_feature"].items()))
