"""Communication policies under mpiexec: sampling statistics, agreement, exactness limits.

Checks, on this launch's P:
* unbiased sampling: the mean of K sampled SpMMs (fresh sample per epoch)
  lies within 6 standard deviations of the exact product in every entry,
  where the standard deviation is computed exactly from A, H and p
  (Var = sum over boundary columns of a^2 h^2 (1-p)/p, divided by K);
  6 sigma keeps a false alarm below 1e-5 over all entries;
* the same sample in forward and backward: <A_s H, G> == <H, A_s^T G>;
* p = 1 is bitwise the exact path; p = 0 moves no bytes and leaves the
  local (inner) product untouched;
* staleness: every rank records the same ACTIVE owners for every epoch and
  layer, also with adversarial eps values; eps = 0 (sancus-e) equals exact.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from case_report import finish  # noqa: E402

from algorithms.policies import BnsSampler, SancusRule
from sparse_dist.comm import run_or_abort, world
from sparse_dist.dcsr import DistCSR
from sparse_dist.layout import RowLayout
from sparse_dist.exchange import ExchangeContext
from sparse_dist.spmm import DistSpMM

N, F, K = 60, 3, 400


def setup(comm):
    rng = np.random.default_rng(11)
    a = sp.random(N, N, density=0.15, format="csr", random_state=rng)
    a.data = rng.uniform(0.5, 1.5, a.nnz)
    layout = RowLayout.balanced(N, comm.size)
    lo, hi = layout.row_range(comm.rank)
    h = rng.standard_normal((N, F))
    g = rng.standard_normal((N, F))
    return a, layout, lo, hi, h, g, DistCSR(comm, layout, a[lo:hi])


def check_sampling(comm, failures: list[str]) -> None:
    a, layout, lo, hi, h, g, matrix = setup(comm)
    h_local = torch.tensor(h[lo:hi])
    g_local = torch.tensor(g[lo:hi])
    exact = a[lo:hi] @ h
    owner = layout.owner_of(np.arange(N))
    rows = np.repeat(np.arange(hi - lo), np.diff(a[lo:hi].indptr))
    remote = owner[a[lo:hi].indices] != comm.rank
    for plan, side in (("p2p", "receiver"), ("p2p", "owner"), ("sparse-bcast", "owner")):
        for p in (0.3, 0.7):
            label = f"{plan} side={side} p={p}"
            op = DistSpMM(matrix, plan, dtype=torch.float64, sampler=BnsSampler(p, side, seed=5))
            total = np.zeros_like(exact)
            for epoch in range(K):
                context = ExchangeContext(epoch, 0, True)
                t = op.forward(h_local, context=context)
                total += t.numpy()
                if epoch < 3:  # adjoint identity: the transpose used the same sample
                    dh = op.transpose(g_local, context=context)
                    sums = torch.tensor([float((t * g_local).sum()), float((h_local * dh).sum())], dtype=torch.float64)
                    comm.allreduce_(sums, "other")
                    if abs(sums[0] - sums[1]) > 1e-9 * (1 + abs(sums[0])):
                        failures.append(f"{label}: <A_s H, G> {sums[0]} != <H, A_s^T G> {sums[1]}")
            variance = np.zeros_like(exact)
            np.add.at(variance, rows[remote], (a[lo:hi].data[remote, None] * h[a[lo:hi].indices[remote]]) ** 2
                      * (1 - p) / p)
            sigma = np.sqrt(variance / K)
            deviation = np.abs(total / K - exact)
            if np.any(deviation > 6 * sigma + 1e-9):
                failures.append(f"{label}: mean of {K} samples is {np.max(deviation / (sigma + 1e-300)):.1f} sigma "
                                f"from the exact product")
        one = DistSpMM(matrix, plan, dtype=torch.float64, sampler=BnsSampler(1.0, side))
        plain = DistSpMM(matrix, plan, dtype=torch.float64)
        if not torch.equal(one.forward(h_local, context=ExchangeContext(3, 0, True)), plain.forward(h_local)):
            failures.append(f"{plan} side={side}: p=1 is not bitwise the exact path")
        zero = DistSpMM(matrix, plan, dtype=torch.float64, sampler=BnsSampler(0.0, side))
        comm.stats.reset()
        isolated = zero.forward(h_local, context=ExchangeContext(0, 0, True)).numpy()
        inner = (a[lo:hi][:, layout.offsets[comm.rank]:layout.offsets[comm.rank + 1]] @ h[lo:hi])
        if comm.stats.counter("forward").bytes_recv != 0 or not np.allclose(isolated, inner, atol=1e-12):
            failures.append(f"{plan} side={side}: p=0 is not the isolated local product")
        if not np.allclose(zero.forward(h_local).numpy(), exact, atol=1e-12):
            failures.append(f"{plan} side={side}: evaluation (no training context) is not exact")


def check_staleness(comm, failures: list[str]) -> None:
    a, layout, lo, hi, h, g, matrix = setup(comm)
    rng = np.random.default_rng(comm.rank)
    for plan in ("dense-bcast", "sparse-bcast"):
        for rule in (SancusRule("e", 0), SancusRule("e", 2), SancusRule("a", 1), SancusRule("h", 0.0),
                     SancusRule("h", 1e-12), SancusRule("h", 0.05), SancusRule("h", 1e9),
                     SancusRule("h", 0.05, skip_backward=True)):
            label = f"{plan} {rule.name}:eps={rule.eps} skip_backward={rule.skip_backward}"
            op = DistSpMM(matrix, plan, dtype=torch.float64, staleness=rule)
            exact_op = DistSpMM(matrix, plan, dtype=torch.float64)
            h_local = torch.tensor(h[lo:hi])
            for epoch in range(6):
                # ranks drift at different, random speeds: adversarial for the variation gap
                h_local = h_local + torch.tensor(rng.standard_normal(h_local.shape)) * 10.0 ** rng.integers(-8, 0)
                for layer in range(2):
                    context = ExchangeContext(epoch, layer, True)
                    t = op.forward(h_local, context=context)
                    op.transpose(torch.tensor(g[lo:hi]), context=context)
                    if rule.kind == "e" and rule.eps == 0:
                        if not torch.allclose(t, exact_op.forward(h_local), rtol=1e-12, atol=1e-12):
                            failures.append(f"{label}: eps=0 differs from the exact product")
            mine = [(epoch, d["layer"], tuple(d["active"])) for epoch in range(6) for d in op.strategy.decisions(epoch)]
            everyone = comm.allgather_object(mine)
            if any(other != everyone[0] for other in everyone):
                failures.append(f"{label}: ranks recorded different skip decisions")
            if rule.eps == 1e9 and any(len(active) for e, _, active in mine if e > 0):
                failures.append(f"{label}: a huge eps still broadcast after epoch 0")


def main() -> int:
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    failures: list[str] = []
    check_sampling(comm, failures)
    check_staleness(comm, failures)
    return finish(comm, failures, f"policy cases P={comm.size}")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
