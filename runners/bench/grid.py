"""``sparse-dist bench grid``: GCN or SAGE epochs over a process grid from shards: time, bytes against the model,
memory.

Measures what the 3D plan (:mod:`sparse_dist.grid_gcn`) costs on a prepared dataset before it is the training
command's plan: every rank's memory is estimated first (:mod:`runners.grid_memory`; a run its node cannot hold is
refused in one sentence), each rank reads its blocks (:mod:`runners.data.grid_reader`), computes layer 0's
aggregation once (without ``--dropout``), trains ``--epochs`` full-batch Adam steps of a GCN or SAGE
(``--model``; ``--dropout P`` masks every layer's input, :mod:`algorithms.grid_dropout`), and the
command prints per epoch the loss, the slowest rank's step time (and the most any rank spent outside MPI and in
it), the busiest rank's bytes per phase beside the byte model's
prediction, and at the end every rank's peak resident memory beside its estimate and the test accuracy of the
last weights. ``--out FILE`` writes the same as JSON lines (rank 0).
Collective: run it under mpiexec with ``X * Y * Z`` ranks.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algorithms.grid_dropout import GridDropout, load_grid_passes
from runners.argtypes import at_least, number
from runners.data.grid_reader import load_grid_graph, read_meta_everywhere
from runners.grid_memory import check_grid_memory
from sparse_dist.comm import Communicator
from sparse_dist.grid import GridShape, ProcessGrid, roles
from sparse_dist.grid_gcn import (GridCrossEntropy, aggregate_input, as_blocks, bias_block, gcn_layer, grid_logits,
                                  predicted_classes, predicted_input_bytes, step_bytes, weight_block)
from sparse_dist.grid_sage import TERMS, aggregate_sage_input, sage_layers

PHASES = ("forward", "backward", "grad_allreduce")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="a dataset directory made by `sparse-dist prepare`")
    parser.add_argument("--grid", required=True, help="X,Y,Z ranks with X * Y * Z = P (e.g. 2,2,2)")
    parser.add_argument("--model", choices=("gcn", "sage"), default="gcn",
                        help="the layers: gcn or sage (GraphSAGE-mean) (default: %(default)s)")
    parser.add_argument("--layers", type=at_least(1), default=3, help="layers, >= 1 (default: %(default)s)")
    parser.add_argument("--hidden", type=at_least(1), default=128, help="hidden width, >= 1 (default: %(default)s)")
    parser.add_argument("--epochs", type=at_least(1), default=5, help="Adam steps, >= 1 (default: %(default)s)")
    parser.add_argument("--lr", type=number(0.0, 10.0, low_open=True), default=0.01,
                        help="Adam's learning rate (default: %(default)s)")
    parser.add_argument("--dropout", type=number(0.0, 1.0, high_open=True), default=0.0,
                        help="dropout of every layer's input, in [0, 1); above 0 layer 0 is aggregated every step "
                             "(default: %(default)s)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--seed", type=at_least(0), default=0, help="seed of the weights (default: 0)")
    parser.add_argument("--out", default=None, help="JSON lines of every epoch and the summary (rank 0 writes)")


def _weights(dims: list[int], seed: int, dtype: torch.dtype, matrices: int) -> list[tuple[torch.Tensor, ...]]:
    """``matrices`` Glorot-uniform ``F x F'`` weights (GCN 1; SAGE 2: neighbours', own rows') and a zero bias per
    layer, every layer's whole matrices from one seeded generator (every rank draws the same and keeps its
    blocks)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for fan_in, fan_out in zip(dims[:-1], dims[1:]):
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        weights = tuple(((torch.rand(fan_in, fan_out, generator=generator, dtype=torch.float64) * 2 - 1)
                         * bound).to(dtype) for _ in range(matrices))
        out.append((*weights, torch.zeros(fan_out, dtype=dtype)))
    return out


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def main(comm: Communicator, args: argparse.Namespace) -> int:
    shape = GridShape.parse(args.grid, comm.size)
    dtype = torch.float32 if args.dtype == "float32" else torch.float64
    itemsize = torch.tensor([], dtype=dtype).element_size()
    grid = ProcessGrid(comm, shape)
    meta = read_meta_everywhere(comm, args.data)
    sage = args.model == "sage"
    terms = TERMS if sage else 1
    dropping = args.dropout > 0.0
    memory = check_grid_memory(comm, meta, shape, grid.coords, args.layers, args.hidden, itemsize, terms, dropping)
    began = time.perf_counter()
    graph = load_grid_graph(comm, grid, args.data, args.layers, np.float32 if dtype == torch.float32 else np.float64,
                            normalization="mean" if sage else "symmetric")
    blocks = as_blocks(graph.adjacency, dtype, torch.device("cpu"))  # shares the blocks' arrays
    nonzeros = comm.allgather_array(np.array([sum(b.nnz for b in graph.adjacency)], dtype=np.int64)).ravel()
    graph.adjacency = []
    n, layers = graph.num_nodes, args.layers
    dims = [graph.feature_dim] + [args.hidden] * (layers - 1) + [graph.num_classes]
    params = [tuple(weight_block(grid, layer, t).requires_grad_() for t in full[:-1])
              + (bias_block(grid, layer, full[-1]).requires_grad_(),)
              for layer, full in enumerate(_weights(dims, args.seed, dtype, terms))]
    optimizer = torch.optim.Adam([p for pair in params for p in pair], lr=args.lr)
    if dropping:
        load_grid_passes(grid, n, dims, torch.device("cpu"), dtype, args.epochs)
    layer_fn = sage_layers(grid, n) if sage else gcn_layer
    comm.stats.reset()
    features = torch.from_numpy(graph.features)
    first = None
    if not dropping:  # X[o, i] does not change: its aggregation once, and X is not read again
        first = (aggregate_sage_input(features, blocks[0], grid, n) if sage
                 else aggregate_input(features, blocks[0], grid))
        del features
        graph.features = np.zeros((0, 0))
    input_sent = comm.allgather_array(np.array([comm.stats.phases["halo"].bytes_sent,
                                                0 if dropping else predicted_input_bytes(grid, n, dims[0], itemsize,
                                                                                         terms)],
                                               dtype=np.int64)).max(axis=0)
    load_seconds = time.perf_counter() - began
    labels = torch.from_numpy(graph.labels.astype(np.int64))
    train = torch.from_numpy(graph.masks["train"])
    class_lo = grid.block(graph.num_classes, roles(layers - 1)[0])[0]
    train_count = int(comm.allgather_array(np.array([int(train.sum())], dtype=np.int64))[:, 0].sum()
                      // (shape.size // shape.of(roles(layers - 1)[2])))  # every replica over (o, i) counts its rows
    predicted = step_bytes(shape, grid.coords, n, dims, itemsize, terms, input_once=not dropping)
    records: list[dict[str, Any]] = []
    logits = first
    for epoch in range(1, args.epochs + 1):
        comm.stats.reset()
        comm.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        masks = GridDropout(args.dropout, args.seed, epoch - 1, grid, n, dims) if dropping else None
        h = grid_logits(features if dropping else None, params, blocks, grid, first_aggregation=first,
                        layer_fn=layer_fn, dropout=masks)
        loss = GridCrossEntropy.apply(h, labels, train, class_lo, train_count, grid, layers - 1)
        loss.backward()
        optimizer.step()
        seconds = time.perf_counter() - start
        logits = h.detach()
        sent = np.array([comm.stats.phases[phase].bytes_sent for phase in PHASES], dtype=np.int64)
        busiest = comm.allgather_array(sent).max(axis=0)
        expected = comm.allgather_array(np.array([predicted[p] for p in PHASES], dtype=np.int64)).max(axis=0)
        in_mpi = sum(counter.seconds for counter in comm.stats.phases.values())
        timing = comm.allgather_array(np.array([seconds, in_mpi]))
        slowest = float(timing[:, 0].max())
        record = {"type": "epoch", "epoch": epoch, "loss": float(loss.detach()), "seconds": slowest,
                  "compute_seconds_most": float((timing[:, 0] - timing[:, 1]).max()),
                  "collective_seconds_most": float(timing[:, 1].max()),
                  "bytes_busiest_rank": dict(zip(PHASES, busiest.tolist())),
                  "bytes_predicted": dict(zip(PHASES, expected.tolist()))}
        records.append(record)
        if comm.rank == 0:
            print(f"epoch {epoch:>4} loss {record['loss']:.4f} step {slowest:.3f} s (compute at most "
                  f"{record['compute_seconds_most']:.3f}, in MPI at most {record['collective_seconds_most']:.3f})  "
                  "bytes (busiest rank) "
                  + ", ".join(f"{p} {b / 1e6:.2f} MB (model {e / 1e6:.2f})" for p, b, e in zip(PHASES, busiest, expected)),
                  flush=True)
    if dropping:  # the last step's logits were dropped: the test accuracy is of a forward without dropout
        with torch.no_grad():
            logits = grid_logits(features, params, blocks, grid, layer_fn=layer_fn)
    classes = predicted_classes(logits, class_lo, grid, layers - 1)
    test = torch.from_numpy(graph.masks["test"])
    counts = comm.allgather_array(np.array([int((classes[test] == labels[test]).sum()), int(test.sum())],
                                           dtype=np.int64))  # replicas count the same rows alike: the ratio holds
    peaks = comm.allgather_array(np.array([_peak_rss_bytes()], dtype=np.int64))[:, 0]
    beyond = peaks - np.array(memory["rss_at_start_per_rank"], dtype=np.int64)
    ratios = np.array(memory["estimate_per_rank"], dtype=np.float64) / np.maximum(beyond, 1)
    summary = {"type": "summary", "model": args.model, "dropout": args.dropout, "grid": str(shape),
               "ranks": comm.size, "nodes": n, "layers": layers,
               "hidden": args.hidden, "dtype": args.dtype, "load_seconds": load_seconds,
               "input_bytes_busiest_rank": int(input_sent[0]), "input_bytes_predicted": int(input_sent[1]),
               "memory": {**memory, "peak_beyond_start_per_rank": beyond.tolist(),
                          "estimate_over_peak": [float(r) for r in ratios]},
               "test_acc": float(counts[:, 0].sum() / max(counts[:, 1].sum(), 1)),
               "block_nonzeros": {"max": int(nonzeros.max()), "mean": float(nonzeros.mean()),
                                  "max_over_mean": float(nonzeros.max() / max(nonzeros.mean(), 1e-300))},
               "peak_rss_bytes": peaks.tolist()}
    if comm.rank == 0:
        print(f"grid {shape}: test accuracy {summary['test_acc']:.4f}; nonzeros a rank (3 rotations) max/mean "
              f"{summary['block_nonzeros']['max_over_mean']:.3f}; peak memory a rank "
              f"{peaks.min() / 2**30:.2f}-{peaks.max() / 2**30:.2f} GiB (sum {peaks.sum() / 2**30:.2f} GiB), "
              f"estimate / peak beyond start {ratios.min():.2f}-{ratios.max():.2f}; blocks read and layer 0 "
              f"aggregated in {load_seconds:.1f} s ({input_sent[0] / 1e6:.2f} MB on the busiest rank, model "
              f"{input_sent[1] / 1e6:.2f})", flush=True)
        if args.out:
            path = Path(args.out)
            temporary = path.with_name(path.name + ".tmp")
            temporary.write_text("".join(json.dumps(r) + "\n" for r in [*records, summary]))
            temporary.replace(path)
    grid.free()
    return 0
