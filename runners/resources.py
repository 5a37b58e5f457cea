"""Memory and disk a command will need, estimated before any work from ``meta.json`` counts and the flags.

``train``'s memory: :func:`check_train_resources` (collective) gathers every rank's estimate
(:func:`runners.memory_estimate.train_memory`: what each part counts and how it was checked), prints it (rank 0, one
line) and refuses the run in one sentence, with the flag that would help, when the ranks of a node together need
more than its ``MemAvailable`` (``/proc/meminfo``).

``train``'s disk: :func:`train_disk` estimates the checkpoint sets (``main.ckpt``: the parameters, counted
exactly by each layer kind (:func:`algorithms.model.layer_figures`), three times (weights and Adam's two
moments) plus a small fixed part; a ``rankNNNNN.ckpt`` per rank where the run keeps policy state: what each
policy says it keeps (:meth:`~algorithms.policies.base.PolicyBase.state_size`: rows x the exchanged width per
exchanging layer, plus a cached-block rule's block structure)) and the results file; while a new set is committed the
previous one still exists, so the checkpoint's peak is two sets (one more beside the one already there when
resuming). :func:`check_train_resources` also checks these against the free space of the directories they
go to (summed where both are on one file system), from rank 0's view (shared file system assumed: every
rank's policy file goes to the checkpoint's directory).

``prepare``'s estimates are in :mod:`runners.prepare_resources`; what both read of the machine
(:func:`mem_available`, :func:`current_rss`) is here.
"""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.policies import AxisSpec
from algorithms.policies.base import StateSize
from algorithms.static_input import exchange_widths, receiver_side
from runners.data.shards import ShardError, read_meta
from runners.policy_auto import CODECS as AUTO_CODECS, SAMPLES as AUTO_SAMPLES
from runners.memory_estimate import (OPTIMIZER_COPIES, Estimate, axis_policy, group_counts, model_figures,  # noqa: F401
                                     size, train_memory)
from sparse_dist.comm import Communicator, said_once
from sparse_dist.compress import Codec
from sparse_dist.plans import plan_class

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


def policy_state_copies(stale: Any, compress: str, sample: Any = None) -> tuple[int, bool]:
    """Arrays of exchanged-rows x width per exchanged layer a rank's policy file holds, and whether it also holds
    the cached blocks' structure; (0, False) for a run without per-rank policy state. Each policy says what it
    keeps (:meth:`~algorithms.policies.base.PolicyBase.state_size`); error feedback adds a residual of the rows
    and of the gradients per layer."""
    sizes = [policy.state_size() for policy in (axis_policy("stale", stale), axis_policy("sample", sample))
             if policy is not None] or [StateSize()]
    copies, structure = sum(size.row_copies for size in sizes), any(size.block_structure for size in sizes)
    codec = Codec.parse(compress)
    return copies + (codec.residual_copies if codec is not None else 0), structure


def exchanged_rows(meta: dict[str, Any], plan: str, groups: int, counts: dict[str, int], group: int = 0) -> int:
    """Rows a rank of row group ``group`` exchanges per layer and direction: where the plan's byte model moves
    rows no boundary asks for (``dense-bcast``: every other group's rows), those; otherwise, where the run has one
    group per prepared part, the average from ``prepare``'s predicted bytes per feature for the plan (float32:
    4 bytes a row), else the group's boundary rows."""
    if groups < 2:
        return 0
    per_group = int(meta["num_parts"]) // groups
    rows = np.diff(np.asarray(meta["row_offsets"], dtype=np.int64)[::per_group])
    nothing = np.zeros((groups, groups), dtype=np.int64)
    unasked = np.array(plan_class(plan).moved_rows(rows, nothing, np.zeros(groups, dtype=np.int64)), dtype=np.int64)
    np.fill_diagonal(unasked, 0)
    if unasked.any():
        return int(unasked[group].sum())
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
    chosen_at_setup = getattr(args, "policy", "manual") == "auto"  # its choice may be any policy
    return getattr(args, "guard", "off") == "auto" and (policy or compressed or chosen_at_setup)


