"""The plot of docs/results.md, "The process grid against 1D: bytes per rank against P": the busiest rank's bytes
in one GCN epoch (forward and backward exchanges; for the grid also its loss's and gradients' collectives, as in
docs/grid_bytes_table.py) against P on log-log axes, for 1D p2p on a random partition and for the grid, on the
200k synthetic of that section (GCN 3 x 128, the last layer as wide as the 47 classes, float32). Layer 0's input
is exchanged once a run on both sides (1D: ``--input-exchange once``; the grid: its aggregation computed before
the first step), so neither has layer 0's forward exchange; 1D's gradient allreduce (the weights, a few hundred kB)
is left out of its line as in the table.

Model lines, P = 2, 4, ..., 1024 (``--ranks``):

* 1D p2p: the exact byte model (:func:`sparse_dist.predict.predict_spmm_bytes`, as ``cost bytes`` and the table)
  on the partition ``prepare synthetic --partitioner random --parts P`` writes: the graph from the project's own
  generator (:func:`runners.data.datasets.planted_classes`, what ``prepare synthetic`` calls) and ``part_of`` from
  :func:`runners.data.partition.partition` ``("random", ..., seed)``, in memory; the boundary ``|B_ij|`` (rows of
  part ``j`` that rows of part ``i`` have as columns) from one ``np.unique`` over the entries. The busiest rank is
  the one whose forward plus backward bytes sent are the most (over both a rank receives what it sends).
* grid: for each P, the factorisation ``X x Y x Z = P`` whose busiest rank has the fewest bytes
  (:func:`runners.perf.grid_model.busiest_rank_bytes` over :func:`runners.perf.grid_model.factorisations`).
* 1D cover is not drawn: its byte model needs a minimum vertex cover of every one of the ``P (P - 1)`` blocks
  (:func:`runners.perf.workload.pair_counts`, one matching per block, each group's entries scanned once per
  owner), about a million matchings at P = 1024.

Measured points, P = 2, 4 and 8 (``--measured DIR``, also spelt ``--scratch DIR``; ``--run`` makes them there
first, the commands below, skipping any output already present). Both commands report each phase's bytes sent
over the ranks (``bench grid``: the most, ``bytes_busiest_rank`` of its epoch records; ``train``: min, mean and
max, ``bytes.PHASE.sent`` of its epoch records), not one rank's total, so the point drawn is the sum over the
phases of each phase's most, and the model is checked against the same figures (every phase's min, mean and most
for 1D, every phase's most for the grid) to the byte; the script says where that sum is above the model's busiest
rank. The commands, for each P in 2, 4, 8 (``GRID``: the shape the model picks at P, printed by the script)::

    sparse-dist prepare synthetic --nodes 200000 --degree 15 --features 128 --classes 47 --parts P \\
        --partitioner random --out DIR/synthetic-pP
    mpiexec -n P sparse-dist bench grid --data DIR/synthetic-pP --grid GRID --epochs 1 --hidden 128 --layers 3 \\
        --out DIR/grid-pP.jsonl
    mpiexec -n P sparse-dist train --data DIR/synthetic-pP --epochs 2 --layers 3 --hidden 128 --plan p2p \\
        --input-exchange once --dropout 0 --out DIR/p2p-pP.jsonl

(``train``'s defaults are 2 layers of 16, hence ``--layers 3 --hidden 128``; the last epoch's record is taken.)
The plot:

    .venv/bin/python docs/grid_bytes_plot.py --scratch DIR --out docs/figures/grid-bytes-vs-p.png
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from runners.data.datasets import planted_classes
from runners.data.partition import partition
from runners.perf.cost_model import ModelShape
from runners.perf.grid_model import busiest_rank_bytes, factorisations, rank_bytes
from runners.perf.workload import workload_from_shards
from sparse_dist.grid import GridShape
from sparse_dist.layout import Grid, RowLayout
from sparse_dist.predict import SENT, predict_spmm_bytes

MEASURED_RANKS = (2, 4, 8)
ITEMSIZE = 4  # float32


def random_boundary(adjacency, parts: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rows per part, |B_ij|)`` of ``prepare``'s random partition into ``parts`` (``boundary[i, j]``: the rows
    of part ``j`` that part ``i``'s rows have as columns, 0 on the diagonal)."""
    n = adjacency.shape[0]
    part_of = partition("random", adjacency, parts, seed)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(adjacency.indptr))
    needed = np.unique(part_of[rows] * n + adjacency.indices.astype(np.int64))
    asker, owner = needed // n, part_of[needed % n]
    keep = asker != owner
    boundary = np.bincount(asker[keep] * parts + owner[keep], minlength=parts * parts).reshape(parts, parts)
    return np.bincount(part_of, minlength=parts), boundary.astype(np.int64)


