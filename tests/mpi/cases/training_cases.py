"""Every in-memory training check of one launch, so each rank count pays the interpreter start-up once:
spmm_cases.py (distributed SpMM against scipy, every plan, forward, transpose, autograd, bytes),
train_parity.py (with ``--parity DIR...``: every plan x GCN/SAGE against the plain-torch reference),
static_input_cases.py (halo, receiver-side dropout, compression, SANCUS under dropout), pipe_cases.py
(pipelined exchange, psc's feature cache, dgs), gat_cases.py (GAT; ``--gat-policies`` adds its sampling
and staleness checks) policy_cases.py (sampling statistics, staleness agreement, psc, dgs; c = 1) and minibatch_cases.py
(mini-batch exactness, bytes, P-invariance, bulk sampling, prefetch; c = 1);
``--sections`` picks some of them. Each check compares against an independent single-process reference or the byte
model; see those files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from case_report import finish  # noqa: E402
import gat_cases  # noqa: E402
import minibatch_cases  # noqa: E402
import pipe_cases  # noqa: E402
import policy_cases  # noqa: E402
import spmm_cases  # noqa: E402
import static_input_cases  # noqa: E402
import train_parity  # noqa: E402

from sparse_dist.comm import run_or_abort, world  # noqa: E402


SECTIONS = ("spmm", "parity", "static", "pipe", "gat", "policy", "minibatch")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replication", type=int, default=1)
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"which checks, comma-separated from {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--gat-policies", action="store_true", help="also GAT's sampling and staleness checks")
    parser.add_argument("--parity", nargs="*", type=Path, default=[], help="train_parity.py's datasets")
    args = parser.parse_args()
    sections = args.sections.split(",")
    assert set(sections) <= set(SECTIONS), sections
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    failures: list[str] = []
    parity_runs = gat_runs = spmm_checked = 0
    if "spmm" in sections:
        failures, spmm_checked = spmm_cases.run(comm, args.replication)
    if "parity" in sections:
        parity_failures, parity_runs = train_parity.run(comm, args.parity, args.replication)
        failures += parity_failures
    if "static" in sections:
        failures += static_input_cases.run(comm, args.replication)
    if "pipe" in sections:
        failures += pipe_cases.run(comm, args.replication)
    if "gat" in sections:
        gat_failures, gat_runs = gat_cases.run(comm, args.replication, args.gat_policies)
        failures += gat_failures
    if "policy" in sections:  # policy_cases.py's checks are written for c = 1
        assert args.replication == 1
        failures += policy_cases.run(comm)
    if "minibatch" in sections:  # mini-batch training is 1D
        assert args.replication == 1
        failures += minibatch_cases.run(comm)
    return finish(comm, failures, f"training cases P={comm.size} c={args.replication} [{','.join(sections)}] "
                  f"({spmm_checked} SpMM cases per rank, {parity_runs} parity runs, {gat_runs} exact GAT runs)")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
