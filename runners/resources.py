"""Memory and disk a command will need, estimated before any work from ``meta.json`` counts and the flags.

``train``: :func:`train_memory` estimates, per rank, the bytes a run adds to what the process holds when it
starts (interpreter, torch, MPI): its rows of the graph (CSR as loaded, normalised, and as the operator's
torch blocks), its features (loaded as float32, normalised in float64, kept as a tensor), layer 0's halo rows
(``--input-exchange once``) and, for a layer that sees its input only through the product (GCN), the product
of layer 0 its evaluations keep (``once``, or ``auto`` which often takes it), per layer the activations
autograd keeps and their gradients, the parameters with their gradients and Adam's two moments, the exchange
buffers of the boundary rows and a staleness policy's caches. :func:`check_train_resources` (collective) prints
the estimate (rank 0, one line) and refuses the run in one sentence, with the flag that would help, when the
ranks of a node together need more than its ``MemAvailable`` (``/proc/meminfo``).

``train``'s disk: :func:`train_disk` estimates the checkpoint sets (``main.ckpt``: the parameters, counted
exactly from the layer widths, three times (weights and Adam's two moments) plus a small fixed part; a
``rankNNNNN.ckpt`` per rank where the run keeps policy state: its cached rows x the exchanged width per
cached layer, plus sancus' cached block structure) and the results file; while a new set is committed the
previous one still exists, so the checkpoint's peak is two sets (one more beside the one already there when
resuming). :func:`check_train_resources` also checks these against the free space of the directories they
go to (summed where both are on one file system), from rank 0's view (shared file system assumed: every
rank's policy file goes to the checkpoint's directory).

``prepare``: :func:`prepare_memory` (whole-graph sources: the synthetic generator's arrays and the shard
writer's copies), :func:`prepare_rmat_memory` (``prepare rmat``, bounded memory: the largest of its stages,
METIS counted as measured on R-MAT graphs, from :func:`rmat_entries`, the exact expected number of entries)
and :func:`shard_bytes` (the disk the shards take); :func:`check_prepare_resources` prints both and refuses a
need above ``MemAvailable`` (saying what helps) or the free space of the output's file system.

The multipliers (how many copies of an array live at the peak) were read off the code and checked against
measured peak RSS (``tests/cli/test_resources.py``: within 25% of ``ru_maxrss`` minus the RSS at start).
"""

from __future__ import annotations

import math
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from algorithms.layers import layer_type
from algorithms.static_input import exchange_widths, receiver_side
from runners.data.shards import ShardError, read_meta
from sparse_dist.comm import Communicator, said_once
from sparse_dist.compress import Codec

GIB = 1 << 30

RUNTIME_BYTES = 32 << 20
"""What a rank's resident set grows by for any graph: library code and kernels paged in at their first use (torch
2.13 CPU wheel, Cora: about 31 MiB beyond the graph and features. It was 90 MiB while ``torch.optim.Adam``'s
first step imported ``torch._dynamo``; :mod:`algorithms.optim` no longer does)."""
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

CHECKPOINT_FIXED_BYTES = 12 << 10
"""``main.ckpt`` beyond weights and Adam's moments: torch's RNG state (5,056 bytes), the configuration, the
optimiser's groups, the zip archive and the header line (Cora, GCN 2 x 16, float32: 288,074 bytes written
against 276,756 of parameters x 3)."""
RANK_FILE_FIXED_BYTES = 4 << 10
"""A ``rankNNNNN.ckpt`` beyond its cached arrays: versions, counts and the archive (Cora at P = 2,
dense-bcast, sancus-e: 126,259 bytes written against 123,312 of arrays)."""
EPOCH_RECORD_BYTES = 2600
"""One ``epoch`` record of the results file: measured 2,461 to 2,501 bytes (Cora, P = 2, GCN, p2p and
dense-bcast + sancus-e, 3 epochs: ``awk '{print length($0)+1}' r.jsonl``)."""
RESULTS_FIXED_BYTES = 3 << 10
RESULTS_BYTES_PER_RANK = 512
"""The results file's config, environment, setup and final records: 3,670 and 3,894 bytes in the same runs
(the environment and final records hold per-rank figures)."""


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
        # evaluations keep layer 0's product A X where the halo is fetched once (auto takes it often) and the
        # layer sees its input only through that product (GCN)
        "evaluation": (rows * features * itemsize if layer_type(model).input_only_through_product
                       and input_exchange != "per-epoch" else 0),
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


