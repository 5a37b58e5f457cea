"""Memory and disk ``prepare`` will need, estimated before any work and checked against the machine.

:func:`prepare_memory` (whole-graph sources: the synthetic generator's arrays and the shard writer's copies),
:func:`prepare_rmat_memory` (``prepare rmat``, bounded memory: the largest of its stages, METIS counted as
measured on R-MAT graphs, from :func:`rmat_entries`, the exact expected number of entries) and
:func:`shard_bytes` (the disk the shards take); :func:`check_prepare_resources` prints both and refuses a need
above ``MemAvailable`` (saying what helps) or the free space of the output's file system. ``train``'s
estimates, and what both read of the machine, are in :mod:`runners.resources`.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from runners.resources import Estimate, ResourceError, mem_available, size


def shard_bytes(nodes: int, edges: int, features: int) -> int:
    """Disk the shards of a graph take: CSR (int64 ids, float32 values, int64 row pointers), float32 features,
    int64 labels, three masks and the permutation, plus per-file overhead."""
    return 12 * edges + nodes * (4 * features + 8 + 8 + 3 + 8) + 64 * 1024


def prepare_memory(nodes: int, edges: int, features: int, parts: int, words: int = 0,
                   generator_per_node: int | None = None) -> Estimate:
    """Peak bytes a whole-graph ``prepare`` adds to the process (everything in one process): the adjacency (CSR,
    with the shard writer's int64 copy of one part), the features and the writer's copy of one part of them,
    the synthetic generator's word draws (``words`` per node, four int64/float64 arrays; 0 for other sources)
    and the partition's per-node arrays. Checked against measured peak RSS of ``prepare synthetic`` (200,000 nodes
    of degree 15 and 128 features: 384 MiB estimated, 340 MiB measured; 400,000 of 256: 1015 and 955 MiB).
    ``generator_per_node``: another generator's bytes a node instead of the word draws'."""
    generator = 4 * 8 * words if generator_per_node is None else generator_per_node
    return Estimate({"graph": 16 * edges, "features": int((1 + 1 / max(parts, 1)) * 4 * nodes * features),
                     "generator": generator * nodes, "partition": 6 * 8 * nodes})


def rmat_entries(scale: int, edge_factor: int, abcd: tuple[float, ...] = (0.57, 0.19, 0.19, 0.05)) -> int:
    """The expected number of stored entries of ``prepare rmat``'s graph (both directions, duplicates merged,
    self-loops dropped), exactly: the ordered pair ``(u, v)``, ``u != v``, is stored unless none of the
    ``edge_factor * 2**scale`` draws is ``(u, v)`` or ``(v, u)``, and the chance ``q`` that one draw is depends
    only on how many levels have each of the four bit pairs, so the sum over ``4**scale`` pairs is a sum over
    ``O(scale**3)`` compositions, each weighted by its multinomial count."""
    a, b, c, d = abcd
    draws = edge_factor * (1 << scale)
    total = 0.0
    for k01 in range(scale + 1):
        for k10 in range(scale + 1 - k01):
            if k01 == k10 == 0:
                continue  # u == v: a self-loop, dropped
            for k00 in range(scale + 1 - k01 - k10):
                k11 = scale - k00 - k01 - k10
                pairs = math.exp(math.lgamma(scale + 1) - sum(math.lgamma(k + 1) for k in (k00, k01, k10, k11)))
                q = a ** k00 * d ** k11 * (b ** k01 * c ** k10 + b ** k10 * c ** k01)
                total += pairs * -math.expm1(draws * math.log1p(-min(q, 1.0)))
    return int(round(total))


RMAT_KEY_BYTES = 14
"""``prepare rmat``'s generation, per stored entry at its peak: the merged int64 keys, those pending in the
buckets before they merge and the CSR's column ids filled as the keys go (measured 13.7 at SCALE 22)."""
RMAT_GRAPH_BYTES = 8
"""The R-MAT CSR kept through every later stage, per stored entry: int32 column id and float32 weight."""
LABEL_BLOCK_BYTES = 400 << 20
"""The label propagation's row block (:data:`runners.data.rmat.ENTRY_BLOCK` entries: float64 copies, the
identity added, the scaled operator)."""
METIS_PARTITIONERS = ("metis", "metis-train")