def p2p_rank_bytes(sizes: np.ndarray, boundary: np.ndarray, shape: ModelShape) -> dict[str, np.ndarray]:
    """Bytes each rank sends in one epoch of 1D p2p, by phase: the exact byte model per exchanging layer."""
    parts = sizes.size
    grid, layout = Grid(parts, 1), RowLayout.from_counts(sizes)
    union = np.zeros(parts, dtype=np.int64)  # unused by p2p's model
    out = {"forward": np.zeros(parts, dtype=np.int64), "backward": np.zeros(parts, dtype=np.int64)}
    for width, backward in shape.exchanges:
        volume = predict_spmm_bytes(grid, layout, boundary, union, "p2p", width, shape.itemsize)
        out["forward"] += volume["forward"][:, SENT]
        if backward:
            out["backward"] += volume["backward"][:, SENT]
    return out


def best_grid(ranks: int, nodes: int, dims: tuple[int, ...]) -> tuple[GridShape, dict[str, int]]:
    """The factorisation of ``ranks`` whose busiest rank has the fewest bytes, and those bytes by phase."""
    priced = {shape: busiest_rank_bytes(shape, nodes, dims, ITEMSIZE) for shape in factorisations(ranks)}
    shape = min(priced, key=lambda s: (sum(priced[s].values()), (s.x, s.y, s.z)))
    return shape, priced[shape]


def grid_phase_maxima(shape: GridShape, nodes: int, dims: tuple[int, ...]) -> dict[str, int]:
    """Each phase's most over every rank, as ``bench grid`` reports it (the loss's bytes in ``forward``)."""
    out = {"forward": 0, "backward": 0, "grad_allreduce": 0}
    for z in range(shape.z):
        for y in range(shape.y):
            for x in range(shape.x):
                found = rank_bytes(shape, {"x": x, "y": y, "z": z}, nodes, dims, ITEMSIZE)
                found["forward"] += found.pop("loss")
                for phase in out:
                    out[phase] = max(out[phase], found[phase])
    return out


def _run(command: list[str]) -> None:
    print("$ " + " ".join(command), flush=True)
    subprocess.run(command, check=True)


def run_measured(folder: Path, args: argparse.Namespace, grids: dict[int, GridShape]) -> None:
    """Prepare the shards and run ``bench grid`` and ``train`` at P = 2, 4, 8 into ``folder`` (module docstring)."""
    folder.mkdir(parents=True, exist_ok=True)
    program = shutil.which("sparse-dist") or str(Path(sys.executable).parent / "sparse-dist")
    mpiexec = shutil.which("mpiexec") or str(Path(sys.executable).parent / "mpiexec")
    for ranks in MEASURED_RANKS:
        data, grid_out, p2p_out = (folder / f"synthetic-p{ranks}", folder / f"grid-p{ranks}.jsonl",
                                   folder / f"p2p-p{ranks}.jsonl")
        if not (data / "meta.json").exists():
            _run([program, "prepare", "synthetic", "--nodes", str(args.nodes), "--degree", str(args.degree),
                  "--features", str(args.features), "--classes", str(args.classes), "--seed", str(args.seed),
                  "--parts", str(ranks), "--partitioner", "random", "--out", str(data)])
        shape = grids[ranks]
        if not grid_out.exists():
            _run([mpiexec, "-n", str(ranks), program, "bench", "grid", "--data", str(data), "--grid",
                  f"{shape.x},{shape.y},{shape.z}", "--epochs", "1", "--hidden", str(args.hidden), "--layers",
                  str(args.layers), "--out", str(grid_out)])
        if not p2p_out.exists():
            _run([mpiexec, "-n", str(ranks), program, "train", "--data", str(data), "--epochs", "2", "--layers",
                  str(args.layers), "--hidden", str(args.hidden), "--plan", "p2p", "--input-exchange", "once",
                  "--dropout", "0", "--out", str(p2p_out)])


