"""``sparse-dist bench grid``: GCN epochs over a process grid from shards: time, bytes against the model, memory.

Measures what the 3D plan (:mod:`sparse_dist.grid_gcn`) costs on a prepared dataset before it is the training
command's plan: each rank reads its blocks (:mod:`runners.data.grid_reader`), trains ``--epochs`` full-batch
Adam steps of a GCN (no dropout), and the command prints per epoch the loss, the slowest rank's step time, the
busiest rank's bytes per phase beside the byte model's prediction, and at the end every rank's peak resident
memory and the test accuracy of the last weights. ``--out FILE`` writes the same as JSON lines (rank 0).
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

from runners.argtypes import at_least, number
from runners.data.grid_reader import load_grid_graph
from sparse_dist.comm import Communicator
from sparse_dist.grid import GridShape, ProcessGrid, roles
from sparse_dist.grid_gcn import (GridCrossEntropy, as_blocks, grid_logits, predicted_classes,
                                  predicted_layer_bytes, predicted_loss_bytes)

PHASES = ("forward", "backward", "grad_allreduce")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="a dataset directory made by `sparse-dist prepare`")
    parser.add_argument("--grid", required=True, help="X,Y,Z ranks with X * Y * Z = P (e.g. 2,2,2)")
    parser.add_argument("--layers", type=at_least(1), default=3, help="GCN layers, >= 1 (default: %(default)s)")
    parser.add_argument("--hidden", type=at_least(1), default=128, help="hidden width, >= 1 (default: %(default)s)")
    parser.add_argument("--epochs", type=at_least(1), default=5, help="Adam steps, >= 1 (default: %(default)s)")
    parser.add_argument("--lr", type=number(0.0, 10.0, low_open=True), default=0.01,
                        help="Adam's learning rate (default: %(default)s)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--seed", type=at_least(0), default=0, help="seed of the weights (default: 0)")
    parser.add_argument("--out", default=None, help="JSON lines of every epoch and the summary (rank 0 writes)")


def _weights(dims: list[int], seed: int, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Glorot-uniform ``F x F'`` weights and zero biases, every layer's whole matrix from one seeded generator
    (every rank draws the same and keeps its block)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for fan_in, fan_out in zip(dims[:-1], dims[1:]):
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        out.append((((torch.rand(fan_in, fan_out, generator=generator, dtype=torch.float64) * 2 - 1) * bound).to(dtype),
                    torch.zeros(fan_out, dtype=dtype)))
    return out


def _block(grid: ProcessGrid, layer: int, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    outer, inner, _ = roles(layer)
    (r0, r1), (c0, c1) = grid.block(weight.shape[0], inner), grid.block(weight.shape[1], outer)
    return (weight[r0:r1, c0:c1].clone().requires_grad_(), bias[c0:c1].clone().requires_grad_())


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def main(comm: Communicator, args: argparse.Namespace) -> int:
    shape = GridShape.parse(args.grid, comm.size)
    dtype = torch.float32 if args.dtype == "float32" else torch.float64
    itemsize = torch.tensor([], dtype=dtype).element_size()
    grid = ProcessGrid(comm, shape)
    began = time.perf_counter()
    graph = load_grid_graph(comm, grid, args.data, args.layers)
    blocks = as_blocks(graph.adjacency, dtype, torch.device("cpu"))
    nonzeros = comm.allgather_array(np.array([sum(b.nnz for b in graph.adjacency)], dtype=np.int64)).ravel()
    graph.adjacency = []  # the torch blocks hold what the steps need
    load_seconds = time.perf_counter() - began
    n, layers = graph.num_nodes, args.layers
    dims = [graph.feature_dim] + [args.hidden] * (layers - 1) + [graph.num_classes]
    params = [_block(grid, layer, w, b) for layer, (w, b) in enumerate(_weights(dims, args.seed, dtype))]
    optimizer = torch.optim.Adam([p for pair in params for p in pair], lr=args.lr)
    x = torch.from_numpy(graph.features).to(dtype)
    labels = torch.from_numpy(graph.labels.astype(np.int64))
    train = torch.from_numpy(graph.masks["train"])
    class_lo = grid.block(graph.num_classes, roles(layers - 1)[0])[0]
    train_count = int(comm.allgather_array(np.array([int(train.sum())], dtype=np.int64))[:, 0].sum()
                      // (shape.size // shape.of(roles(layers - 1)[2])))  # every replica over (o, i) counts its rows
    predicted = {phase: 0 for phase in PHASES}
    predicted["forward"] += predicted_loss_bytes(grid, layers - 1, n, itemsize)
    for layer in range(layers):
        for phase, value in predicted_layer_bytes(grid, layer, n, dims[layer], dims[layer + 1], itemsize,
                                                  layer > 0).items():
            predicted[phase] += value
    records: list[dict[str, Any]] = []
    logits = x
    for epoch in range(1, args.epochs + 1):
        comm.stats.reset()
        comm.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        h = grid_logits(x, params, blocks, grid)
        loss = GridCrossEntropy.apply(h, labels, train, class_lo, train_count, grid, layers - 1)
        loss.backward()
        optimizer.step()
        seconds = time.perf_counter() - start
        logits = h.detach()
        sent = np.array([comm.stats.phases[phase].bytes_sent for phase in PHASES], dtype=np.int64)
        busiest = comm.allgather_array(sent).max(axis=0)
        expected = comm.allgather_array(np.array([predicted[p] for p in PHASES], dtype=np.int64)).max(axis=0)
        slowest = float(comm.allgather_array(np.array([seconds]))[:, 0].max())
        record = {"type": "epoch", "epoch": epoch, "loss": float(loss.detach()), "seconds": slowest,
                  "bytes_busiest_rank": dict(zip(PHASES, busiest.tolist())),
                  "bytes_predicted": dict(zip(PHASES, expected.tolist()))}
        records.append(record)
        if comm.rank == 0:
            print(f"epoch {epoch:>4} loss {record['loss']:.4f} step {slowest:.3f} s  bytes (busiest rank) "
                  + ", ".join(f"{p} {b / 1e6:.2f} MB (model {e / 1e6:.2f})" for p, b, e in zip(PHASES, busiest, expected)),
                  flush=True)
    classes = predicted_classes(logits, class_lo, grid, layers - 1)
    test = torch.from_numpy(graph.masks["test"])
    counts = comm.allgather_array(np.array([int((classes[test] == labels[test]).sum()), int(test.sum())],
                                           dtype=np.int64))  # replicas count the same rows alike: the ratio holds
    peaks = comm.allgather_array(np.array([_peak_rss_bytes()], dtype=np.int64))[:, 0]
    summary = {"type": "summary", "grid": str(shape), "ranks": comm.size, "nodes": n, "layers": layers,
               "hidden": args.hidden, "dtype": args.dtype, "load_seconds": load_seconds,
               "test_acc": float(counts[:, 0].sum() / max(counts[:, 1].sum(), 1)),
               "block_nonzeros": {"max": int(nonzeros.max()), "mean": float(nonzeros.mean()),
                                  "max_over_mean": float(nonzeros.max() / max(nonzeros.mean(), 1e-300))},
               "peak_rss_bytes": peaks.tolist()}
    if comm.rank == 0:
        print(f"grid {shape}: test accuracy {summary['test_acc']:.4f}; nonzeros a rank (3 rotations) max/mean "
              f"{summary['block_nonzeros']['max_over_mean']:.3f}; peak memory a rank "
              f"{peaks.min() / 2**30:.2f}-{peaks.max() / 2**30:.2f} GiB (sum {peaks.sum() / 2**30:.2f} GiB); "
              f"blocks read in {load_seconds:.1f} s", flush=True)
        if args.out:
            path = Path(args.out)
            temporary = path.with_name(path.name + ".tmp")
            temporary.write_text("".join(json.dumps(r) + "\n" for r in [*records, summary]))
            temporary.replace(path)
    grid.free()
    return 0
