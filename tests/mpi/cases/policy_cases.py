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
  layer, also with adversarial eps values; eps = 0 (sancus-e) equals exact;
* psc (per-edge importance sampling): unbiased like bns, with the variance of
  each entry's own p; only rows that a kept entry needs travel; budget = 1 is
  bitwise the exact path (also with its probabilities recomputed every epoch);
* dgs (explanation-guided node sampling): unbiased for fixed node probabilities, local
  rows never sampled, feature column factors average to 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from case_report import finish  # noqa: E402

from algorithms.policies import BnsSampler, SancusRule
from algorithms.policies.dgs import DgsSampler
from algorithms.policies.psc import PscSampler
from sparse_dist.comm import run_or_abort, world
from sparse_dist.dcsr import DistCSR
from sparse_dist.layout import RowLayout
from sparse_dist.exchange import ExchangeContext
from sparse_dist.spmm import DistSpMM

N, F, K = 60, 3, 200  # K samples per mean: a 6-sigma test of unbiasedness either way


def setup(comm):
    rng = np.random.default_rng(11)
    a = sp.random(N, N, density=0.15, format="csr", random_state=rng)
    a.data = rng.uniform(0.5, 1.5, a.nnz)
    layout = RowLayout.balanced(N, comm.size)
    lo, hi = layout.row_range(comm.rank)
    h = rng.standard_normal((N, F))
    g = rng.standard_normal((N, F))
    return a, layout, lo, hi, h, g, DistCSR(comm, layout, a[lo:hi])


def check_adjoint(comm, op: DistSpMM, context: ExchangeContext, h_local: torch.Tensor, g_local: torch.Tensor,
                  t: torch.Tensor, label: str, failures: list[str]) -> None:
    """The transpose used the forward's sample: ``<A_s H, G> == <H, A_s^T G>`` (collective)."""
    dh = op.transpose(g_local, context=context)
    sums = torch.tensor([float((t * g_local).sum()), float((h_local * dh).sum())], dtype=torch.float64)
    comm.allreduce_(sums, "other")
    if abs(sums[0] - sums[1]) > 1e-9 * (1 + abs(sums[0])):
        failures.append(f"{label}: <A_s H, G> {sums[0]} != <H, A_s^T G> {sums[1]}")


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
                if epoch < 3:
                    check_adjoint(comm, op, context, h_local, g_local, t, label, failures)
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


def check_psc(comm, failures: list[str]) -> None:
    """psc: with the probabilities agreed from recorded norms (non-uniform), the mean of K sampled SpMMs is
    within 6 sigma of the exact product (sigma from each entry's p: Var = sum_j (1/p_ij - 1) a_ij^2 h_j^2,
    columns independent); forward and transpose use the same sample; only rows some kept entry needs travel;
    budget = 1 is bitwise the exact path."""
    a, layout, lo, hi, h, g, matrix = setup(comm)
    h_local, g_local = torch.tensor(h[lo:hi]), torch.tensor(g[lo:hi])
    local_a = a[lo:hi]
    exact = local_a @ h
    start = 400  # the epoch of the recomputation; its probabilities stay in force for the K epochs after it
    op = DistSpMM(matrix, "p2p", dtype=torch.float64, sampler=PscSampler(0.4, every=start, seed=3))
    strategy = op.strategy
    op.forward(h_local * torch.linspace(0.1, 3.0, hi - lo, dtype=torch.float64)[:, None],
               context=ExchangeContext(0, 0, True))  # records norms: the new probabilities are not uniform
    total = np.zeros_like(exact)
    for epoch in range(start, start + K):
        context = ExchangeContext(epoch, 0, True)
        t = op.forward(h_local, context=context)
        total += t.numpy()
        pairs = op.plan._pairs(context)
        needed = np.unique(pairs.remote_matrix.indices).size
        if needed != pairs.remote_matrix.shape[1]:
            failures.append(f"psc epoch {epoch}: {pairs.remote_matrix.shape[1]} rows travelled, {needed} needed")
        if epoch < start + 3:
            check_adjoint(comm, op, context, h_local, g_local, t, "psc", failures)
    version = strategy._in_force(start)
    if version.start != start or np.allclose(version.remote, version.remote.mean()):
        failures.append(f"psc: no non-uniform probabilities were agreed at epoch {start}")
    # p per entry of local_a, in its CSR order: the own block's entries, then the remote block's
    p_entry = np.ones(local_a.nnz)
    owner = layout.owner_of(local_a.indices)
    rows = np.repeat(np.arange(hi - lo), np.diff(local_a.indptr))
    own = owner == comm.rank
    p_entry[own] = version.local  # A_gg keeps local_a's order of its own columns
    remote_p = {}  # (row, global column) -> p
    remote = op.plan.exact_pairs.remote_matrix
    remote_rows = np.repeat(np.arange(hi - lo), np.diff(remote.indptr))
    for r, c, p in zip(remote_rows, strategy.receive_rows()[0][remote.indices], version.remote):
        remote_p[(int(r), int(c))] = p
    p_entry[~own] = [remote_p[(int(r), int(c))] for r, c in zip(rows[~own], local_a.indices[~own])]
    variance = np.zeros_like(exact)
    np.add.at(variance, rows, (local_a.data[:, None] * h[local_a.indices]) ** 2 * (1 / p_entry[:, None] - 1))
    deviation = np.abs(total / K - exact)
    sigma = np.sqrt(variance / K)
    if np.any(deviation > 6 * sigma + 1e-9):
        failures.append(f"psc: mean of {K} samples is {np.max(deviation / (sigma + 1e-300)):.1f} sigma from exact")
    full = DistSpMM(matrix, "p2p", dtype=torch.float64, sampler=PscSampler(1.0, every=1))
    plain = DistSpMM(matrix, "p2p", dtype=torch.float64)
    for epoch in range(3):
        context = ExchangeContext(epoch, 0, True)
        if not torch.equal(full.forward(h_local, context=context), plain.forward(h_local)) or not torch.equal(
                full.transpose(g_local, context=context), plain.transpose(g_local)):
            failures.append(f"psc budget=1 epoch {epoch}: not bitwise the exact path")