def _last_epoch(path: Path) -> dict:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("type") == "epoch"][-1]


def _spread(values: np.ndarray) -> dict[str, float]:
    array = np.asarray(values, dtype=np.float64)  # as runners.results.spread
    return {"min": float(array.min()), "mean": float(array.mean()), "max": float(array.max())}


def check_measured(folder: Path, ranks: int, sizes: np.ndarray, boundary: np.ndarray, p2p: dict[str, np.ndarray],
                   shape: GridShape, nodes: int, dims: tuple[int, ...]) -> dict[str, float]:
    """The measured points at ``ranks`` (sums of each phase's most) after checking them against the model; prints
    each comparison."""
    data = folder / f"synthetic-p{ranks}"
    workload = workload_from_shards(data, ranks)
    same = bool(np.array_equal(workload.rows, sizes) and np.array_equal(workload.boundary, boundary))
    print(f"P = {ranks}: the shards' partition {'is' if same else 'is NOT'} the one modelled in memory "
          f"(rows per part and |B_ij|)")
    out: dict[str, float] = {}
    epoch = _last_epoch(folder / f"p2p-p{ranks}.jsonl")
    counted = epoch["bytes"]
    for phase in ("forward", "backward"):
        model = _spread(p2p[phase])
        got = counted[phase]["sent"]
        print(f"  1D p2p {phase}: counted min/mean/max {got['min']:,.0f} / {got['mean']:,.1f} / {got['max']:,.0f}, "
              f"model {model['min']:,.0f} / {model['mean']:,.1f} / {model['max']:,.0f}: "
              f"{'equal' if got == model else 'DIFFERENT'}")
    others = {phase: counted[phase]["sent"]["max"] for phase in counted if phase not in ("forward", "backward")}
    print("  1D p2p other phases (most over ranks, not in the line): "
          + ", ".join(f"{phase} {value:,.0f}" for phase, value in others.items()))
    out["p2p"] = counted["forward"]["sent"]["max"] + counted["backward"]["sent"]["max"]
    busiest = int((p2p["forward"] + p2p["backward"]).max())
    maxima = int(p2p["forward"].max() + p2p["backward"].max())
    print(f"  1D p2p: sum of the phases' most {out['p2p']:,.0f} (model {maxima:,}), the model's busiest rank "
          f"{busiest:,}")
    record = _last_epoch(folder / f"grid-p{ranks}.jsonl")
    model = grid_phase_maxima(shape, nodes, dims)
    got = record["bytes_busiest_rank"]
    print(f"  grid {shape}: counted " + ", ".join(f"{p} {v:,}" for p, v in got.items())
          + "; model " + ", ".join(f"{p} {v:,}" for p, v in model.items())
          + f" ({'equal' if got == model else 'DIFFERENT'}; bench grid's own model: "
          + f"{'equal' if record['bytes_predicted'] == got else 'DIFFERENT'})")
    out["grid"] = float(sum(got.values()))
    print(f"  grid: sum of the phases' most {out['grid']:,.0f}, the model's busiest rank "
          f"{sum(busiest_rank_bytes(shape, nodes, dims, ITEMSIZE).values()):,}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=200_000)
    parser.add_argument("--degree", type=int, default=15)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--classes", type=int, default=47)
    parser.add_argument("--seed", type=int, default=0, help="prepare's seed: the graph's and the partition's")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--ranks", default=",".join(str(2 ** k) for k in range(1, 11)))
    parser.add_argument("--measured", "--scratch", dest="measured", default=None,
                        help="the folder of the measured runs at P = 2, 4, 8 (module docstring)")
    parser.add_argument("--run", action="store_true", help="prepare and run the measured runs into --measured first")
    parser.add_argument("--out", default="docs/figures/grid-bytes-vs-p.png")
    args = parser.parse_args()
    if args.run and not args.measured:
        parser.error("--run needs --measured DIR")
    ranks_list = [int(p) for p in args.ranks.split(",")]
    dims = (args.features, *[args.hidden] * (args.layers - 1), args.classes)
    shape = ModelShape(dims=dims, itemsize=ITEMSIZE, input_once=True)
    data = planted_classes(nodes=args.nodes, classes=args.classes, degree=args.degree, features=args.features,
                           seed=args.seed)
    adjacency, nodes = data.adjacency.tocsr(), args.nodes
    del data
    print(f"graph: {nodes} nodes, {adjacency.nnz} entries; GCN widths {'-'.join(map(str, dims))}, float32")
    grids = {ranks: best_grid(ranks, nodes, dims) for ranks in sorted(set(ranks_list) | set(MEASURED_RANKS))}
    if args.run:
        run_measured(Path(args.measured), args, {p: grids[p][0] for p in MEASURED_RANKS})
    rows = []
    measured: dict[int, dict[str, float]] = {}
    print("| P | 1D p2p, busiest rank MB | grid | grid, busiest rank MB | grid / p2p |")
    print("|---|---|---|---|---|")
    for ranks in sorted(set(ranks_list) | (set(MEASURED_RANKS) if args.measured else set())):
        sizes, boundary = random_boundary(adjacency, ranks, args.seed)
        p2p = p2p_rank_bytes(sizes, boundary, shape)
        p2p_busiest = int((p2p["forward"] + p2p["backward"]).max())
        grid_shape, grid_bytes = grids[ranks]
        grid_busiest = sum(grid_bytes.values())
        if ranks in ranks_list:
            rows.append((ranks, p2p_busiest, grid_shape, grid_busiest))
            print(f"| {ranks} | {p2p_busiest / 1e6:,.2f} | {grid_shape} | {grid_busiest / 1e6:,.2f} | "
                  f"{grid_busiest / p2p_busiest:.2f} |", flush=True)
        if args.measured and ranks in MEASURED_RANKS:
            measured[ranks] = check_measured(Path(args.measured), ranks, sizes, boundary, p2p, grid_shape, nodes,
                                             dims)
    below = [r for r, p2p_b, _, grid_b in rows if grid_b < p2p_b]
    print(f"the grid's busiest rank below 1D p2p's at P = {below}")
    plot(rows, measured, Path(args.out), args)


def plot(rows, measured: dict[int, dict[str, float]], out: Path, args: argparse.Namespace) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [r for r, *_ in rows]
    fig, ax = plt.subplots(figsize=(7.0, 4.6))
    ax.plot(ranks, [p / 1e6 for _, p, _, _ in rows], "-", color="tab:blue", marker=".",
            label="1D p2p, random partition (model)")
    ax.plot(ranks, [g / 1e6 for *_, g in rows], "-", color="tab:orange", marker=".",
            label="grid, fewest bytes on the busiest rank (model)")
    for (r, p2p, shape, g) in rows:  # the shape's name on the side away from the 1D line
        ax.annotate(str(shape), (r, g / 1e6), textcoords="offset points", xytext=(0, 6 if g > p2p else -12),
                    ha="center", fontsize=6, color="tab:orange")
    if measured:
        ps = sorted(measured)
        ax.plot(ps, [measured[p]["p2p"] / 1e6 for p in ps], "o", mfc="none", color="tab:blue",
                label="1D p2p, counted (train)")
        ax.plot(ps, [measured[p]["grid"] / 1e6 for p in ps], "s", mfc="none", color="tab:orange",
                label="grid, counted (bench grid)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ranks, [str(r) for r in ranks])
    ax.set_xlabel("P (ranks)")
    ax.set_ylabel("busiest rank's bytes sent per epoch (MB)")
    ax.set_title(f"{args.nodes // 1000}k synthetic, GCN {args.layers} x {args.hidden}, float32, layer 0's input once",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
