"""Multi-rank check of the distributed SpMM against a single-process scipy reference.

Run under mpiexec (tests/mpi/test_spmm.py does): every rank builds the same
small global matrices from fixed seeds, keeps its own rows, and compares
forward, transpose, autograd and counted-vs-predicted bytes for each plan.
All ranks agree on pass/fail (collective) and the job exits 1 on any failure.
"""

from __future__ import annotations

import argparse
import sys
import weakref

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.comm import run_or_abort, world
from sparse_dist.dcsr import DistCSR
from sparse_dist.exchange import ExchangeContext
from sparse_dist.layout import RowLayout
from sparse_dist.csr import is_symmetric
from sparse_dist.plans import PLAN_NAMES, plan_class
from sparse_dist.predict import predict_spmm_bytes
from sparse_dist.spmm import DistSpMM

TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-12}


def random_directed(n: int, density: float, seed: int, empty_rows: int = 0) -> sp.csr_matrix:
    """A non-symmetric random matrix; the first ``empty_rows`` rows of a random subset get no nonzeros."""
    rng = np.random.default_rng(seed)
    matrix = sp.random(n, n, density=density, format="csr", random_state=rng, dtype=np.float64)
    matrix.data = rng.uniform(-1.0, 1.0, matrix.nnz)
    if empty_rows:
        keep = np.ones(n)
        keep[rng.choice(n, size=min(empty_rows, n), replace=False)] = 0.0
        matrix = sp.csr_matrix(sp.diags(keep) @ matrix)
    return matrix


def block_local(layout: RowLayout, seed: int) -> sp.csr_matrix:
    """Nonzeros only inside each group's own block and in column block 0: most blocks are empty."""
    rng = np.random.default_rng(seed)
    n = layout.n_rows
    rows, cols = [], []
    for g in range(layout.parts):
        lo, hi = layout.row_range(g)
        if hi == lo:
            continue
        for row in range(lo, hi):
            rows += [row, row]
            cols += [int(rng.integers(lo, hi)), int(rng.integers(0, max(layout.offsets[1], 1)))]
    data = rng.uniform(0.5, 1.5, len(rows))
    return sp.csr_matrix((data, (rows, cols)), shape=(n, n))


def layouts_and_matrices(groups: int) -> list[tuple[str, RowLayout, sp.csr_matrix]]:
    cases = []
    layout = RowLayout.balanced(37, groups)
    cases.append(("random-37", layout, random_directed(37, 0.15, seed=1, empty_rows=5)))
    counts = layout.counts().copy()
    if groups > 1:
        counts[0] += counts[1]
        counts[1] = 0  # group 1 owns zero rows
    cases.append(("zero-row-group", RowLayout.from_counts(counts), random_directed(37, 0.2, seed=2)))
    blocky = RowLayout.balanced(41, groups)
    cases.append(("empty-blocks", blocky, block_local(blocky, seed=3)))
    cases.append(("fewer-rows-than-groups", RowLayout.balanced(3, groups), random_directed(3, 0.6, seed=4)))
    cases.append(("no-nonzeros", RowLayout.balanced(10, groups), sp.csr_matrix((10, 10))))
    directed = random_directed(40, 0.1, seed=5, empty_rows=4)
    cases.append(("symmetric-40", RowLayout.balanced(40, groups), sp.csr_matrix(directed + directed.T)))
    return cases


