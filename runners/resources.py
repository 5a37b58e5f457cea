"""Memory and disk a command will need, estimated before any work from ``meta.json`` counts and the flags.

``train``: :func:`train_memory` estimates, per rank, the bytes a run adds to what the process holds when it
starts (interpreter, torch, MPI): its rows of the graph (CSR as loaded, normalised, and as the operator's
torch blocks), its features (loaded as float32, normalised in float64, kept as a tensor), layer 0's halo rows
(``--input-exchange once``), per layer the activations autograd keeps and their gradients, the parameters with
their gradients and Adam's two moments, the exchange buffers of the boundary rows and a staleness policy's
caches. :func:`check_train_resources` (collective) prints the estimate (rank 0, one line) and refuses the run in
one sentence, with the flag that would help, when the ranks of a node together need more than its
``MemAvailable`` (``/proc/meminfo``).

``prepare``: :func:`prepare_memory` (whole-graph sources: the synthetic generator's arrays and the shard
writer's copies) and :func:`shard_bytes` (the disk the shards take); :func:`check_prepare_resources` prints
both and refuses a need above ``MemAvailable`` (pointing at ``--stream``) or the free space of the output's
file system.

The multipliers (how many copies of an array live at the peak) were read off the code and checked against
measured peak RSS (``tests/test_resources.py``: within 25% of ``ru_maxrss`` minus the RSS at start).
"""

from __future__ import annotations

import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runners.data.shards import ShardError, read_meta
from sparse_dist.comm import Communicator

GIB = 1 << 30

RUNTIME_BYTES = 90 << 20
"""What a rank's resident set grows by for any graph: library code and kernels paged in at their first use (torch
2.x CPU wheel: 80 MiB after set-up, 90 MiB after an epoch, on a 2,000-node graph)."""
GRAPH_BYTES_PER_EDGE = 80
"""A rank's edges at the peak: the CSR as loaded (int64 ids, float32 values), the normalised rows, the operator's
local and remote blocks and the torch tensors of both directions."""
SETUP_BYTES_PER_FEATURE = 20
"""Bytes per feature value while set-up normalises: float32 as loaded, a float64 copy, float64 row-normalised."""
KEPT_FEATURE_COPIES = 1
"""Feature copies kept while training besides the compute-dtype tensor: the float32 array as loaded."""
INPUT_DROPOUT_COPIES = 2
"""Layer 0's input under dropout: the dropped-out copy and its mask (compute dtype)."""
ACTIVATION_COPIES = 3
"""Arrays of each layer's output width kept or made per epoch (dense product, SpMM result, activation, and
their gradients, not all alive at once)."""
OPTIMIZER_COPIES = 4
"""A parameter, its gradient and Adam's two moments."""


class ResourceError(ValueError):
    """The estimated memory or disk need exceeds what the machine has; the message names the flag that helps."""


@dataclass(frozen=True)
class Estimate:
    """Bytes by what needs them at the peak; :attr:`total` is their sum."""

    parts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        shown = ", ".join(f"{name} {size(value)}" for name, value in self.parts.items() if value)
        return f"{size(self.total)} ({shown})"


def size(count: float) -> str:
    """Bytes as a short human figure: ``512 KiB``, ``3.2 GiB``."""
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"


def group_counts(meta: dict[str, Any], groups: int, group: int) -> dict[str, int] | None:
    """Rows, edges and boundary rows (an upper bound: the sum over its parts) of row group ``group``; None when the
    parts cannot be split over ``groups`` (the shard reader says why)."""
    parts = int(meta["num_parts"])
    if groups < 1 or parts % groups:
        return None
    per_group = parts // groups
    first, last = group * per_group, (group + 1) * per_group
    stats = meta.get("partition_stats", {})
    offsets = meta["row_offsets"]
    edges = stats.get("edges")
    boundary = stats.get("boundary_nodes")
    rows = int(offsets[last] - offsets[first])
    if groups == 1:  # one row group holds every row: no boundary
        return {"rows": rows, "edges": int(meta["num_edges"]), "boundary": 0}
    return {"rows": rows,
            "edges": int(sum(edges[first:last])) if edges else int(meta["num_edges"] * rows / max(meta["num_nodes"], 1)),
            "boundary": int(sum(boundary[first:last])) if boundary else rows}


def layer_widths(model: str, features: int, hidden: int, layers: int, classes: int, heads: int = 1,
                 output_heads: int = 1) -> list[tuple[int, int]]:
    """``(input width, output width)`` of each layer as computed (GAT: all heads side by side)."""
    widths = [features] + [hidden * (heads if model == "gat" else 1)] * (layers - 1)
    outputs = [hidden * (heads if model == "gat" else 1)] * (layers - 1) + [classes * (output_heads if model == "gat" else 1)]
    return list(zip(widths, outputs))