def parameter_count(model: str, widths: list[tuple[int, int]], output_heads: int = 1) -> int:
    """The model's trainable values, exactly as its layers hold them: W and b per layer (SAGE: two W; GAT: the
    heads' W side by side, the source and destination attention vectors, and a bias as wide as the layer's
    output, which for the output layer is one head's, its heads being averaged)."""
    count = 0
    for index, (d_in, d_out) in enumerate(widths):
        if model == "gat":
            last = index == len(widths) - 1
            count += d_in * d_out + 2 * d_out + (d_out // max(output_heads, 1) if last else d_out)
        else:
            count += d_in * d_out * (2 if model == "sage" else 1) + d_out
    return count


def _stale_name(stale: Any) -> str:
    return str(getattr(stale, "name", stale)).split(":")[0]


def policy_state_copies(stale: Any, compress: str) -> tuple[int, bool]:
    """Arrays of exchanged-rows x width per exchanged layer a rank's policy file holds, and whether it also holds
    the cached blocks' structure (sancus); (0, False) for a run without per-rank policy state. Read off the files
    (Cora at P = 4): sancus keeps one received block per layer; pipe keeps its last flight of rows and of
    gradients per layer; error feedback a residual of the rows and of the gradients per layer."""
    name, copies, structure = _stale_name(stale), 0, False
    if name.startswith("sancus"):
        copies, structure = 1, True
    elif name == "pipe" and int(dict(getattr(stale, "params", {}) or {}).get("tau", 1)) > 0:
        copies = 2  # rows and gradients in flight
    codec = Codec.parse(compress)
    if codec is not None and codec.feedback:
        copies += 2  # residuals of the rows and of the gradients
    return copies, structure


def exchanged_rows(meta: dict[str, Any], plan: str, groups: int, counts: dict[str, int]) -> int:
    """Rows a rank of a row group exchanges per layer and direction: under dense-bcast every other group's rows;
    otherwise, where the run has one group per prepared part, the average from ``prepare``'s predicted bytes per
    feature for the plan (float32: 4 bytes a row), else the group's boundary rows."""
    if groups < 2:
        return 0
    if plan == "dense-bcast":
        return int(meta["num_nodes"]) - counts["rows"]
    predicted = meta.get("partition_stats", {}).get("predicted_forward_bytes_per_feature", {}).get(plan)
    if predicted and groups == int(meta["num_parts"]):
        return int(predicted) // 4 // groups
    return counts["boundary"]


def guard_keeps_weights(args: Any) -> bool:
    """Whether the accuracy guard watches this run (a policy on some axis, ``--guard auto``), and so keeps a copy
    of the weights of the best evaluation in memory and in checkpoints."""
    policy = any(not getattr(args, axis).is_none for axis in ("sample", "stale") if hasattr(getattr(args, axis, None),
                                                                                          "is_none"))
    compressed = str(getattr(args, "compress", "none")).strip() not in ("", "none")
    return getattr(args, "guard", "off") == "auto" and (policy or compressed)


def train_disk(meta: dict[str, Any], args: Any, world_size: int) -> dict[str, int]:
    """Bytes ``train`` writes: ``set`` (one checkpoint set: ``main.ckpt`` and every rank's policy file),
    ``checkpoint`` (its peak: two sets, one while resuming) and ``results``; 0 where nothing is written."""
    figures = {"set": 0, "checkpoint": 0, "results": 0}
    itemsize = 8 if args.dtype == "float64" else 4
    widths = layer_widths(args.model, int(meta["feature_dim"]), args.hidden, args.layers, int(meta["num_classes"]),
                          args.heads, args.output_heads)
    if args.checkpoint:
        # weights and Adam's two moments; the accuracy guard keeps a second copy of the weights (its best evaluation)
        copies_of_weights = 4 if guard_keeps_weights(args) else 3
        main = copies_of_weights * parameter_count(args.model, widths, args.output_heads) * itemsize + CHECKPOINT_FIXED_BYTES
        copies, structure = policy_state_copies(args.stale, str(getattr(args, "compress", "none")))
        heads = [args.heads] * (len(widths) - 1) + [args.output_heads]
        receiver = receiver_side(args.dropout_side, args.dropout, args.stale, exchange_widths(
            widths, args.input_exchange,
            [(d_in, d_out + h) for (d_in, d_out), h in zip(widths, heads)] if args.model == "gat" else None))
        skip_first = args.input_exchange == "once" or (args.input_exchange == "auto" and receiver)
        cached = [(d_in if receiver else (d_out if args.model == "gat" else min(d_in, d_out)))
                  for index, (d_in, d_out) in enumerate(widths) if not (skip_first and index == 0)]
        ranks = 0
        groups = world_size // max(args.replication, 1)
        stats = meta.get("partition_stats", {})
        for rank in range(world_size if copies else 0):
            counts = group_counts(meta, groups, rank // args.replication)
            if counts is None:
                continue
            rows = exchanged_rows(meta, args.plan, groups, counts)
            ranks += RANK_FILE_FIXED_BYTES + copies * rows * sum(cached) * itemsize
            if structure and groups > 1:
                cut = stats.get("cut_edges")
                per_group = int(meta["num_parts"]) // groups
                group = rank // args.replication
                edges = int(sum(cut[group * per_group:(group + 1) * per_group])) if cut else counts["edges"]
                # per layer, the blocks of every other group: int32 ids and float64 values per cut edge, row pointers
                ranks += len(cached) * (12 * edges + 4 * (counts["rows"] + 1) * (groups - 1))
        figures["set"] = main + ranks
        figures["checkpoint"] = figures["set"] * (1 if args.resume else 2)
    if args.out:
        figures["results"] = (RESULTS_FIXED_BYTES + RESULTS_BYTES_PER_RANK * world_size
                              + EPOCH_RECORD_BYTES * args.epochs)
    return figures


def _existing(path: str | Path) -> Path:
    """The directory ``path`` will be written into, or its nearest existing ancestor."""
    target = Path(path).resolve().parent
    while not target.exists() and target != target.parent:
        target = target.parent
    return target


def _disk_text(args: Any, figures: dict[str, int]) -> str:
    sets = f"1 set of {size(figures['set'])} beside the current one" if args.resume else f"2 sets of {size(figures['set'])}"
    return f"the checkpoints (--checkpoint, {sets})"


def disk_problem(args: Any, figures: dict[str, int]) -> str | None:
    """The sentence refusing ``figures`` where they exceed the free space (rank 0's view), or None."""
    needs: dict[int, tuple[Path, int, list[str]]] = {}
    for flag, path, need in (("--checkpoint", args.checkpoint, figures["checkpoint"]),
                             ("--out", args.out, figures["results"])):
        if not path or not need:
            continue
        directory = _existing(path)
        device = directory.stat().st_dev
        shown, total, flags = needs.get(device, (directory, 0, []))
        needs[device] = (shown, total + need, flags + [flag])
    for directory, need, flags in needs.values():
        free = shutil.disk_usage(directory).free
        if need > free:
            what = " and ".join(_disk_text(args, figures) if flag == "--checkpoint" else "the results file (--out)"
                                for flag in flags)
            return (f"not enough disk: {what} {'needs' if flags == ['--out'] else 'need'} about {size(need)} in {directory} "
                    f"but it has {size(free)} free; free space there or choose another {'/'.join(flags)} directory "
                    f"(a larger --checkpoint-every does not lower the peak)")
    return None


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
    disk, disk_error = None, None
    if comm.rank == 0 and meta is not None and (args.checkpoint or args.out):
        disk = train_disk(meta, args, comm.size)
        disk_error = disk_problem(args, disk)
    mine = {"host": socket.gethostname(), "rss_at_start": current_rss(), "available": mem_available(),
            "estimate": estimate.parts if estimate is not None else None, "disk_error": disk_error}
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
        if disk is not None:
            sets = (f"1 set of {size(disk['set'])} beside the current one" if args.resume
                    else f"2 sets of {size(disk['set'])}")
            shown = [f"{size(disk['checkpoint'])} for checkpoints ({sets})"] if disk["set"] else []
            shown += [f"{size(disk['results'])} for the results file"] if disk["results"] else []
            print(f"disk: about {' and '.join(shown)}", flush=True)
            record["disk_estimate"] = disk
    if worst is not None:
        _, host, ranks, need, available = worst
        shown = ", ".join(f"{name} {size(value)}" for name, value in biggest.parts.items() if value)
        error = ResourceError(
            f"not enough memory: the {len(ranks)} rank(s) on {host} need about {size(need)} but {size(available)} is "
            f"available (largest rank {size(biggest.total)}: {shown}); use {_train_hint(args, biggest)}")
        raise said_once(error)  # decided from gathered figures: the same everywhere
    if everyone[0]["disk_error"] is not None:  # rank 0 looked (it writes the main file and the results)
        error = ResourceError(everyone[0]["disk_error"])
        raise said_once(error)
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