def check_case(comm, replication: int, label: str, layout: RowLayout, a: sp.csr_matrix,
               width: int, dtype: torch.dtype, device: str, failures: list[str]) -> int:
    group = comm.rank // replication
    lo, hi = layout.row_range(group)
    matrix = DistCSR(comm, layout, a[lo:hi], replication=replication, name=label)
    rng = np.random.default_rng(100 + width)
    h_global = rng.standard_normal((a.shape[0], width))
    dt_global = rng.standard_normal((a.shape[0], width))
    expect_t = (a @ h_global)[lo:hi]
    expect_dh = (a.T @ dt_global)[lo:hi]
    tol = TOLERANCE[dtype]
    checked = 0
    for plan in PLAN_NAMES:
        name = f"{label} plan={plan} F={width} {str(dtype).removeprefix('torch.')} c={replication}"
        op = DistSpMM(matrix, plan, dtype=dtype, device=device)
        h = torch.tensor(h_global[lo:hi], dtype=dtype, device=device)
        dt = torch.tensor(dt_global[lo:hi], dtype=dtype, device=device)
        comm.stats.reset()
        got_t = op.forward(h).cpu()
        got_dh = op.transpose(dt).cpu()
        counted = comm.stats.snapshot()
        local = matrix.blocks.get(matrix.group)
        if label.startswith("symmetric") and local is not None and local.nnz and is_symmetric(local):
            stored = op.plan.transpose_bytes()  # the remote parts only: at most their nnz and row pointers
            remote_nnz = sum(b.nnz for j, b in matrix.blocks.items() if j != matrix.group)
            itemsize = torch.empty(0, dtype=dtype).element_size()
            if stored > remote_nnz * (8 + itemsize) + 8 * (a.shape[0] + 1) * len(matrix.blocks):
                failures.append(f"{name}: a symmetric local block stored a transposed copy ({stored} bytes)")
        scale = 1.0 + float(np.abs(expect_t).max(initial=0.0)) + float(np.abs(expect_dh).max(initial=0.0))
        if not np.allclose(got_t.numpy(), expect_t, rtol=tol, atol=tol * scale):
            failures.append(f"{name}: forward differs by {np.abs(got_t.numpy() - expect_t).max():.3e}")
        if not np.allclose(got_dh.numpy(), expect_dh, rtol=tol, atol=tol * scale):
            failures.append(f"{name}: transpose differs by {np.abs(got_dh.numpy() - expect_dh).max():.3e}")
        predicted = predict_spmm_bytes(matrix.grid, matrix.layout, matrix.boundary_counts, matrix.union_sizes,
                                       plan, width, torch.empty(0, dtype=dtype).element_size(),
                                       pair_counts=op.plan.pair_counts)
        for phase in ("forward", "backward"):
            want = tuple(int(x) for x in predicted[phase][comm.rank])
            got = (counted[phase]["bytes_sent"], counted[phase]["bytes_recv"])
            if want != got:
                failures.append(f"{name}: {phase} bytes (sent, recv) counted {got} != predicted {want}")
        if op.plan.pair_counts is not None and np.any(op.plan.pair_counts > matrix.boundary_counts):
            failures.append(f"{name}: the plan moves more rows than p2p on some pair: {op.plan.pair_counts.tolist()} "
                            f"against {matrix.boundary_counts.tolist()}")
        # Autograd: d(sum(T * G))/dH must be A^T G.
        h_leaf = h.clone().requires_grad_(True)
        (op(h_leaf) * dt).sum().backward()
        if not np.allclose(h_leaf.grad.cpu().numpy(), expect_dh, rtol=tol, atol=tol * scale):
            failures.append(f"{name}: autograd gradient differs from A^T dT")
        failures += kept_after_forward(op, h, dt, expect_dh, tol * scale, name)
        checked += 1
        # gather/scatter (attention layers' form of the same exchange): blocks times gathered rows, and the
        # gradients sent back, give this rank's partial products of the plan's own forward and transpose.
        if plan_class(plan).run_refusal(attention=True):  # a plan that sends no rows to gather (cover)
            continue
        partial_t, partial_dh = op.partial.forward(h, "other"), op.partial.transpose(dt, "other")
        gathered = op.partial.gather(h, "other")
        own = matrix.blocks.get(matrix.group) if matrix.group in matrix.column_share else None
        via_t = torch.tensor(own @ h.cpu().numpy() if own is not None else np.zeros(tuple(h.shape)), dtype=dtype)
        for item in gathered:
            via_t += torch.tensor(item.block @ item.rows.cpu().numpy(), dtype=dtype)
        pieces = [torch.tensor(item.block.T @ dt.cpu().numpy(), dtype=dtype, device=device) for item in gathered]
        via_dh = op.partial.scatter(gathered, pieces, width, "other").cpu()
        if own is not None:
            via_dh += torch.tensor(own.T @ dt.cpu().numpy(), dtype=dtype)
        if not torch.allclose(via_t, partial_t.cpu(), rtol=tol, atol=tol * scale):
            failures.append(f"{name}: blocks times gathered rows differ from the plan's forward")
        if not torch.allclose(via_dh, partial_dh.cpu(), rtol=tol, atol=tol * scale):
            failures.append(f"{name}: scattered gradients differ from the plan's transpose")
    return checked


