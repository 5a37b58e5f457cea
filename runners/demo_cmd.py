"""``sparse-dist demo``: the README's main job for now.

A distributed SpMM on a built-in clustered graph (20,000 nodes, directed),
with every exchange plan: forward and transpose are compared with a
single-process scipy result, and the bytes each plan moved are printed next
to the analytic prediction.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from runners.data.synthetic import synthetic_rows
from sparse_dist.comm import Communicator
from sparse_dist.dcsr import DistCSR
from sparse_dist.layout import Grid, RowLayout
from sparse_dist.plans import PLAN_NAMES
from sparse_dist.predict import predict_spmm_bytes
from sparse_dist.spmm import DistSpMM

BUILTIN = {"kind": "clustered", "nodes": 20_000, "degree": 10, "community_size": 500, "mixing": 0.02, "seed": 0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--features", type=int, default=32, help="width F of H (default: 32)")
    parser.add_argument("--replication", type=int, default=1, help="1.5D replication factor c")


def main(comm: Communicator, args: argparse.Namespace) -> int:
    n = BUILTIN["nodes"]
    full = synthetic_rows(BUILTIN["kind"], 0, n, n, BUILTIN["degree"], seed=BUILTIN["seed"],
                          community_size=BUILTIN["community_size"], mixing=BUILTIN["mixing"])
    groups = Grid(comm.size, args.replication).groups  # refuses a c that does not divide P
    layout = RowLayout.balanced(n, groups)
    lo, hi = layout.row_range(comm.rank // args.replication)
    matrix = DistCSR(comm, layout, full[lo:hi], replication=args.replication, name="builtin-clustered")
    rng = np.random.default_rng(1)
    h_full = rng.standard_normal((n, args.features))
    expect_t, expect_dh = (full @ h_full)[lo:hi], (full.T @ h_full)[lo:hi]
    h = torch.from_numpy(h_full[lo:hi].copy())
    rows = []
    for plan in PLAN_NAMES:
        op = DistSpMM(matrix, plan, dtype=torch.float64)
        comm.stats.reset()
        t, dh = op.forward(h), op.transpose(h)
        error = max(float(np.abs(t.numpy() - expect_t).max(initial=0.0)),
                    float(np.abs(dh.numpy() - expect_dh).max(initial=0.0)))
        counted = [comm.stats.counter(p).bytes_recv for p in ("forward", "backward")]
        predicted = predict_spmm_bytes(matrix.grid, matrix.layout, matrix.boundary_counts, matrix.union_sizes,
                                       plan, args.features, 8, pair_counts=op.plan.pair_counts)
        gathered = comm.allgather_object((error, counted))
        max_error = max(e for e, _ in gathered)
        total = [sum(c[k] for _, c in gathered) for k in range(2)]
        expected = [int(predicted[p][:, 1].sum()) for p in ("forward", "backward")]
        rows.append((plan, max_error, total, expected))
    if comm.rank == 0:
        print(f"distributed SpMM on the built-in clustered graph: N={n}, nnz={matrix.gnnz}, F={args.features}, "
              f"float64, P={comm.size}, c={args.replication}")
        print(f"{'plan':<14}{'max |error| vs scipy':>22}{'fwd bytes recv':>16}{'bwd bytes recv':>16}  counted = predicted")
        for plan, max_error, total, expected in rows:
            print(f"{plan:<14}{max_error:>22.2e}{total[0]:>16,}{total[1]:>16,}  {total == expected}")
    exact = all(max_error < 1e-10 and total == expected for _, max_error, total, expected in rows)
    if comm.rank == 0:
        print("match: all plans equal the single-process result" if exact else "MISMATCH")
    return 0 if exact else 1
