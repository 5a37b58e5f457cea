"""Typed argparse parsers: each refuses a value outside its range with the range in the message.

A leaf module (standard library only), so every command, the study loader and the tests share one
set of rules. argparse prefixes the flag: ``argument --lr: must be a finite number > 0, got nan``.
The launcher's world size (:func:`launcher_world_size`) lets ``--replication`` be checked against P
before MPI starts. A renamed flag keeps its old spelling for one release (:func:`add_renamed`): the old
name still works and says its new name in one line (docs/reference/names.md has the renames).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable

_WORLD_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS",
                         "SLURM_NTASKS")
"""Where launchers announce P: MPICH/Intel MPI (hydra), Open MPI, MVAPICH, then srun's step (its task count
before the job's, which a step may use only part of)."""
_RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID")


def launcher_rank() -> int:
    """This process's rank as the launcher (mpiexec, srun) announced it, before MPI starts; 0 if none did."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def launcher_world_size() -> int | None:
    """The number of ranks the launcher (mpiexec, srun) started, read before MPI starts.

    1 when no launcher announced a rank (a plain ``python`` run is a singleton); None when a rank was
    announced but no size (an unknown launcher: the size is then checked once MPI has started).
    """
    for name in _WORLD_SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    if any(os.environ.get(name, "").isdigit() for name in _RANK_VARIABLES):
        return None
    return 1


def _quoted(text: str) -> str:
    """``text`` quoted for a message, its middle left out past 40 characters (a pasted number may be long)."""
    return repr(text) if len(text) <= 40 else repr(f"{text[:18]}...{text[-18:]}") + f" ({len(text)} characters)"


def _shown(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _bound_text(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {_shown(low)}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {_shown(high)}")
    return " and ".join(parts)


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """argparse type: an integer in ``[low, high]`` (either end may be open-ended: None)."""
    wanted = "an integer" + (f" {_bound_text(low, high, False, False)}" if low is not None or high is not None
                             else "")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {_quoted(text)}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in its own messages
    parse.bounds = ("integer", low, high, False, False)  # type: ignore[attr-defined]  (read by :func:`bounded`)
    return parse


def at_least(low: int) -> Callable[[str], int]:
    """argparse type: an integer ``>= low``."""
    return integer(low)


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False) -> Callable[[str], float]:
    """argparse type: a finite number in the interval given (``low_open``: ``> low``; ``high_open``: ``< high``)."""
    bounds = _bound_text(low, high, low_open, high_open)
    wanted = "a finite number" + (f" {bounds}" if bounds else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {_quoted(text)}") from None
        below = low is not None and (value <= low if low_open else value < low)
        above = high is not None and (value >= high if high_open else value > high)
        if not math.isfinite(value) or below or above:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {value:g}")
        return value

    parse.__name__ = "number"
    parse.bounds = ("number", low, high, low_open, high_open)  # type: ignore[attr-defined]
    return parse


positive = number(0.0, low_open=True)
"""A finite number > 0 (learning rate, bandwidth)."""

non_negative = number(0.0)
"""A finite number >= 0 (weight decay, clip bound, thresholds)."""

probability = number(0.0, 1.0, high_open=True)
"""A dropout-style probability in ``[0, 1)`` (1 would drop everything)."""

fraction = number(0.0, 1.0)
"""A share in ``[0, 1]``."""

seed = integer(0, 2 ** 63 - 1)
"""A random seed (NumPy's SeedSequence refuses negative ones)."""


def int_list(low: int) -> Callable[[str], list[int]]:
    """argparse type: comma-separated integers, each ``>= low`` (e.g. ``--ranks 64,256,1024``)."""
    def parse(text: str) -> list[int]:
        items = [item.strip() for item in text.split(",")]
        try:
            values = [int(item) for item in items]
        except ValueError:
            values = []
        if not values or min(values) < low:
            raise argparse.ArgumentTypeError(f"must be comma-separated integers >= {low}, e.g. 64,256; got {text!r}")
        return values

    parse.__name__ = "int_list"
    return parse


def replication_problem(replication: int, world_size: int | None) -> str | None:
    """Why a 1.5D replication factor ``c`` cannot run on ``world_size`` ranks (None: it can, or P is unknown)."""
    if world_size is None or world_size % replication == 0:
        return None
    divisors = [c for c in range(1, world_size + 1) if world_size % c == 0]
    return (f"argument --replication: must divide the number of ranks P={world_size}, got {replication} "
            f"(divisors of {world_size}: {', '.join(map(str, divisors))})")


_NOTED: set[str] = set()
"""Lines already said in this process (a study check parses the same table many times)."""


def deprecation_notice(prog: str, old: str, new: str) -> None:
    """One line on stderr saying that ``old`` is now ``new`` (:func:`say_once`)."""
    say_once(f"{prog}: warning: {old} is deprecated, use {new} (the old name goes in the next release)")


def say_once(line: str) -> None:
    """``line`` on stderr once per process, from launcher rank 0 only (every rank parses the same command
    line, as :class:`runners.cli._Parser` says its errors)."""
    if line in _NOTED or launcher_rank() != 0:
        return
    _NOTED.add(line)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class _RenamedFlag(argparse.Action):
    """The old spelling of a renamed flag: stores into the new flag's ``dest`` and says the new name."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        deprecation_notice(parser.prog, option_string or self.option_strings[0], self.new)
        setattr(namespace, self.dest, values)


def add_renamed(parser: argparse.ArgumentParser, new: str, old: str, **kwargs: Any) -> argparse.Action:
    """``parser.add_argument(new, **kwargs)``, plus ``old`` that parses the same way into the same ``dest``
    and prints :func:`deprecation_notice` when used (listed in ``--help`` as the old name for this release,
    as Python 3.13's ``deprecated=True`` does). Returns the new flag's action."""
    action = parser.add_argument(new, **kwargs)
    parser.add_argument(old, dest=action.dest, action=_RenamedFlag, new=new, type=kwargs.get("type"),
                        choices=kwargs.get("choices"), metavar=action.metavar, default=argparse.SUPPRESS,
                        help=f"deprecated: the old name of {new}, which it sets (default: {new}'s)")
    return action


# ---------------------------------------------------------------- every numeric flag's range
FORCE_MARK = "!"
"""``--threads N!``: more threads than the cores this process may use (up to :data:`MAX_FORCED_THREADS`)."""
MAX_FORCED_THREADS = 1024


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a launcher's binding leaves it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class Range:
    """The values a numeric flag accepts, and why its ends lie where they do.

    ``low``/``high`` bound the value (``low_open``/``high_open``: strictly); an integer flag takes integer
    ends. ``cores``: a thread count, whose upper end is :func:`usable_cores` unless forced with ``N!``
    (then ``high``). A flag whose value is a list (``--ranks``, ``--fanouts``) bounds each entry.
    """

    low: float
    high: float
    why: str
    low_open: bool = False
    high_open: bool = False
    cores: bool = False

    def interval(self) -> str:
        """``[1, 10^7]``, ``(0, 1]``; a thread count ``[0, cores], N! up to 1024``."""
        if self.cores:
            return f"[{_power(self.low)}, cores], N{FORCE_MARK} up to {_power(self.high)}"
        return (f"{'(' if self.low_open else '['}{_power(self.low)}, {_power(self.high)}"
                f"{')' if self.high_open else ']'}")


def _power(value: float) -> str:
    """``10000000`` -> ``10^7``, ``1073741824`` -> ``2^30``, ``2147483647`` -> ``2^31-1``; others as they are."""
    if isinstance(value, int) and value >= 10_000:
        for base in (10, 2):
            exponent = round(math.log(value, base))
            for offset, text in ((0, ""), (1, "-1")):
                if base ** exponent - offset == value:
                    return f"{base}^{exponent}{text}"
    return _shown(value)


_EPOCHS = Range(1, 10**7, "10^7 epochs is about four months at one second an epoch; a longer run is a typo")
_CADENCE = Range(1, 10**7, "in epochs; past --epochs' own bound it would never fire")
_SEED = Range(0, 2**63 - 1, "NumPy's SeedSequence refuses negative seeds; torch keeps 64 bits")
_LAYERS = Range(1, 128, "the deepest published GNNs (DeepGCN) use about 100 layers; every layer keeps its "
                        "activations for the backward")
_WIDTH = Range(1, 65536, "a layer's weights are width^2 values: 65536 is 16 GiB of float32 for one layer")
_HEADS = Range(1, 64, "GAT uses 8; every head multiplies the layer's width and its exchanges")
_DROPOUT = Range(0.0, 1.0, "a probability; 1 would drop every input", high_open=True)
_LR = Range(0.0, 10.0, "Adam's step; above 10 a model diverges in its first step", low_open=True)
_THREADS = Range(0, MAX_FORCED_THREADS, "0 picks cores / ranks on the node; more threads than the cores the "
                                        f"rank may use only contend (N{FORCE_MARK} forces up to "
                                        f"{MAX_FORCED_THREADS}, each thread a stack and a pool)", cores=True)
_REPLICATION = Range(1, 1024, "c copies of every row group; it must also divide the number of ranks P")
_NODES = Range(1, 10**10, "100 times ogbn-papers100M; node ids, shards and the disk grow with it")
_DEGREE = Range(1, 10**4, "the graph holds nodes x degree edges; real graphs average 10 to 100")
_CLASSES = Range(2, 10**5, "labels are read as one column per class for multi-label graphs")
_PARTS = Range(1, 65536, "one shard per row group (at most one per rank); more files than that is no dataset")
_HOPS = Range(1, 16, "a K-hop neighbourhood covers real graphs by K = 10; its statistics grow with K")
_BATCH = Range(1, 2**24, "seeds a step; 2^24 is 14 times ogbn-papers100M's training set")
_FANOUT = Range(1, 10**5, "neighbours sampled a node a hop; 'all' takes every one")
_PREFETCH = Range(0, 64, "every batch ahead holds its sampled rows in memory")
_SAMPLE_BATCHES = Range(1, 1024, "the K batches sampled together are held in memory at once")
_CACHE_ROWS = Range(0, 10**9, "remote input rows a rank keeps; 10^9 rows is more than any graph's boundary")
_BYTES = Range(0, 2**50, "bytes of halo a rank may keep (1 PiB); 'unlimited' says no bound")
_ALPHA = Range(0.0, 1.0, "seconds of latency a message; a second is no network")
_BANDWIDTH = Range(0.0, 10.0**4, "GB/s of a link; today's fastest links move about 100", low_open=True)
_PER_NODE = Range(1, 10**5, "ranks or cores of one node")
_RANKS = Range(1, 8192, "the model's tables are P x P float64: 8192 ranks is 512 MiB")
_SHARE = Range(0.0, 1.0, "a share")
_REPEATS = Range(1, 10**4, "timed repetitions; more only adds time")
_BENCH_EPOCHS = Range(1, 10**6, "timed epochs of a benchmark; more only adds time")
_WARMUP = Range(0, 10**6, "untimed epochs before the timed ones")
_TARGET = Range(0.0, 1.0, "a validation accuracy (or micro-F1)", low_open=True)

FLAG_RANGES: dict[str, dict[str, Range]] = {
    "demo": {"--features": _WIDTH, "--replication": _REPLICATION},
    "prepare": {"--parts": _PARTS, "--hops": _HOPS, "--seed": _SEED, "--nodes": _NODES, "--classes": _CLASSES,
                "--degree": _DEGREE, "--features": _WIDTH,
                "--homophily": Range(0.0, 1.0, "the share of a node's edges inside its class"),
                "--num-classes": Range(1, 10**5, "class ids 0..C-1; a multi-label graph keeps C columns a node"),
                "--scale": Range(1, 32, "2^SCALE vertices, held in one process: 2^32 is 4 Gi vertices and 64 Gi "
                                        "edge draws at edge factor 16 (Graph500's toy class is SCALE 26)"),
                "--edge-factor": Range(1, 10**4, "edge draws a vertex (Graph500: 16); the graph holds up to twice "
                                                 "that many stored entries a vertex")},
    "train": {
        "--layers": _LAYERS, "--hidden": _WIDTH, "--dropout": _DROPOUT, "--heads": _HEADS, "--output-heads": _HEADS,
        "--attention-dropout": _DROPOUT, "--lr": _LR,
        "--weight-decay": Range(0.0, 10.0, "an L2 penalty; above 10 it outweighs any loss"),
        "--epochs": _EPOCHS, "--eval-every": _CADENCE, "--print-every": _CADENCE,
        "--audit-every": Range(0, 10**7, "in epochs, 0 for never; past --epochs' own bound it would never fire"),
        "--guard-drop": Range(0.0, 1.0, "a share of the validation metric, which lies in [0, 1]", low_open=True,
                              high_open=True),
        "--guard-sharp": Range(0.0, 1.0, "a share of the validation metric; at least --guard-drop (checked with it)",
                               low_open=True, high_open=True),
        "--guard-patience": Range(1, 1000, "evaluations; past a thousand the guard would never act"),
        "--guard-loss-rise": Range(0.0, 100.0, "a relative rise of the loss; 100x its lowest is a divergence",
                                   low_open=True),
        "--guard-warmup": Range(0, 10**7, "in epochs, as --epochs"),
        "--guard-noise": Range(0.0, 10.0, "standard errors; past 10 no fall would ever count"),
        "--guard-settle": Range(0.0, 1.0, "a share of the first step's loss", high_open=True),
        "--guard-stall": Range(0, 10**7, "in epochs, as --epochs; 0 for none"),
        "--checkpoint-every": _CADENCE, "--seed": _SEED, "--replication": _REPLICATION,
        "--halo-budget": _BYTES, "--clip": Range(0.0, 10.0**6, "a gradient-norm bound; 0 turns clipping off"),
        "--threads": _THREADS, "--target-acc": _TARGET, "--fanouts": _FANOUT, "--batch-size": _BATCH,
        "--feature-cache": _CACHE_ROWS, "--prefetch": _PREFETCH, "--sample-batches": _SAMPLE_BATCHES},
    "plot": {"--dpi": Range(10, 1200, "print quality is 300 to 600 dpi; a figure's pixels grow with its square")},
    "cost compare": {"--alpha": _ALPHA, "--beta-gbs": _BANDWIDTH, "--ranks-per-node": _PER_NODE,
                     "--cores-per-node": _PER_NODE, "--machine-cores": _PER_NODE},
    "cost predict": {
        "--nodes": Range(1, 10**13, "a model only; 10^13 nodes is 10^5 times ogbn-papers100M"),
        "--nnz": Range(0, 10**15, "a model only; 10^15 nonzeros is 10^5 times ogbn-papers100M"),
        "--features": Range(1, 10**6, "a model only: an input width"), "--classes": Range(1, 10**6, "a model only"),
        "--hidden": Range(1, 10**6, "a model only: a hidden width"), "--layers": Range(1, 1000, "a model only"),
        "--ranks": _RANKS, "--active": _SHARE, "--cut": _SHARE, "--neighbour-parts": _RANKS,
        "--threads": Range(1, 10**5, "cores a rank of the modelled machine computes with"),
        "--alpha": _ALPHA, "--beta-gbs": _BANDWIDTH, "--ranks-per-node": _PER_NODE, "--cores-per-node": _PER_NODE,
        "--machine-cores": _PER_NODE},
    "cost node-split": {
        "--nodes": Range(1, 10**13, "a model only; 10^13 nodes is 10^5 times ogbn-papers100M"),
        "--nnz": Range(0, 10**15, "a model only; 10^15 nonzeros is 10^5 times ogbn-papers100M"),
        "--features": Range(1, 10**6, "a model only: an input width"), "--classes": Range(1, 10**6, "a model only"),
        "--hidden": Range(1, 10**5, "the probe's units are 131072 rows of this width"),
        "--layers": Range(1, 1000, "a model only"), "--cut": _SHARE,
        "--job-nodes": Range(1, 10**6, "nodes of the modelled job"),
        "--alpha": _ALPHA, "--beta-gbs": _BANDWIDTH, "--ranks-per-node": _PER_NODE, "--cores-per-node": _PER_NODE,
        "--machine-cores": _PER_NODE},
    "cost bytes": {"--hidden": _WIDTH, "--layers": _LAYERS,
                   "--itemsize": Range(1, 16, "bytes per value: 2 (fp16), 4 (float32), 8 (float64); 16 at most")},
    "emulate": {"--nodes": Range(1, 253, "one network namespace and address of a /24 per node"),
                "--ranks-per-node": Range(1, 1024, "ranks sharing one emulated node's cores"),
                "--timeout": Range(0.0, 7 * 86400.0, "seconds; a week, longer than any emulated run", low_open=True)},
    "bench spmm": {"--nodes": Range(1, 10**9, "rows of the matrix; the reference keeps the whole of it"),
                   "--degree": _DEGREE, "--features": _WIDTH,
                   "--community-size": Range(1, 10**9, "nodes a community; at most --nodes' bound"),
                   "--mixing": _SHARE, "--replication": _REPLICATION, "--repeats": _REPEATS, "--threads": _THREADS,
                   "--seed": _SEED},
    "bench network": {"--repeats": Range(1, 10**5, "samples a message size; more only adds time"),
                      "--max-bytes": Range(2**21, 2**31 - 1, "beta is fitted on messages of 2 MiB and more; "
                                                                   "an MPI count is a 32-bit int")},
    "bench train": {"--synthetic": Range(2, 10**9, "nodes of the synthetic graph, as prepare's; one node is no graph"),
                    "--degree": _DEGREE, "--features": _WIDTH, "--classes": _CLASSES, "--layers": _LAYERS,
                    "--hidden": _WIDTH, "--dropout": _DROPOUT, "--heads": _HEADS, "--output-heads": _HEADS,
                    "--attention-dropout": _DROPOUT, "--epochs": _BENCH_EPOCHS, "--warmup": _WARMUP,
                    "--threads": _THREADS, "--seed": _SEED},
    "bench grid": {"--epochs": _BENCH_EPOCHS, "--hidden": _WIDTH, "--layers": _LAYERS, "--lr": _LR, "--seed": _SEED,
                   "--dropout": _DROPOUT},
    "bench policies": {"--epochs": _EPOCHS, "--hidden": _WIDTH, "--layers": _LAYERS, "--dropout": _DROPOUT,
                       "--seed": _SEED, "--sancus-h-eps": Range(0.0, 10.0**6, "a variation-gap threshold"),
                       "--psc-budget": Range(0.0, 1.0, "a share of each row's neighbours", low_open=True),
                       "--threads": _THREADS, "--target-acc": _TARGET, "--beta-gbs": _BANDWIDTH},
    "bench minibatch": {"--layers": _LAYERS, "--hidden": _WIDTH, "--dropout": _DROPOUT, "--lr": _LR,
                        "--fanouts": _FANOUT, "--batch-size": _BATCH, "--feature-cache": _CACHE_ROWS,
                        "--prefetch": _PREFETCH, "--sample-batches": _SAMPLE_BATCHES, "--epochs": _BENCH_EPOCHS,
                        "--warmup": _WARMUP, "--threads": _THREADS, "--seed": _SEED},
    "bench cores": {"--synthetic": Range(2, 10**9, "nodes of the synthetic graph, as prepare's; one node is no graph"),
                    "--epochs": Range(3, 10**4, "the medians take epochs 3 on"), "--hidden": _WIDTH,
                    "--layers": _LAYERS, "--timeout": Range(1, 7 * 86400, "seconds a run")},
    "bench partition": {"--parts": _PARTS, "--hops": _HOPS, "--fanouts": _FANOUT, "--batch-size": _BATCH,
                        "--batches": Range(1, 10**4, "batches drawn a part for the estimate"), "--seed": _SEED},
}
"""Command (as ``sparse-dist COMMAND`` names it) -> numeric flag -> its :class:`Range`. Every numeric flag of
every command is here (``tests/cli/test_flag_ranges.py`` checks it); :func:`bound_flags` applies them while the
command line is parsed, so an out-of-range value is refused before MPI starts or anything is allocated."""


def _numbers(value: Any) -> list[float]:
    """The numbers a parsed flag value holds: itself, or a list's entries, or a comma-separated text's
    (``--ranks`` stays text); ``None`` and ``'all'`` entries hold none."""
    if isinstance(value, str):
        return [int(item) for item in value.split(",") if item.strip().lstrip("-").isdigit()]
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, (int, float)) and not isinstance(item, bool)]
    return [] if value is None else [value]


def _threads(limit: Range, option: str) -> Callable[[str], int]:
    """A thread count: ``0`` (cores / ranks on the node) up to :func:`usable_cores`, or ``N!`` up to the limit."""
    def parse(text: str) -> int:
        forced = text.endswith(FORCE_MARK)
        value = integer(int(limit.low))(text[:-1] if forced else text)
        cores = usable_cores()
        if value > cores and not forced:
            force = (f"; write {option} {value}{FORCE_MARK} to run more threads than cores anyway"
                     if value <= limit.high else f" ({option} N{FORCE_MARK} forces up to {int(limit.high)})")
            raise argparse.ArgumentTypeError(f"must be an integer >= {int(limit.low)} and <= {cores} (the cores "
                                             f"this process may use), got {value}{force}")
        if value > limit.high:
            raise argparse.ArgumentTypeError(f"must be at most {int(limit.high)} even when forced "
                                             f"({option} N{FORCE_MARK}), got {value}")
        return value

    parse.__name__ = "thread count"
    return parse


def bounded(kind: Callable[[str], Any] | None, limit: Range, option: str) -> Callable[[str], Any]:
    """``kind`` (an argparse ``type``) narrowed to ``limit``: an :func:`integer` or :func:`number` (or plain
    ``int``/``float``) becomes one with both ends, so its message states the whole range; any other type (a
    list, a size) is checked entry by entry after it parsed."""
    if limit.cores:
        return _threads(limit, option)
    bounds = getattr(kind, "bounds", None)
    if kind is int or (bounds is not None and bounds[0] == "integer"):
        return integer(int(limit.low), int(limit.high))
    if kind is float or (bounds is not None and bounds[0] == "number"):
        return number(limit.low, limit.high, low_open=limit.low_open, high_open=limit.high_open)
    inner = kind or str
    entry = integer(int(limit.low), int(limit.high))

    def parse(text: str) -> Any:
        value = inner(text)
        each = "each value must be an integer" if isinstance(value, (str, list, tuple)) else "must be"
        for item in _numbers(value):
            try:
                entry(str(item))
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(
                    f"{each} {_bound_text(limit.low, limit.high, False, False)}, got {item}") from None
        return value

    parse.__name__ = getattr(inner, "__name__", "value")
    return parse


def bound_flags(parser: argparse.ArgumentParser, command: str) -> list[str]:
    """Give every flag of ``command`` (and of its subcommands, ``cost predict``) its :data:`FLAG_RANGES`
    range: its type refuses a value outside it and its help ends with the interval. Returns the flags the
    table names that ``parser`` lacks (a stale entry)."""
    limits = FLAG_RANGES.get(command, {})
    missing = set(limits)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen and f"{command} {name}" in FLAG_RANGES:  # an alias shares its parser
                    seen.add(id(sub))
                    missing |= {f"{command} {name} {flag}" for flag in bound_flags(sub, f"{command} {name}")}
            continue
        option = next((flag for flag in action.option_strings if flag in limits), None)
        if option is None or getattr(action.type, "ranged", False):
            continue
        missing.discard(option)
        action.type = bounded(action.type, limits[option], option)
        action.type.ranged = True  # type: ignore[attr-defined]
        if action.help and action.help != argparse.SUPPRESS:
            action.help += f" (range {limits[option].interval()})"
    return sorted(missing)
