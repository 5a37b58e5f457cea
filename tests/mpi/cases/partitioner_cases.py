"""Shards written by the GNN-tailored partitioners train exactly: bytegnn and metis-train shards of Cora (and of a
random directed graph with isolated nodes), GCN and SAGE on p2p, equal the single-process reference (the checks
of train_parity.py, reused), on this launch's P (one part per rank)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_parity import MODES, check, full_graph, reference_run  # noqa: E402

from sparse_dist.comm import run_or_abort, world  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("datasets", nargs="+", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    failures: list[str] = []
    runs = 0
    for index, directory in enumerate(args.datasets):
        data = full_graph(directory)
        for model in ("gcn", "sage"):
            check(comm, directory, reference_run(data, model), model, "p2p", 1,
                  MODES[(index + (model == "sage")) % len(MODES)], failures)
            runs += 1
    for failure in failures:
        sys.stderr.write(f"[rank {comm.rank}] FAIL {failure}\n")
    ok = comm.all_true(not failures)
    if comm.rank == 0:
        print(f"partitioner shards P={comm.size}: {runs} runs, {'all equal the reference' if ok else 'FAILURES'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
