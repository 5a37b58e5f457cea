"""GCN over a process grid (sparse_dist.grid_gcn) against a single-process float64 reference, under mpiexec.

For each grid given (X,Y,Z with X*Y*Z = P) and two graphs (tests/support/datasets_for_tests.py's directed
random graph, with isolated, in-only and out-only nodes and zero feature rows, and Cora), a 3-layer GCN and a
3-layer GraphSAGE-mean of hidden width 10 (so that widths, like the rows, do not divide by most grid axes; 4 or 7 classes, so an axis
of 8 leaves ranks with no class) trains 3 Adam steps in float64 on the grid and in plain dense torch
(written here from the documented conventions, importing nothing of the grid code). Checked on every rank:

* each step's loss equals the reference's (relative 1e-12);
* the first step's gradients of this rank's blocks of W and b equal the reference's slices (absolute 1e-12
  over the gradient's scale);
* after 3 steps, the blocks equal the reference's weights;
* the bytes of every phase this rank counted in each step equal sparse_dist.grid_gcn's prediction;
* layer 0's aggregation both ways: computed once before the steps (its bytes in phase ``halo``, predicted too)
  on the directed graph, and in every step on Cora, so that both paths run on every grid;
* on Cora every layer's input is dropped (p = 0.5, algorithms.grid_dropout) and the reference draws its masks
  from the written rule (tests/support/reference_gcn.py's ``dropout_keep``), so a grid masks as one process;
* on the directed graph the allreduces run in pieces of 101 float64 values (``ALLREDUCE_PIECE_BYTES`` lowered
  from 16 MiB, which these graphs never reach), so that the pieces and their bytes are checked too;
* the blocks read from shards (runners/data/grid_reader.py: the directed graph in 5 random parts, so blocks
  straddle parts) equal the blocks cut from the whole matrix normalised here, and so do the features, labels and
  masks.

Run: ``mpiexec -n P python tests/mpi/cases/grid_cases.py [--gcn-only] X,Y,Z [X,Y,Z ...]``; a grid of fewer than ``P`` ranks
runs on the first ``X*Y*Z`` ranks (a sub-communicator), so one launch checks several rank counts.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from case_report import finish  # noqa: E402
from datasets_for_tests import cora, random_directed  # noqa: E402
from reference_adam import TextbookAdam  # noqa: E402
from reference_gcn import dropout_keep, normalized_adjacency  # noqa: E402

import tempfile  # noqa: E402

from algorithms.grid_dropout import GridDropout  # noqa: E402
from runners.data.grid_reader import load_grid_graph  # noqa: E402
from runners.data.shard_reader import read_meta, read_part  # noqa: E402
from runners.data.shards import write_shards  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402
from sparse_dist import grid_links  # noqa: E402
from sparse_dist.grid import GridShape, ProcessGrid  # noqa: E402
from sparse_dist.grid_gcn import (GridCrossEntropy, adjacency_blocks, aggregate_input, bias_block,  # noqa: E402
                                  gcn_layer, grid_logits, input_block, output_classes, output_rows,
                                  predicted_input_bytes, predicted_layer_bytes, predicted_loss_bytes, weight_block)
from sparse_dist.grid_sage import TERMS, aggregate_sage_input, sage_layers  # noqa: E402

HIDDEN, LAYERS, STEPS, LR = 10, 3, 3, 0.05
DROPOUT, DROPOUT_SEED = 0.5, 7
TOLERANCE = 1e-12


def graphs(kind: str) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]]:
    """``(name, Â dense float64 normalised for ``kind``, row-normalised features, labels, train mask, classes)``."""
    out = []
    for data in (random_directed(), cora()):
        a = normalized_adjacency(data.adjacency.toarray(), kind).numpy()
        features = data.features.astype(np.float64)
        sums = features.sum(axis=1, keepdims=True)
        x = np.divide(features, sums, out=np.zeros_like(features), where=sums != 0)
        out.append((data.name, a, x, np.asarray(data.labels), np.asarray(data.masks["train"]), int(data.num_classes)))
    return out


def initial_weights(dims: list[int], kind: str, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    """Glorot-uniform weights layer by layer from one generator (GCN: ``(W, b)``; SAGE: ``(W_neigh, W_self,
    b)``), a small non-zero bias (so its gradient path is checked against a value that matters)."""
    generator = torch.Generator().manual_seed(seed)
    weights = []
    for fan_in, fan_out in zip(dims[:-1], dims[1:]):
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        matrices = tuple((torch.rand(fan_in, fan_out, generator=generator, dtype=torch.float64) * 2 - 1) * bound
                         for _ in range(2 if kind == "sage" else 1))
        bias = (torch.rand(fan_out, generator=generator, dtype=torch.float64) - 0.5) * 0.1
        weights.append((*matrices, bias))
    return weights


def reference(a: np.ndarray, x: np.ndarray, labels: np.ndarray, train: np.ndarray, dims: list[int], kind: str,
              dropout: float):
    """Losses per step, the first step's gradients and the final weights, dense float64 (GCN: ``Â H W + b``;
    SAGE: ``(Ā H) W_neigh + H W_self + b``), every layer's input dropped by the written rule (step ``s``: epoch
    ``s``) and its kept entries scaled."""
    params = [tuple(t.clone().requires_grad_() for t in layer) for layer in initial_weights(dims, kind)]
    optimizer = TextbookAdam([{"params": [p for layer in params for p in layer]}], lr=LR)
    at, xt, yt, mask = torch.from_numpy(a), torch.from_numpy(x), torch.from_numpy(labels), torch.from_numpy(train)
    losses, first_grads = [], None
    for step in range(STEPS):
        optimizer.zero_grad()
        h = xt
        for index, layer in enumerate(params):
            if dropout:
                keep, scale = dropout_keep(DROPOUT_SEED, step, index, h.shape[0], h.shape[1], dropout)
                h = h * keep * scale
            if kind == "sage":
                neighbour, own, b = layer
                h = at @ h @ neighbour + h @ own + b
            else:
                w, b = layer
                h = at @ h @ w + b
            if index < len(params) - 1:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h[mask], yt[mask])
        loss.backward()
        if step == 0:
            first_grads = [tuple(t.grad.clone() for t in layer) for layer in params]
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, first_grads, [tuple(t.detach() for t in layer) for layer in params]


def block_of(grid: ProcessGrid, layer: int, full: torch.Tensor) -> torch.Tensor:
    """This rank's block of a layer's weight matrix or bias."""
    return weight_block(grid, layer, full) if full.dim() == 2 else bias_block(grid, layer, full)


def check_grid(comm, shape: GridShape, graph, want, failures: list[str], once: bool, kind: str,
               dropout: float, dtype: torch.dtype = torch.float64) -> list[float]:
    """One grid against the reference; ``once``: layer 0's aggregation computed before the steps (no dropout);
    ``dropout``: every layer's input dropped (:class:`GridDropout`). ``dtype``: the grid's (the reference is
    float64; only float64 is held to the tolerances). Returns this rank's largest differences: a step's loss
    (relative), a first-step gradient and a final weight (over the reference parameter's largest magnitude)."""
    worst = [0.0, 0.0, 0.0]
    strict = dtype == torch.float64
    itemsize = torch.tensor([], dtype=dtype).element_size()
    name, a, x, labels, train, classes = graph
    n = a.shape[0]
    dims = [x.shape[1]] + [HIDDEN] * (LAYERS - 1) + [classes]
    want_losses, want_grads, want_final = want
    grid = ProcessGrid(comm, shape)
    where = f"{kind} on {name} grid {shape} rank {comm.rank} {grid.coords}"
    terms = TERMS if kind == "sage" else 1
    layer_fn = sage_layers(grid, n) if kind == "sage" else gcn_layer
    comm.stats.reset()
    blocks = adjacency_blocks(grid, sp.csr_matrix(a), LAYERS, dtype)
    params = [tuple(block_of(grid, layer, t).to(dtype).requires_grad_() for t in full)
              for layer, full in enumerate(initial_weights(dims, kind))]
    optimizer = TextbookAdam([{"params": [p for layer in params for p in layer]}], lr=LR)
    x_block = torch.from_numpy(np.ascontiguousarray(input_block(grid, x))).to(dtype)
    r0, r1 = output_rows(grid, LAYERS, n)
    c0, _ = output_classes(grid, LAYERS, classes)
    rows_labels, rows_train = torch.from_numpy(labels[r0:r1]), torch.from_numpy(train[r0:r1])
    predicted: dict[str, int] = {"forward": predicted_loss_bytes(grid, LAYERS - 1, n, itemsize), "backward": 0,
                                 "grad_allreduce": 0, "halo": 0}
    for layer in range(LAYERS):
        for phase, value in predicted_layer_bytes(grid, layer, n, dims[layer], dims[layer + 1], itemsize,
                                                  input_grad=layer > 0, aggregated_once=once and layer == 0,
                                                  terms=terms).items():
            predicted[phase] += value
    comm.stats.reset()
    first = None
    if once:
        first = (aggregate_sage_input(x_block, blocks[0], grid, n) if kind == "sage"
                 else aggregate_input(x_block, blocks[0], grid))
    input_bytes = predicted_input_bytes(grid, n, x.shape[1], itemsize, terms)
    if comm.stats.phases["halo"].bytes_sent != (input_bytes if once else 0):
        failures.append(f"{where}: layer 0's aggregation sent {comm.stats.phases['halo'].bytes_sent} bytes, "
                        f"not the predicted {input_bytes}")
    for step in range(STEPS):
        comm.stats.reset()
        optimizer.zero_grad()
        masks = GridDropout(dropout, DROPOUT_SEED, step, grid, n, dims) if dropout else None
        h = grid_logits(None if once else x_block, params, blocks, grid, first_aggregation=first, layer_fn=layer_fn,
                        dropout=masks)
        loss = GridCrossEntropy.apply(h, rows_labels, rows_train, c0, int(train.sum()), grid, LAYERS - 1)
        loss.backward()
        worst[0] = max(worst[0], abs(float(loss.detach()) - want_losses[step]) / abs(want_losses[step]))
        if strict and not math.isclose(float(loss.detach()), want_losses[step], rel_tol=TOLERANCE):
            failures.append(f"{where}: step {step} loss {float(loss.detach())!r} != {want_losses[step]!r}")
        if step == 0:
            for layer, (mine, theirs) in enumerate(zip(params, want_grads)):
                scale = max(float(theirs[0].abs().max()), 1e-300)
                for index, (tensor, full) in enumerate(zip(mine, theirs)):
                    got, want = tensor.grad, block_of(grid, layer, full)
                    if got.shape == want.shape and got.numel():
                        worst[1] = max(worst[1], float((got.double() - want).abs().max()) / scale)
                    if got.shape != want.shape or (strict and got.numel()
                                                   and float((got - want).abs().max()) > TOLERANCE * scale):
                        failures.append(f"{where}: layer {layer} gradient of parameter {index} differs from the "
                                        f"reference's block")
        counted = {phase: comm.stats.phases[phase].bytes_sent for phase in predicted}
        if counted != predicted:
            failures.append(f"{where}: step {step} bytes {counted} != predicted {predicted}")
        optimizer.step()
    for layer, (mine, theirs) in enumerate(zip(params, want_final)):
        scale = max(float(theirs[0].abs().max()), 1.0)
        for index, (got, full) in enumerate(zip(mine, theirs)):
            want = block_of(grid, layer, full)
            if got.numel():
                worst[2] = max(worst[2], float((got.detach().double() - want).abs().max()) / scale)
            if strict and got.numel() and float((got.detach() - want).abs().max()) > 1e-10 * scale:
                failures.append(f"{where}: layer {layer} parameter {index} after {STEPS} steps differs from the "
                                f"reference's")
    grid.free()
    return worst


def check_shards(comm, shape: GridShape, directory: str, failures: list[str], kind: str) -> None:
    """The grid reader's blocks against the whole graph read part by part and normalised here for ``kind``."""
    meta = read_meta(directory)
    parts = [read_part(Path(directory), meta, index) for index in range(meta["num_parts"])]
    n = meta["num_nodes"]
    whole = sp.vstack([sp.csr_matrix((p["data"], p["indices"], p["indptr"]), shape=(p["indptr"].size - 1, n))
                       for p in parts]).toarray()
    a = normalized_adjacency(whole, kind).numpy()
    features = np.concatenate([p["features"] for p in parts]).astype(np.float64)
    sums = features.sum(axis=1, keepdims=True)
    x = np.divide(features, sums, out=np.zeros_like(features), where=sums != 0)
    labels = np.concatenate([p["labels"] for p in parts])
    grid = ProcessGrid(comm, shape)
    got = load_grid_graph(comm, grid, directory, LAYERS,
                          normalization="mean" if kind == "sage" else "symmetric")
    want = adjacency_blocks(grid, sp.csr_matrix(a), LAYERS, torch.float64)
    where = f"{kind} shards grid {shape} rank {comm.rank}"
    for layer, (mine, theirs) in enumerate(zip(got.adjacency, want)):
        dense = theirs.forward.to_dense().numpy()
        if mine.shape != dense.shape or not np.allclose(mine.toarray(), dense, rtol=1e-14, atol=0):
            failures.append(f"{where}: rotation {layer}'s block differs from the whole matrix's")
    if not np.allclose(got.features, input_block(grid, x), rtol=1e-14, atol=0):
        failures.append(f"{where}: X block differs")
    r0, r1 = output_rows(grid, LAYERS, n)
    if got.output_rows != (r0, r1) or not np.array_equal(got.labels, labels[r0:r1]):
        failures.append(f"{where}: output rows or labels differ")
    grid.free()


def main() -> int:
    comm = world()
    failures: list[str] = []
    kinds = ("gcn", "sage")
    if sys.argv[1:2] == ["--gcn-only"]:  # the main lane's launch: SAGE runs in the slow lane's
        kinds = ("gcn",)
    texts = [text for text in sys.argv[1:] if text != "--gcn-only"]
    report = os.environ.get("GRID_CASES_REPORT")  # float64 or float32: print the largest differences (rank 0)
    dtype = torch.float32 if report == "float32" else torch.float64
    for kind in kinds:
        for index, graph in enumerate(graphs(kind)):
            _, a, x, labels, train, classes = graph
            grid_links.ALLREDUCE_PIECE_BYTES = 101 * 8 if index == 0 else 16 << 20
            dropout = 0.0 if index == 0 else DROPOUT  # the directed graph aggregates layer 0 once: no dropout
            dims = [x.shape[1]] + [HIDDEN] * (LAYERS - 1) + [classes]
            # one process computes the reference and every rank compares with it (8 copies on 2 cores took 11 s a launch)
            want = comm.allgather_object(reference(a, x, labels, train, dims, kind, dropout) if comm.rank == 0
                                         else None)[0]
            for text in texts:
                ranks = math.prod(int(v) for v in text.split(","))
                sub = comm.split(int(comm.rank < ranks), comm.rank)  # the first X*Y*Z ranks form the grid
                worst = [0.0, 0.0, 0.0]
                if comm.rank < ranks:
                    worst = check_grid(sub, GridShape.parse(text, ranks), graph, want, failures, once=index == 0,
                                       kind=kind, dropout=dropout, dtype=dtype)
                largest = comm.allgather_array(np.array(worst)).max(axis=0)
                if report and comm.rank == 0:
                    print(f"EXACTNESS {kind} {graph[0]} {text} {report} dropout={dropout} loss={largest[0]:.2e} "
                          f"gradient={largest[1]:.2e} weight={largest[2]:.2e}", flush=True)
                sub.free()
    with tempfile.TemporaryDirectory() as scratch:
        directory = comm.allgather_object(str(Path(scratch) / "random") if comm.rank == 0 else None)[0]
        if comm.rank == 0:
            write_shards(random_directed(), directory, 5, "random", seed=1)
        comm.barrier()
        for text in texts:
            ranks = math.prod(int(v) for v in text.split(","))
            sub = comm.split(int(comm.rank < ranks), comm.rank)
            if comm.rank < ranks:
                for kind in kinds:
                    check_shards(sub, GridShape.parse(text, ranks), directory, failures, kind)
            sub.free()
        comm.barrier()  # rank 0 removes the directory once every rank has read it
    models = " and ".join(kind.upper() for kind in kinds)
    return finish(comm, failures, f"grid {models} on {comm.size} ranks, grids {' '.join(texts)}")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