def check_dgs(comm, failures: list[str]) -> None:
    """dgs with fixed (non-uniform) node probabilities: the mean of K sampled SpMMs is within 6 sigma of the exact
    product (Var = sum over remote entries of (1/r_j - 1) a_ij^2 h_j^2), local rows are never sampled, and the
    feature columns' factors average to 1 (unbiased for X)."""
    a, layout, lo, hi, h, g, matrix = setup(comm)
    h_local = torch.tensor(h[lo:hi])
    local_a = a[lo:hi]
    exact = local_a @ h
    sampler = DgsSampler(0.5, features=0.3, every=K + 1, seed=2)
    op = DistSpMM(matrix, "p2p", dtype=torch.float64, sampler=sampler)
    receive = np.concatenate([matrix.recv_ids.get(j, np.empty(0, np.int64)) + layout.offsets[j]
                              for j in range(comm.size)])  # the exact receive buffer's global ids
    # fixed, non-uniform probabilities before the strategy's first use: they are its starting ones, agreed
    # with the owners in the first epoch's alltoallv
    sampler.node_p = np.linspace(1.0, 0.1, receive.size)
    total = np.zeros_like(exact)
    for epoch in range(K):
        total += op.forward(h_local, context=ExchangeContext(epoch, 0, True)).numpy()
    r = np.ones(local_a.nnz)
    remote = layout.owner_of(local_a.indices) != comm.rank
    r[remote] = sampler.node_p[np.searchsorted(receive, local_a.indices[remote])]
    rows = np.repeat(np.arange(hi - lo), np.diff(local_a.indptr))
    variance = np.zeros_like(exact)
    np.add.at(variance, rows, (local_a.data[:, None] * h[local_a.indices]) ** 2 * (1 / r[:, None] - 1))
    deviation, sigma = np.abs(total / K - exact), np.sqrt(variance / K)
    if np.any(deviation > 6 * sigma + 1e-9):
        failures.append(f"dgs: mean of {K} samples is {np.max(deviation / (sigma + 1e-300)):.1f} sigma from exact")
    if op.strategy.local_blocks(ExchangeContext(0, 0, True)) is not None:
        failures.append("dgs: local rows were sampled")
    factors = np.mean([sampler.feature_scale(epoch, 50) for epoch in range(K)], axis=0)
    if np.any(np.abs(factors - 1) > 6 * np.sqrt((1 / 0.3 - 1) / K)):
        failures.append(f"dgs: feature column factors average {factors.min():.3f}..{factors.max():.3f}, not 1")


def run(comm) -> list[str]:
    """Every policy check of this launch (collective); the failures."""
    failures: list[str] = []
    check_sampling(comm, failures)
    check_staleness(comm, failures)
    check_psc(comm, failures)
    check_dgs(comm, failures)
    return failures


def main() -> int:
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    return finish(comm, run(comm), f"policy cases P={comm.size}")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
