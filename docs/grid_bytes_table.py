"""The byte table of docs/results.md, "Bytes of the process grid against 1D": per prepared graph and P, the bytes
all ranks send in one GCN epoch (forward and backward exchanges, gradients and the loss's collectives) for 1D
p2p and cover on the dataset's own partition (the exact byte model of ``sparse-dist cost bytes``) and for every
X x Y x Z grid of P ranks (the grid's collectives, :func:`runners.perf.grid_model.all_ranks_bytes`, equal to the
counted bytes in tests/mpi/test_grid.py and ``sparse-dist bench grid``), the least grid and the cube-most.
1D's gradient allreduce is left out of its column (a few kB: the weights); the grid's is in. Layer 0's input is
exchanged once a run in both (1D: ``--input-exchange once``, what ``auto`` takes for these graphs; the grid: its
aggregation computed once), so neither column has layer 0's forward exchange.

    .venv/bin/python docs/grid_bytes_table.py --ranks 4,8 --hidden 128 --layers 3 DATA_DIR [DATA_DIR ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runners.perf.cost_model import ModelShape
from runners.perf.grid_model import all_ranks_bytes, busiest_rank_bytes, factorisations
from runners.perf.workload import pair_counts
from runners.perf_model_cmd import cover_layer_bytes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", nargs="+")
    parser.add_argument("--ranks", default="4,8")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    args = parser.parse_args()
    print("| graph (partition) | P | 1D p2p GB | 1D cover GB | least grid | its GB | busiest rank GB | "
          "cube grid | its GB | least grid / p2p |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for data in args.data:
        meta = json.loads((Path(data) / "meta.json").read_text())
        dims = (meta["feature_dim"], *[args.hidden] * (args.layers - 1), meta["num_classes"])
        shape = ModelShape(dims=dims)
        for ranks in (int(p) for p in args.ranks.split(",")):
            layers = cover_layer_bytes(pair_counts(data, ranks), shape)
            p2p = sum(r["p2p_forward"] + r["p2p_backward"] for r in layers) - layers[0]["p2p_forward"]
            cover = sum(r["cover_forward"] + r["cover_backward"] for r in layers) - layers[0]["cover_forward"]
            totals = {grid: sum(all_ranks_bytes(grid, meta["num_nodes"], dims, 4).values())
                      for grid in factorisations(ranks)}
            least = min(totals, key=lambda grid: (totals[grid], str(grid)))
            cube = min(totals, key=lambda grid: (max(grid.x, grid.y, grid.z), totals[grid]))
            busiest = sum(busiest_rank_bytes(least, meta["num_nodes"], dims, 4).values())
            print(f"| {meta['name']} ({meta['partitioner']}) | {ranks} | {p2p / 1e9:.3f} | {cover / 1e9:.3f} | "
                  f"{least} | {totals[least] / 1e9:.3f} | {busiest / 1e9:.3f} | {cube} | {totals[cube] / 1e9:.3f} | "
                  f"{totals[least] / p2p:.2f} |", flush=True)


if __name__ == "__main__":
    main()
