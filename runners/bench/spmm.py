"""``sparse-dist bench spmm``: distributed SpMM against a single-process torch SpMM.

Every rank generates only its own rows of a synthetic graph
(:mod:`runners.data.synthetic`), builds the distributed CSR, and times forward
(``A H``) and transpose (``A^T dT``) for each requested plan: local multiply
seconds, exchange seconds (inside MPI: ``exch_s`` the rank's own, ``wait_s`` its wait for partners that had
not posted yet, "Waits" in :mod:`sparse_dist.comm`), wall seconds, and bytes counted next
to the analytic prediction. Then rank 0 alone regenerates the whole matrix
and times ``torch.sparse.mm`` with as many threads as all ranks used together
(the other ranks sleep in a non-spinning barrier so the cores are free).

Reported times are medians over ``--repeats`` after one warm-up; a
distributed repetition's time is its slowest rank's. Effective bandwidth
models the local SpMM's memory traffic as: CSR arrays + one gathered row of
``H`` per nonzero + one written output row per row (cache reuse ignored),
compared with a ``copy_`` bandwidth measured by all ranks at once.

``--device cuda``: every rank runs the distributed op on
``cuda:(rank mod visible GPUs)`` (``H`` is generated on the CPU, then moved),
the clock is read only after ``torch.cuda.synchronize()``, and the
reference is ``torch.sparse.mm`` on a CUDA CSR tensor (cuSPARSE) on rank 0's
GPU; the copy bandwidth is then the GPU's. Every rank checks that CUDA is
visible and all agree before any other collective, so a missing GPU is one
clear error on every rank, never a crash inside an exchange.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from runners.argtypes import at_least, fraction
from runners.argtypes import seed as seed_number
from runners.results import print_report
from runners.data.synthetic import GRAPH_KINDS, synthetic_rows
from sparse_dist.comm import Communicator, default_threads_per_rank, mpi_vendor_details
from sparse_dist.dcsr import DistCSR
from sparse_dist.devices import rank_device, shared_gpu_note, synchronize
from sparse_dist.layout import Grid, RowLayout
from sparse_dist.csr import torch_csr
from sparse_dist.plans import PLAN_NAMES
from sparse_dist.predict import predict_spmm_bytes
from sparse_dist.spmm import DistSpMM

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=at_least(1), default=1_000_000, help="matrix size N, >= 1 (default: 1000000)")
    parser.add_argument("--degree", type=at_least(1), default=20,
                        help="out-edges per row before merging duplicates, >= 1 (default: %(default)s)")
    parser.add_argument("--features", type=at_least(1), default=128, help="width F of H, >= 1 (default: %(default)s)")
    parser.add_argument("--graph", choices=GRAPH_KINDS, default="clustered", help="(default: %(default)s)")
    parser.add_argument("--community-size", type=at_least(1), default=1000,
                        help="clustered graph: nodes per community, >= 1 (default: %(default)s)")
    parser.add_argument("--mixing", type=fraction, default=0.01,
                        help="clustered graph: probability that an edge leaves its community, in [0, 1] "
                             "(default: %(default)s)")
    parser.add_argument("--plan", choices=(*PLAN_NAMES, "all"), default="all")
    parser.add_argument("--replication", type=at_least(1), default=1,
                        help="1.5D replication factor c; must divide the number of ranks P (default: %(default)s)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one GPU per rank, cuda:(rank mod visible GPUs); reference on cuSPARSE")
    parser.add_argument("--repeats", type=at_least(1), default=5,
                        help="timed repetitions after one warm-up, >= 1 (default: %(default)s)")
    parser.add_argument("--threads", type=at_least(0), default=0,
                        help="torch threads per rank (default: cores on the node / ranks on the node)")
    parser.add_argument("--seed", type=seed_number, default=0, help="seed of the graph and H, >= 0 (default: 0)")
    parser.add_argument("--no-reference", action="store_true", help="skip the single-process reference timing")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def _median_max(per_rank_lists: list[list[float]]) -> float:
    """Median over repetitions of the slowest rank's value."""
    return statistics.median(max(values) for values in zip(*per_rank_lists))


def _local_traffic_bytes(n_rows: int, nnz: int, width: int, itemsize: int, index_bytes: int) -> int:
    return nnz * (itemsize + index_bytes) + (n_rows + 1) * index_bytes + nnz * width * itemsize \
        + n_rows * width * itemsize