def train_disk(meta: dict[str, Any], args: Any, world_size: int) -> dict[str, int]:
    """Bytes ``train`` writes: ``set`` (one checkpoint set: ``main.ckpt`` and every rank's policy file),
    ``checkpoint`` (its peak: two sets, one while resuming) and ``results``; 0 where nothing is written."""
    figures = {"set": 0, "checkpoint": 0, "results": 0}
    itemsize = 8 if args.dtype == "float64" else 4
    layers = model_figures(args.model, int(meta["feature_dim"]), args.hidden, args.layers, int(meta["num_classes"]),
                           args.heads, args.output_heads)
    if args.checkpoint:
        # weights and Adam's two moments; the accuracy guard keeps a second copy of the weights (its best evaluation)
        copies_of_weights = 4 if guard_keeps_weights(args) else 3
        main = copies_of_weights * sum(layer.parameters for layer in layers) * itemsize + CHECKPOINT_FIXED_BYTES
        if getattr(args, "policy", "manual") == "auto":  # chosen at set-up: the most any candidate keeps
            copies, structure = max(policy_state_copies(args.stale, compress, AxisSpec.parse("sample", sample))
                                    for sample in AUTO_SAMPLES for compress in AUTO_CODECS)
        else:
            copies, structure = policy_state_copies(args.stale, str(getattr(args, "compress", "none")),
                                                    getattr(args, "sample", None))
        receiver = receiver_side(args.dropout_side, args.dropout, args.stale, exchange_widths(
            [(layer.fan_in, layer.width) for layer in layers], args.input_exchange,
            [(layer.receiver[0], layer.owner[0]) for layer in layers]))
        skip_first = args.input_exchange == "once" or (args.input_exchange == "auto" and receiver)
        cached = [(layer.receiver if receiver else layer.owner)[0]
                  for index, layer in enumerate(layers) if not (skip_first and index == 0)]
        ranks = 0
        groups = world_size // max(args.replication, 1)
        stats = meta.get("partition_stats", {})
        for rank in range(world_size if copies else 0):
            counts = group_counts(meta, groups, rank // args.replication)
            if counts is None:
                continue
            rows = exchanged_rows(meta, args.plan, groups, counts, rank // args.replication)
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
    if largest == "halo" and getattr(args, "input_exchange", "auto") != "per-epoch":
        return "--input-exchange per-epoch (or --halo-budget), or more ranks (on more nodes)"
    if largest == "halo":  # already received every epoch, at the exchanged width
        return f"a smaller --hidden (now {args.hidden}) or more ranks (on more nodes)"
    return "more ranks (on more nodes; the dataset must have as many parts: prepare --parts)"


def readable_meta(data_dir: str | Path) -> dict[str, Any] | None:
    """``meta.json`` of ``data_dir``, or None if it cannot be read (the shard reader then says why)."""
    try:
        return read_meta(data_dir)
    except ShardError:
        return None


def node_memory() -> dict[str, Any]:
    """This rank's host, its RSS at start and its node's available memory (what every estimate is checked against)."""
    return {"host": socket.gethostname(), "rss_at_start": current_rss(), "available": mem_available()}


def ranks_by_host(hosts: list[str]) -> dict[str, list[int]]:
    """The ranks on each host, in rank order, from every rank's host name (gathered)."""
    nodes: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        nodes.setdefault(host, []).append(rank)
    return nodes


def free_memory_per_rank(record: dict[str, Any] | None) -> float | None:
    """The bytes each rank may add beyond the run's estimates: on each node its ``MemAvailable`` (read with the
    estimates, before any shard) less its ranks' estimates, split over them; the smallest over the nodes (0 where
    a node is short). None without the estimates (``record``: :func:`check_train_resources`' figures) or a node's
    available memory. Local: the record is the same on every rank."""
    if record is None or "estimate_per_rank" not in record:
        return None
    shares = []
    for host, ranks in ranks_by_host(record["host_per_rank"]).items():
        available = record["available_per_node"].get(host)
        if available is None:
            return None
        shares.append((available - sum(record["estimate_per_rank"][r] for r in ranks)) / len(ranks))
    return max(0.0, float(min(shares)))


def memory_verdict(comm: Communicator, everyone: list[dict[str, Any]],
                   totals: list[int]) -> tuple[Estimate, tuple[str, list[int], int, int] | None]:
    """From every rank's :func:`node_memory` and ``estimate`` parts (gathered) and their ``totals``: rank 0 prints
    the largest rank's estimate in one line; returns it and the node short of memory by the most, ``(host, ranks,
    need, available)``, or None. The same on every rank (decided from gathered figures)."""
    largest = max(range(len(everyone)), key=lambda r: totals[r])
    nodes = ranks_by_host([entry["host"] for entry in everyone])
    worst, short_by = None, 0
    for host, ranks in nodes.items():
        available = [everyone[r]["available"] for r in ranks if everyone[r]["available"] is not None]
        need = sum(totals[r] for r in ranks)  # MemAvailable already leaves out what the ranks hold at start
        if available and need > min(available) and need - min(available) > short_by:
            worst, short_by = (host, ranks, need, min(available)), need - min(available)
    biggest = Estimate(everyone[largest]["estimate"])
    if comm.rank == 0:
        available = everyone[0]["available"]
        print(f"memory: about {biggest.describe()} on the largest rank, beyond the {size(everyone[largest]['rss_at_start'])} "
              f"it holds at start; {size(available) if available else 'unknown memory'} available on "
              f"{'each node' if len(nodes) > 1 else 'this node'} for {max(len(r) for r in nodes.values())} rank(s)",
              flush=True)
    return biggest, worst


def _widest_compress(args: Any) -> str:
    """``--compress`` as the memory estimate reads it; under ``--policy auto``, which chooses at set-up, the
    candidate codec that keeps the most (:attr:`~sparse_dist.compress.Codec.residual_copies`)."""
    if getattr(args, "policy", "manual") == "auto":
        return max(AUTO_CODECS, key=lambda text: (codec := Codec.parse(text)) is not None and codec.residual_copies)
    return str(getattr(args, "compress", "none"))


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
                                input_exchange=args.input_exchange, stale=str(args.stale), epochs=args.epochs,
                                eval_every=1 if getattr(args, "steer_evaluation", False) else args.eval_every,
                                dropout=args.dropout, device=args.device, compress=_widest_compress(args))
    disk, disk_error = None, None
    if comm.rank == 0 and meta is not None and (args.checkpoint or args.out):
        disk = train_disk(meta, args, comm.size)
        disk_error = disk_problem(args, disk)
    everyone = comm.allgather_object({**node_memory(), "estimate": estimate.parts if estimate is not None else None,
                                      "disk_error": disk_error})
    if any(entry["estimate"] is None for entry in everyone):
        return None  # the dataset does not fit the run: the shard reader says why, collectively
    totals = [sum(entry["estimate"].values()) for entry in everyone]
    record = {"estimate_per_rank": totals, "estimate_parts_per_rank": [entry["estimate"] for entry in everyone],
              "rss_at_start_per_rank": [entry["rss_at_start"] for entry in everyone],
              "available_per_node": {entry["host"]: entry["available"] for entry in everyone},
              "host_per_rank": [entry["host"] for entry in everyone]}
    biggest, worst = memory_verdict(comm, everyone, totals)
    if comm.rank == 0 and disk is not None:
        sets = (f"1 set of {size(disk['set'])} beside the current one" if args.resume
                else f"2 sets of {size(disk['set'])}")
        shown = [f"{size(disk['checkpoint'])} for checkpoints ({sets})"] if disk["set"] else []
        shown += [f"{size(disk['results'])} for the results file"] if disk["results"] else []
        print(f"disk: about {' and '.join(shown)}", flush=True)
        record["disk_estimate"] = disk
    if worst is not None:
        host, ranks, need, available = worst
        shown = ", ".join(f"{name} {size(value)}" for name, value in biggest.parts.items() if value)
        error = ResourceError(
            f"not enough memory: the {len(ranks)} rank(s) on {host} need about {size(need)} but {size(available)} is "
            f"available (largest rank {size(biggest.total)}: {shown}); use {_train_hint(args, biggest)}")
        raise said_once(error)  # decided from gathered figures: the same everywhere
    if everyone[0]["disk_error"] is not None:  # rank 0 looked (it writes the main file and the results)
        error = ResourceError(everyone[0]["disk_error"])
        raise said_once(error)
    return record
