"""Halo rows an exact evaluation forward needs, per layer, summed over ranks: for every owned row (what the
evaluation computes today) against only the evaluated nodes' receptive field (validation and test nodes, or
validation nodes alone), from a prepared dataset's shards (the figures of docs/guide/emulate.md, "Steered
evaluation").

A rank needs a halo row at a layer where some row it must compute at that layer has that column; the layer
below must then compute every such column's row (Â holds self-loops, so a row needs itself).

    .venv/bin/python docs/evaluation_field.py DATA_DIR LAYERS
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp


def needed_halo(matrix: sp.csr_matrix, owner: np.ndarray, rows: np.ndarray) -> tuple[int, np.ndarray]:
    """Halo rows (rank, column) pairs, summed over ranks, that computing ``rows`` (bool over all nodes) takes,
    and the bool mask of every column those rows read."""
    picked = np.flatnonzero(rows)
    block = matrix[picked]
    row_of = np.repeat(picked, np.diff(block.indptr))
    remote = owner[row_of] != owner[block.indices]
    pairs = np.unique(owner[row_of][remote].astype(np.int64) * matrix.shape[1] + block.indices[remote])
    read = np.zeros(matrix.shape[1], dtype=bool)
    read[block.indices] = True
    return int(pairs.size), read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path, help="a directory made by sparse-dist prepare")
    parser.add_argument("layers", type=int, help="the model's layers")
    args = parser.parse_args()
    meta = json.loads((args.data / "meta.json").read_text())
    offsets = meta["row_offsets"]
    parts = [np.load(args.data / f"part-{k:05d}.npz") for k in range(len(offsets) - 1)]
    nodes = offsets[-1]
    matrix = sp.vstack([sp.csr_matrix((p["data"], p["indices"], p["indptr"]), shape=(len(p["indptr"]) - 1, nodes))
                        for p in parts]).tocsr()
    owner = np.repeat(np.arange(len(parts)), np.diff(offsets))
    masks = {split: np.concatenate([p[split] for p in parts]) for split in ("val", "test")}
    for name, evaluated in (("every row", np.ones(nodes, dtype=bool)), ("val + test", masks["val"] | masks["test"]),
                            ("val", masks["val"])):
        needed, per_layer = evaluated, []
        for _ in range(args.layers):  # from the last layer down
            halo, read = needed_halo(matrix, owner, needed)
            per_layer.append(halo)
            needed = read | needed
        print(f"{name:10s} halo rows per layer (first .. last): {per_layer[::-1]}, total {sum(per_layer):,}")


if __name__ == "__main__":
    main()