def _returning(value: torch.Tensor):
    return lambda: value


def kept_after_forward(op: DistSpMM, h: torch.Tensor, dt: torch.Tensor, expect_dh: np.ndarray, atol: float,
                       name: str) -> list[str]:
    """A training call keeps nothing its transpose does not need: the forward flight's receive buffers and the
    context's way to unmask the input (``unmasked``, which holds the layer below's output) are gone once the
    forward returns, and the gradient is still ``A^T dT``. Collective."""
    problems = []
    below = torch.ones(3, 3)  # stands for the layer below's output, which only the closure refers to
    alive = weakref.ref(below)
    context = ExchangeContext(epoch=0, layer=0, training=True, unmasked=_returning(below))
    below = None
    h_leaf = h.clone().requires_grad_(True)
    out = op(h_leaf, context)
    context = None  # the caller's own reference; the autograd graph must not keep another
    held = [part for part in op.plan.strategy.used(ExchangeContext(epoch=0, layer=0, training=True)).parts
            if part.rows is not None]
    if held:
        problems.append(f"{name}: {len(held)} forward part(s) still hold their rows after the forward")
    if alive() is not None:
        problems.append(f"{name}: the autograd graph keeps the context's unmasked input until the backward")
    (out * dt).sum().backward()
    if not np.allclose(h_leaf.grad.cpu().numpy(), expect_dh, rtol=atol, atol=atol):
        problems.append(f"{name}: a training call's gradient differs from A^T dT")
    return problems


def run(comm, replication: int, device: str = "cpu") -> tuple[list[str], int]:
    """Every matrix x width x dtype x plan of this launch (collective); the failures and the cases checked."""
    failures: list[str] = []
    checked = 0
    for label, layout, a in layouts_and_matrices(comm.size // replication):
        for width in (1, 64):
            for dtype in (torch.float32, torch.float64):
                checked += check_case(comm, replication, label, layout, a, width, dtype, device, failures)
    return failures, checked


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replication", type=int, default=1)
    parser.add_argument("--force-staging", action="store_true",
                        help="send CPU tensors through the host-staging path used for non-CUDA-aware MPI")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (one GPU per rank: cuda:<local rank>)")
    parser.add_argument("--gpu-aware", choices=("on", "off", "auto"), default="off")
    args = parser.parse_args()
    comm = world(gpu_aware=args.gpu_aware, force_host_staging=args.force_staging)
    device = args.device
    if device == "cuda":
        device = f"cuda:{comm.rank % torch.cuda.device_count()}"
    failures, checked = run(comm, args.replication, device)
    for failure in failures:
        sys.stderr.write(f"[rank {comm.rank}] FAIL {failure}\n")
    all_passed = comm.all_true(not failures)
    if comm.rank == 0:
        status = "all passed" if all_passed else "FAILURES"
        print(f"spmm cases P={comm.size} c={args.replication} device={args.device} "
              f"staging={args.force_staging}: {checked} checked per rank, {status}")
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