def metis_bytes(entries: int, parts: int) -> float:
    """What METIS adds per stored entry while it partitions an R-MAT graph: the int64 copy of the column ids it
    is given (8) and its own graphs (pymetis's METIS has 64-bit ``idx_t``: the edge weights it allocates and
    the coarsened levels, which shrink slowly on a power-law graph, the more so the larger it is). Measured (the
    partition stage's peak over the RSS at its start, ``prepare rmat``): 116 bytes an entry at SCALE 18 with 4
    parts, 134 with 8; 132 at SCALE 20 with 4; 151 at SCALE 22 with 8 (METIS alone: 108-110 at SCALE 17 and 18,
    4 parts, whatever the objective, the matching or 2-hop matching). Fitted: ``105 + 6 log2(entries / 2^20)``,
    15 more from 8 parts on."""
    return 105 + 6 * math.log2(max(entries, 1 << 20) / (1 << 20)) + (15 if parts >= 8 else 0)


METIS_NODE_BYTES = 150
"""What METIS adds per node (vertex weights, coarsening maps; metis-train's five constraints)."""
WRITE_PART_BYTES = 20
"""The shard writer per stored entry of the largest part: the rows taken out (int32 ids, float32 weights),
their new ids (int64) and the CSR's int32 copy of them (measured 11 at SCALE 22 over 8 random parts, 18 at
SCALE 20 over 4 METIS parts)."""
GENERATION_NODE_BYTES = 40
"""Per-node arrays of the generation: the permutation, its sort keys, the degrees."""
RMAT_NODE_BYTES = 60
"""Per-node arrays kept after the generation: the permutation, labels, masks, the partition, its order and
inverse (plus 16 bytes a class for the label scores while they are propagated)."""


def largest_part_share(partitioner: str, parts: int) -> float:
    """The share of the stored entries the largest part's rows hold: METIS on R-MAT puts the hubs together (the
    largest of 4 parts held 57% of the entries at SCALE 20, of 8 parts 39% at SCALE 18), random and block
    split them evenly."""
    if partitioner.startswith("metis") or partitioner == "bytegnn":
        return min(1.0, 0.25 + 1.3 / max(parts, 1))
    return min(1.0, 1.05 / max(parts, 1))


def prepare_rmat_memory(nodes: int, entries: int, features: int, parts: int, partitioner: str,
                        classes: int = 8) -> Estimate:
    """Peak bytes ``prepare rmat`` adds to the process: the largest of its stages (generation; labels; METIS with
    the CSR; writing the largest part with the CSR), each counted per stored entry and per node. The features are
    never held whole: a block of :data:`runners.data.shards.FEATURE_BLOCK` nodes at a time. Checked against the
    measured stage peaks at SCALE 18-22 (``docs/guide/prepare.md``): within 10% where METIS sets the peak."""
    graph = RMAT_GRAPH_BYTES * entries
    kept = RMAT_NODE_BYTES * nodes
    stages = {
        "generation": {"keys": RMAT_KEY_BYTES * entries, "per-node": GENERATION_NODE_BYTES * nodes},
        "labels": {"graph": graph, "per-node": kept + 16 * classes * nodes, "row block": LABEL_BLOCK_BYTES},
        "partition": {"graph": graph, "METIS": (metis_bytes(entries, parts) * entries + METIS_NODE_BYTES * nodes
                                                if partitioner in METIS_PARTITIONERS else 0), "per-node": kept},
        "write": {"graph": graph, "largest part": WRITE_PART_BYTES * entries * largest_part_share(partitioner, parts),
                  "per-node": kept, "feature block": 12 * (1 << 16) * features},
    }
    stage, peak = max(stages.items(), key=lambda item: sum(item[1].values()))
    return Estimate({f"{stage}: {name}" if index == 0 else name: int(value)
                     for index, (name, value) in enumerate(peak.items())})


def check_prepare_resources(out: str | Path, memory: Estimate | None, disk: int,
                            hint: str = "use prepare synthetic --stream (bounded memory) or fewer --nodes") -> None:
    """Print the estimates (one line) and refuse, in one sentence, a need above ``MemAvailable`` (``hint``
    says what helps) or above the free space where ``out`` will be written."""
    available = mem_available()
    target = Path(out).resolve().parent
    while not target.exists() and target != target.parent:
        target = target.parent
    free = shutil.disk_usage(target).free
    shown = f"memory about {memory.describe()}; " if memory is not None else ""
    print(f"prepare: {shown}disk about {size(disk)} for the shards ({size(free)} free in {target})", flush=True)
    if memory is not None and available is not None and memory.total > available:
        raise ResourceError(f"not enough memory: prepare needs about {size(memory.total)} but "
                            f"{size(available)} is available; {hint}")
    if disk > free:
        raise ResourceError(f"not enough disk: the shards need about {size(disk)} but {target} has "
                            f"{size(free)} free; choose another --out")