def train_memory(meta: dict[str, Any], *, rank: int, world_size: int, replication: int, model: str, hidden: int,
                 layers: int, dtype: str, heads: int = 1, output_heads: int = 1, input_exchange: str = "auto",
                 stale: str = "none") -> Estimate | None:
    """Peak bytes ``sparse-dist train`` adds on ``rank`` beyond the process at start; None if the dataset's parts
    cannot be split over the run's row groups."""
    if replication < 1 or world_size % replication:
        return None
    counts = group_counts(meta, world_size // replication, rank // replication)
    if counts is None:
        return None
    rows, edges, boundary = counts["rows"], counts["edges"], counts["boundary"]
    itemsize = 8 if dtype == "float64" else 4
    features = int(meta["feature_dim"])
    widths = layer_widths(model, features, hidden, layers, int(meta["num_classes"]), heads, output_heads)
    weight_matrices = 2 if model == "sage" else 1
    parameters = sum(d_in * d_out * weight_matrices + d_out for d_in, d_out in widths)
    widest = max(d_out for _, d_out in widths) if model == "gat" else max(min(pair) for pair in widths)  # exchanged
    stale_layers = layers if stale != "none" else 0
    attention = 6 * edges * heads * itemsize if model == "gat" else 0
    training = {
        "features": rows * features * (4 * KEPT_FEATURE_COPIES + itemsize),
        "halo": boundary * features * itemsize if input_exchange == "once" else 0,
        "activations": (INPUT_DROPOUT_COPIES * rows * features + ACTIVATION_COPIES * rows * sum(d for _, d in widths))
                       * itemsize + attention,
        "parameters": OPTIMIZER_COPIES * parameters * itemsize,
        "buffers": (4 + 2 * stale_layers) * boundary * widest * itemsize,  # send and receive, both directions
    }
    setup = SETUP_BYTES_PER_FEATURE * rows * features
    fixed = {"runtime": RUNTIME_BYTES, "graph": GRAPH_BYTES_PER_EDGE * edges + 3 * 8 * rows}
    if setup > sum(training.values()):  # set-up's float64 copies are the peak: say so
        parts = {**fixed, "features at set-up": setup}
    else:
        parts = {**fixed, **training}
    return Estimate(parts)


def mem_available() -> int | None:
    """What this node can still give: ``MemAvailable`` (``/proc/meminfo``), or less where this process's memory
    cgroup (a Slurm job's, a container's) has less room left under its limit; None where neither says."""
    available = None
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    room = cgroup_memory_room()
    if room is not None:
        available = room if available is None else min(available, room)
    return available


def _read_number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cgroup_memory_room(root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")) -> int | None:
    """Bytes this process's memory cgroup may still use (its limit minus its usage, v2 or v1), or None without a
    limit. The cgroup's own directory is tried first (``/proc/self/cgroup``), then the mount's root (a cgroup
    namespace shows the job's own cgroup there)."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        lines = []
    unified = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
    legacy = [line.split(":", 2)[2] for line in lines if ":memory:" in line]
    candidates = [(root / relative.lstrip("/"), "memory.max", "memory.current") for relative in unified]
    candidates += [(root / "memory" / relative.lstrip("/"), "memory.limit_in_bytes", "memory.usage_in_bytes")
                   for relative in legacy]
    candidates += [(root, "memory.max", "memory.current"), (root / "memory", "memory.limit_in_bytes",
                                                            "memory.usage_in_bytes")]
    for directory, limit_name, usage_name in candidates:
        limit, usage = _read_number(directory / limit_name), _read_number(directory / usage_name)
        if limit is not None and usage is not None and limit < 1 << 60:  # v1 says "no limit" with a huge number
            return max(limit - usage, 0)
    return None


def current_rss() -> int:
    """This process's resident set now, in bytes (0 where ``/proc/self/status`` does not say)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _train_hint(args: Any, estimate: Estimate) -> str:
    """The flag that would shrink the largest part of ``estimate``."""
    largest = max(estimate.parts, key=lambda name: estimate.parts[name])
    if largest in ("activations", "parameters", "buffers") and args.hidden > 16:
        return f"a smaller --hidden (now {args.hidden}) or more ranks (on more nodes)"
    if largest == "halo":
        return "--input-exchange per-epoch (or --halo-budget), or more ranks (on more nodes)"
    return "more ranks (on more nodes; the dataset must have as many parts: prepare --parts)"


def readable_meta(data_dir: str | Path) -> dict[str, Any] | None:
    """``meta.json`` of ``data_dir``, or None if it cannot be read (the shard reader then says why)."""
    try:
        return read_meta(data_dir)
    except ShardError:
        return None


def check_train_resources(comm: Communicator, args: Any, meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """Estimate every rank's memory, print it (rank 0, one line) and refuse a run its nodes cannot hold (collective).

    Every rank gathers every rank's estimate and its node's ``MemAvailable`` and decides the same way, so a refusal is
    one :class:`ResourceError` raised on every rank (said once). Returns the figures the results file keeps
    (``environment`` record, key ``memory``; ``rss_at_start_per_rank`` is what the estimates add to).
    """
    estimate = None
    if meta is not None:
        estimate = train_memory(meta, rank=comm.rank, world_size=comm.size, replication=args.replication,
                                model=args.model, hidden=args.hidden, layers=args.layers, dtype=args.dtype,
                                heads=args.heads, output_heads=args.output_heads,
                                input_exchange=args.input_exchange, stale=str(args.stale))
    mine = {"host": socket.gethostname(), "rss_at_start": current_rss(), "available": mem_available(),
            "estimate": estimate.parts if estimate is not None else None}
    everyone = comm.allgather_object(mine)
    if any(entry["estimate"] is None for entry in everyone):
        return None  # the dataset does not fit the run: the shard reader says why, collectively
    totals = [sum(entry["estimate"].values()) for entry in everyone]
    largest = max(range(len(everyone)), key=lambda r: totals[r])
    record = {"estimate_per_rank": totals, "estimate_parts_per_rank": [entry["estimate"] for entry in everyone],
              "rss_at_start_per_rank": [entry["rss_at_start"] for entry in everyone],
              "available_per_node": {entry["host"]: entry["available"] for entry in everyone}}
    nodes: dict[str, list[int]] = {}
    for r, entry in enumerate(everyone):
        nodes.setdefault(entry["host"], []).append(r)
    worst = None
    for host, ranks in nodes.items():
        available = [everyone[r]["available"] for r in ranks if everyone[r]["available"] is not None]
        need = sum(totals[r] for r in ranks)
        if available and need > min(available) and (worst is None or need - min(available) > worst[0]):
            worst = (need - min(available), host, ranks, need, min(available))
    biggest = Estimate(everyone[largest]["estimate"])
    if comm.rank == 0:
        node_ranks = max(len(ranks) for ranks in nodes.values())
        available = everyone[0]["available"]
        print(f"memory: about {biggest.describe()} on the largest rank, beyond the {size(everyone[largest]['rss_at_start'])} "
              f"it holds at start; {size(available) if available else 'unknown memory'} available on "
              f"{'each node' if len(nodes) > 1 else 'this node'} for {node_ranks} rank(s)", flush=True)
    if worst is not None:
        _, host, ranks, need, available = worst
        shown = ", ".join(f"{name} {size(value)}" for name, value in biggest.parts.items() if value)
        error = ResourceError(
            f"not enough memory: the {len(ranks)} rank(s) on {host} need about {size(need)} but {size(available)} is "
            f"available (largest rank {size(biggest.total)}: {shown}); use {_train_hint(args, biggest)}")
        error.every_rank = True  # type: ignore[attr-defined]  # decided from gathered figures: the same everywhere
        raise error
    return record


def shard_bytes(nodes: int, edges: int, features: int) -> int:
    """Disk the shards of a graph take: CSR (int64 ids, float32 values, int64 row pointers), float32 features,
    int64 labels, three masks and the permutation, plus per-file overhead."""
    return 12 * edges + nodes * (4 * features + 8 + 8 + 3 + 8) + 64 * 1024


def prepare_memory(nodes: int, edges: int, features: int, parts: int, words: int = 0) -> Estimate:
    """Peak bytes a whole-graph ``prepare`` adds to the process (everything in one process): the adjacency (CSR,
    with the shard writer's int64 copy of one part), the features and the writer's copy of one part of them,
    the synthetic generator's word draws (``words`` per node, four int64/float64 arrays; 0 for other sources)
    and the partition's per-node arrays. Checked against measured peak RSS of ``prepare synthetic`` (200,000 nodes
    of degree 15 and 128 features: 384 MiB estimated, 340 MiB measured; 400,000 of 256: 1015 and 955 MiB)."""
    return Estimate({"graph": 16 * edges, "features": int((1 + 1 / max(parts, 1)) * 4 * nodes * features),
                     "generator": 4 * 8 * nodes * words, "partition": 6 * 8 * nodes})


def check_prepare_resources(out: str | Path, memory: Estimate | None, disk: int) -> None:
    """Print the estimates (one line) and refuse, in one sentence, a need above ``MemAvailable`` (pointing at
    ``prepare synthetic --stream``) or above the free space where ``out`` will be written."""
    available = mem_available()
    target = Path(out).resolve().parent
    while not target.exists() and target != target.parent:
        target = target.parent
    free = shutil.disk_usage(target).free
    shown = f"memory about {memory.describe()}; " if memory is not None else ""
    print(f"prepare: {shown}disk about {size(disk)} for the shards ({size(free)} free in {target})", flush=True)
    if memory is not None and available is not None and memory.total > available:
        raise ResourceError(f"not enough memory: prepare needs about {size(memory.total)} but "
                            f"{size(available)} is available; use prepare synthetic --stream (bounded memory) "
                            f"or fewer --nodes")
    if disk > free:
        raise ResourceError(f"not enough disk: the shards need about {size(disk)} but {target} has "
                            f"{size(free)} free; choose another --out")