def _copy_bandwidth(n_bytes: int, repeats: int, device: torch.device) -> float:
    """Bytes per second of ``dst.copy_(src)`` on ``device`` (read + write counted)."""
    src = torch.ones(n_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        times.append(time.perf_counter() - start)
    return 2 * src.numel() * 4 / statistics.median(times)


def _time_distributed(comm: Communicator, op: DistSpMM, h: torch.Tensor, repeats: int) -> dict[str, Any]:
    """Medians of the slowest rank's local, exchange and wall seconds per phase (collective)."""
    records: dict[str, list[float]] = {key: [] for key in
                                       (f"{phase}_{part}" for phase in ("forward", "backward")
                                        for part in ("wall", "local", "exchange", "exchange_wait"))}
    counted: dict[str, Any] = {}
    op.transpose(op.forward(h))  # warm-up: first touch of buffers, lazy transposes
    for _ in range(repeats):
        for phase, run in (("forward", lambda: op.forward(h)), ("backward", lambda: op.transpose(h))):
            comm.stats.reset()
            op.timer.reset()
            synchronize(op.device)
            comm.barrier()
            start = time.perf_counter()
            run()
            synchronize(op.device)
            records[f"{phase}_wall"].append(time.perf_counter() - start)
            records[f"{phase}_local"].append(op.timer.seconds.get("local_spmm", 0.0))
            counter = comm.stats.counter(phase)
            records[f"{phase}_exchange"].append(counter.seconds - counter.wait_seconds)
            records[f"{phase}_exchange_wait"].append(counter.wait_seconds)
            counted[phase] = (comm.stats.counter(phase).bytes_sent, comm.stats.counter(phase).bytes_recv)
    gathered = comm.allgather_object({"records": records, "counted": counted})
    summary: dict[str, Any] = {}
    for key in records:
        summary[key] = _median_max([g["records"][key] for g in gathered])
    summary["counted_bytes"] = {phase: [list(g["counted"][phase]) for g in gathered] for phase in counted}
    return summary


def _time_reference(args: argparse.Namespace, dtype: torch.dtype, total_threads: int,
                    device: torch.device) -> dict[str, float]:
    """Single-process ``torch.sparse.mm`` on the whole matrix on ``device`` (rank 0 only; cuSPARSE on CUDA)."""
    torch.set_num_threads(total_threads)
    full = synthetic_rows(args.graph, 0, args.nodes, args.nodes, args.degree, seed=args.seed,
                          community_size=args.community_size, mixing=args.mixing)
    a = torch_csr(full, dtype, device)
    a_t = torch_csr(sp.csr_matrix(full.T), dtype, device)
    h = torch.randn(args.nodes, args.features, dtype=dtype).to(device)
    torch.sparse.mm(a, h)
    torch.sparse.mm(a_t, h)
    forward, backward = [], []
    for _ in range(args.repeats):
        for times, matrix in ((forward, a), (backward, a_t)):
            synchronize(device)
            start = time.perf_counter()
            torch.sparse.mm(matrix, h)
            synchronize(device)
            times.append(time.perf_counter() - start)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    index_bytes = a.crow_indices().element_size()
    traffic = _local_traffic_bytes(args.nodes, full.nnz, args.features, itemsize, index_bytes)
    return {"forward": statistics.median(forward), "backward": statistics.median(backward),
            "traffic_bytes": traffic, "nnz": int(full.nnz),
            "copy_bandwidth": _copy_bandwidth(min(1 << 30, max(traffic // 4, 1 << 26)), args.repeats, device),
            "device": str(device)}


def run(comm: Communicator, args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark (collective); returns the result dict on every rank."""
    device = rank_device(comm, args.device)
    threads = args.threads or default_threads_per_rank()
    torch.set_num_threads(threads)
    dtype = DTYPES[args.dtype]
    groups = Grid(comm.size, args.replication).groups  # refuses a c that does not divide P
    layout = RowLayout.balanced(args.nodes, groups)
    group = comm.rank // args.replication
    lo, hi = layout.row_range(group)
    start = time.perf_counter()
    rows = synthetic_rows(args.graph, lo, hi, args.nodes, args.degree, seed=args.seed,
                          community_size=args.community_size, mixing=args.mixing)
    matrix = DistCSR(comm, layout, rows, replication=args.replication, name=f"synthetic-{args.graph}")
    setup_seconds = time.perf_counter() - start
    generator = torch.Generator().manual_seed(args.seed + group)
    h = torch.randn(hi - lo, args.features, dtype=dtype, generator=generator).to(device)
    itemsize = h.element_size()

    plans = PLAN_NAMES if args.plan == "all" else (args.plan,)
    results: dict[str, Any] = {}
    for plan in plans:
        op = DistSpMM(matrix, plan, dtype=dtype, device=device)
        summary = _time_distributed(comm, op, h, args.repeats)
        predicted = predict_spmm_bytes(matrix.grid, matrix.layout, matrix.boundary_counts, matrix.union_sizes,
                                       plan, args.features, itemsize, pair_counts=op.plan.pair_counts)
        summary["predicted_bytes"] = {phase: predicted[phase].tolist() for phase in ("forward", "backward")}
        summary["bytes_match"] = all(summary["counted_bytes"][phase] == summary["predicted_bytes"][phase]
                                     for phase in ("forward", "backward"))
        results[plan] = summary
        del op

    local_nnz = sum(block.nnz for block in matrix.blocks.values())
    traffic = _local_traffic_bytes(hi - lo, local_nnz, args.features, itemsize, 4)
    comm.barrier()
    copy_bw = _copy_bandwidth(min(1 << 30, max(traffic // 4, 1 << 26)), args.repeats, device)
    per_rank = comm.allgather_object({"traffic": traffic, "copy_bw": copy_bw, "threads": threads,
                                      "device": str(device)})
    note = shared_gpu_note(comm, device)
    reference = None
    if not args.no_reference:
        if comm.rank == 0:
            reference = _time_reference(args, dtype, threads * comm.size, device)
            torch.set_num_threads(threads)
        comm.idle_barrier()
        reference = comm.allgather_object(reference)[0]
    return {
        "config": {key: value for key, value in vars(args).items() if key not in ("func", "command")},
        "world_size": comm.size, "threads_per_rank": threads, "gnnz": matrix.gnnz,
        "total_boundary_rows": matrix.total_boundary(), "setup_seconds": setup_seconds,
        "environment": {**mpi_vendor_details(), "torch": torch.__version__},
        "plans": results, "per_rank": per_rank, "reference": reference, "device": args.device,
        "shared_gpu_note": note,
    }


def report(result: dict[str, Any]) -> str:
    """Human-readable table of a :func:`run` result."""
    cfg = result["config"]
    device = result.get("device", "cpu")
    lines = [f"SpMM benchmark on {device}: {cfg['graph']} graph, N={cfg['nodes']}, nnz={result['gnnz']}, "
             f"F={cfg['features']}, {cfg['dtype']}, P={result['world_size']}, c={cfg['replication']}, "
             f"threads/rank={result['threads_per_rank']}, boundary rows (sum |B_j|)={result['total_boundary_rows']}"]
    if result.get("shared_gpu_note"):
        lines.append(result["shared_gpu_note"])
    ref = result["reference"]
    per_rank = result["per_rank"]
    slowest_traffic = max(r["traffic"] for r in per_rank)
    copy_bw = min(r["copy_bw"] for r in per_rank)
    if ref:
        where = (f"{ref['device']}, torch.sparse.mm = cuSPARSE" if device == "cuda"
                 else f"cpu, {result['threads_per_rank'] * result['world_size']} threads")
        lines.append(f"single process ({where}): "
                     f"forward {ref['forward']:.4f} s, transpose {ref['backward']:.4f} s, "
                     f"effective bandwidth {ref['traffic_bytes'] / ref['forward'] / 1e9:.2f} GB/s "
                     f"vs copy {ref['copy_bandwidth'] / 1e9:.2f} GB/s")
    header = (f"{'plan':<13}{'phase':<10}{'local_s':>9}{'exch_s':>9}{'wait_s':>9}{'wall_s':>9}{'ratio':>7}"
              f"{'max_sent_MB':>13}{'max_recv_MB':>13}{'total_MB':>10}  bytes=pred  eff_GB/s copy_GB/s")
    lines.append(header)
    for plan, summary in result["plans"].items():
        for phase in ("forward", "backward"):
            counted = np.asarray(summary["counted_bytes"][phase])
            wall = summary[f"{phase}_wall"]
            ratio = f"{wall / ref[phase]:.2f}" if ref else "-"
            local = summary[f"{phase}_local"]
            bandwidth = slowest_traffic / local / 1e9 if local > 0 else float("nan")
            lines.append(f"{plan:<13}{phase:<10}{local:>9.4f}{summary[f'{phase}_exchange']:>9.4f}"
                         f"{summary[f'{phase}_exchange_wait']:>9.4f}{wall:>9.4f}"
                         f"{ratio:>7}{counted[:, 0].max() / 1e6:>13.2f}{counted[:, 1].max() / 1e6:>13.2f}"
                         f"{counted[:, 1].sum() / 1e6:>10.2f}  {str(summary['bytes_match']):<10} "
                         f"{bandwidth:>8.2f} {copy_bw / 1e9:>9.2f}")
    return "\n".join(lines)


def main(comm: Communicator, args: argparse.Namespace) -> int:
    result = run(comm, args)
    print_report(comm.rank, report(result) if comm.rank == 0 else "", result, args.json)
    ok = all(summary["bytes_match"] for summary in result["plans"].values())
    return 0 if ok else 3
