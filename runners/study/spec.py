"""A scaling study declared in TOML: which runs it has, and where their results live.

A study file (see ``studies/`` and the README)::

    [study]
    name = "clustered-strong"
    output = "results/clustered-strong"   # relative to the directory sweep runs in (default: results/NAME)
    scaling = "strong"                     # strong | weak
    ranks = [1, 2, 4]
    replication = [1]                      # c; a c that does not divide P is skipped
    plans = ["dense-bcast", "sparse-bcast", "p2p"]
    policies = ["exact", "bns:keep=0.1", "sancus-h:eps=0.02",  # crossed with every plan and compression
                { policy = "pipe:tau=1", plans = ["p2p"] },   # or pinned to some plans and/or compressions
                { policy = "exact", plans = ["p2p"], compress = ["fp16", "int8,feedback"] }]
    compress = ["none"]                    # `train --compress` values crossed with plans x policies
    seeds = [0]
    epochs = 12
    warmup = 2                             # leading epochs left out of every time figure
    timeout = 900                          # seconds per run
    launcher = "auto"                      # auto | mpiexec | srun
    launcher_args = []                     # e.g. ["--oversubscribe"] for Open MPI's mpiexec
    # target_acc = 0.78                    # results.csv's time_to_target: validation accuracy in (0, 1]
                                           # (default: 0.98 x the best of the exact p2p run, same dataset and P)
    # overwrite = true                     # write into an output this study's sweep did not mark as its own
                                           # (runners.study.output: its .sparse-dist-sweep.json)

    [train]                                # any `sparse-dist train` option, by its long name
    hidden = 64
    threads = 1

    [[dataset]]
    name = "clustered"
    synthetic = { nodes = 100000, degree = 10, features = 64, classes = 8 }
    partitioner = "metis"                  # prepared once per size by the sweep
    # path = "data_prepared/cora"          # or an already prepared directory
    # planetoid = { name = "citeseer", root = "../data/planetoid" }   # or prepare planetoid (root: the
                                           # ind.NAME.* files, relative to the study file; the built-in Cora
                                           # without one)
    # rmat = { scale = 16, edge_factor = 16, features = 128, classes = 8 }   # or prepare rmat: a Graph500
                                           # R-MAT graph of 2^scale vertices (edge_factor, features, classes:
                                           # prepare's defaults where left out; weak scaling: scale is
                                           # one rank's graph, P ranks get scale + log2 P)
    # nodes_per_rank = 25000               # weak scaling: nodes = nodes_per_rank * P
    # sizes = { "1" = 25000, "2" = 50000 } # weak scaling, explicit
    # epochs = 200                         # this dataset's runs train this many epochs (default: study.epochs)

    [network]                              # optional: every run over an emulated cluster (`sparse-dist emulate`)
    bandwidth = ["unlimited", "1gbit", "200mbit"]   # each node's link, both directions; crossed with the runs
    ranks_per_node = 1                     # emulated nodes = P / ranks_per_node
    # nodes = 2                            # or a fixed node count: runs with P != nodes * ranks_per_node are skipped
    # latency = "50us"                     # one-way, needs the netem qdisc

Paths: ``output`` (like every output flag of ``sparse-dist``) is relative to
the current directory, so ``sparse-dist sweep runners/study/studies/tiny.toml``
run from the repository root writes ``results/tiny`` there, where ``plot`` and
``cost`` read it; a dataset ``path`` is relative to the study file (the study
names its input data wherever it is run from). Both become absolute when the
file is loaded.

Plans, policies and compressions are crossed; combinations the library cannot run (BNS
sampling on ``dense-bcast``, SANCUS caching on ``p2p``) are listed as
skipped with the reason. A policy is ``exact``, one policy spec, or a
sampling and a staleness spec joined by ``+``. Compression (``compress``, the values of
``train --compress``: ``none``, ``fp16``, ``bf16``, ``int8[:stochastic][,feedback]``) is a third axis:
study-wide, ``compress`` is crossed with every plan and policy; a policy entry written as a table
(``{ policy = "...", plans = [...], compress = [...] }``) runs on those plans and compressions only,
so a study can list exactly the configurations it compares (fp16 on exact p2p, without fp16 on every
sampling policy). An entry may also carry its own ``train`` options with a ``name`` for them, a *variant*:
``{ policy = "exact", plans = ["p2p"], name = "minibatch", train = { mode = "minibatch", fanouts = "15,10,5",
batch-size = 1024 } }`` races mini-batch training against the full-graph runs of the same study (the entry's
options follow ``[train]``, so they win; the run id gains ``_minibatch``, ``results.csv`` has ``variant`` and
``mode``, and a variant is never the exact run the default target is taken from). Two entries that give the same (plan, policy, compression) are refused. A run's id
gains ``_<compression>`` where it is not ``none`` (``..._p2p_exact_int8_feedback_s0``), so the ids of
uncompressed runs are what they were; ``results.csv`` has a ``compress`` column and ``policy`` stays the
sampling + staleness text. With a ``[network]`` table each run
is launched through ``sparse-dist emulate`` (hydra ``mpiexec`` only), once per
bandwidth; its run id ends in ``_bw<bandwidth>`` and its results record the network.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from algorithms.policies import PolicySpec
from runners.emulate.network import parse_bandwidth, parse_latency
from runners.study.datasets import DatasetSpec, parse_dataset
from runners.study.tables import StudyError, expect, int_list, str_list, unknown_keys
from runners.study.train_table import check_train_table
from sparse_dist.compress import Codec
from runners.perf.grid_model import is_grid_plan, parse_grid_plan
from runners.study.plans import grid_misfit, plan_refusal
from sparse_dist.plans import PLAN_NAMES

STUDY_KEYS = {"name", "output", "scaling", "ranks", "replication", "plans", "policies", "compress", "seeds",
              "epochs", "warmup", "timeout", "launcher", "launcher_args", "target_acc", "overwrite"}
POLICY_ENTRY_KEYS = {"policy", "plans", "compress", "name", "train"}
NETWORK_KEYS = {"nodes", "ranks_per_node", "bandwidth", "latency"}
LAUNCHERS = ("auto", "mpiexec", "srun")
TRAIN_FLAGS_SET_BY_STUDY = {"data", "out", "plan", "replication", "sample", "stale", "compress", "seed", "epochs"}


@dataclass(frozen=True)
class NetworkSpec:
    """The ``[network]`` table: the emulated cluster every run goes over, one run per bandwidth."""

    bandwidths: list[str]
    ranks_per_node: int = 1
    nodes: int | None = None
    latency: str | None = None

    def nodes_for(self, ranks: int) -> int | None:
        """Emulated nodes of a run with ``ranks`` ranks; None if the table's node count does not fit."""
        if ranks % self.ranks_per_node:
            return None
        nodes = ranks // self.ranks_per_node
        return nodes if self.nodes is None or self.nodes == nodes else None

    def misfit(self, ranks: int) -> str:
        if self.nodes is not None:
            return f"[network] has {self.nodes} node(s) x {self.ranks_per_node} rank(s), not {ranks} ranks"
        return f"not a multiple of [network] ranks_per_node = {self.ranks_per_node}"


@dataclass(frozen=True)
class PolicyEntry:
    """One ``policies`` entry: a policy and, where the entry is a table, the plans and compressions it is
    limited to (None: every plan of the study, the study's ``compress``)."""

    policy: PolicySpec  # parsed once, by the parser `train --sample/--stale` uses
    plans: tuple[str, ...] | None = None
    compress: tuple[str, ...] | None = None
    name: str = ""      # a variant's label (with ``train``): run ids, results.csv's ``variant``, plot lines
    train: tuple[tuple[str, Any], ...] = ()  # this entry's own `train` options, after the study's [train]


@dataclass(frozen=True)
class Run:
    """One training job of the study (``bandwidth``: the emulated network's, None without ``[network]``)."""

    dataset: DatasetSpec
    nodes: int | None
    ranks: int
    replication: int
    plan: str
    policy: str
    sample: str
    stale: str
    seed: int
    bandwidth: str | None = None
    compress: str = "none"  # `train --compress`
    variant: str = ""       # the policy entry's name, where it has its own `train` options
    variant_train: tuple[tuple[str, Any], ...] = ()

    @property
    def data_name(self) -> str:
        return self.dataset.name if self.nodes is None else f"{self.dataset.name}-n{self.nodes}"

    @property
    def run_id(self) -> str:
        policy = re.sub(r"[^A-Za-z0-9.=-]+", "_", self.policy if self.compress == "none"
                        else f"{self.policy}_{self.compress}")
        network = "" if self.bandwidth is None else f"_bw{self.bandwidth}"
        variant = f"_{self.variant}" if self.variant else ""
        plan = self.plan.replace(":", "-").replace(",", "x")  # grid:2,2,1 -> grid-2x2x1
        return (f"{self.data_name}_P{self.ranks}_c{self.replication}_{plan}_{policy}{variant}_s{self.seed}"
                f"{network}")


@dataclass
class Study:
    """A parsed study file."""

    source: Path
    name: str
    output: Path
    scaling: str
    ranks: list[int]
    replication: list[int]
    plans: list[str]
    policies: list[PolicyEntry]
    seeds: list[int]
    epochs: int
    warmup: int
    timeout: float
    launcher: str
    launcher_args: list[str]
    train: dict[str, Any]
    datasets: list[DatasetSpec]
    network: NetworkSpec | None = None
    target_acc: float | None = None  # results.csv's time-to-target; None: runners.study.collect's default
    compress: list[str] = field(default_factory=lambda: ["none"])
    overwrite: bool = False  # the sweep may write into an output it did not mark as its own (runners.study.output)

    def configurations(self) -> list[tuple[str, PolicySpec, str]]:
        """Every (plan, policy, compression) the study crosses, in run order, refused combinations included."""
        return [(plan, policy, compress) for plan, policy, compress, _ in self.entry_configurations()]

    def entry_configurations(self) -> list[tuple[str, PolicySpec, str, PolicyEntry]]:
        """:meth:`configurations`, each with the policy entry it came from (its variant name and options)."""
        return [(plan, entry.policy, compress, entry) for plan in self.plans for entry in self.policies
                if entry.plans is None or plan in entry.plans
                for compress in (entry.compress if entry.compress is not None else self.compress)]

    def epochs_for(self, dataset: DatasetSpec) -> int:
        """Epochs of a run on ``dataset``: its own ``epochs`` where set, else the study's."""
        return dataset.epochs if dataset.epochs is not None else self.epochs

    def runs(self) -> tuple[list[Run], list[str]]:
        """Every run in a fixed order, and a line for each combination skipped (with the reason)."""
        runs: list[Run] = []
        skipped: list[str] = []
        for dataset in self.datasets:
            for ranks in self.ranks:
                nodes = dataset.nodes_for(ranks, self.scaling)
                for c in self.replication:
                    if ranks % c:
                        skipped.append(f"P={ranks} c={c}: c does not divide P")
                        continue
                    if self.network is not None and self.network.nodes_for(ranks) is None:
                        if dataset is self.datasets[0] and c == self.replication[0]:
                            skipped.append(f"P={ranks}: {self.network.misfit(ranks)}")
                        continue
                    bandwidths = self.network.bandwidths if self.network is not None else [None]
                    for plan, policy, compress, entry in self.entry_configurations():
                        misfit = grid_misfit(plan, ranks, c)
                        if misfit:
                            line = f"P={ranks} c={c} {plan}: {misfit}"
                            if dataset is self.datasets[0] and line not in skipped:
                                skipped.append(line)
                            continue
                        problem = plan_refusal(plan, policy, compress)
                        if problem:
                            line = f"{plan} + {policy}: {problem}"
                            if ranks == self.ranks[0] and c == self.replication[0] and line not in skipped:
                                skipped.append(line)
                            continue
                        runs.extend(Run(dataset, nodes, ranks, c, plan, policy.text, str(policy.sample),
                                        str(policy.stale), seed, bandwidth, compress, entry.name, entry.train)
                                    for bandwidth in bandwidths for seed in self.seeds)
        return runs, skipped

    def parts_for(self, dataset: DatasetSpec) -> int:
        """Shards a prepared synthetic dataset gets: every row-group count P/c of the study divides it."""
        if dataset.parts is not None:
            return dataset.parts
        groups = [p // c for p in self.ranks for c in self.replication if p % c == 0]
        return math.lcm(*groups) if groups else 1

    @property
    def runs_dir(self) -> Path:
        return self.output / "runs"

    @property
    def data_dir(self) -> Path:
        return self.output / "data"

    def results_file(self, run: Run) -> Path:
        return self.runs_dir / f"{run.run_id}.jsonl"

    def log_file(self, run: Run) -> Path:
        return self.runs_dir / f"{run.run_id}.log"

    def prepared_dir(self, run: Run) -> Path:
        if run.dataset.path is not None:
            return run.dataset.path
        return self.data_dir / run.data_name


def _compressions(where: str, value: Any) -> tuple[str, ...]:
    """A ``compress`` list, each value checked by ``train --compress``'s own parser and written as it prints."""
    found: list[str] = []
    for text in str_list(where, value):
        try:
            codec = Codec.parse(text)
        except ValueError as exc:
            raise StudyError(f"{where}: {exc}") from None
        name = "none" if codec is None else str(codec)
        if name in found:
            raise StudyError(f"{where}: each compression once, found {text!r} twice")
        found.append(name)
    return tuple(found)


def _policy_entries(path: Path, value: Any, plans: list[str]) -> list[PolicyEntry]:
    """``study.policies``: policy texts, or tables ``{ policy, plans, compress }`` (see the module docstring)."""
    where = f"{path}: study.policies"
    items = value if isinstance(value, list) else [value]
    if not items:
        raise StudyError(f"{where}: expected a non-empty list of policies, found {value!r}")
    entries: list[PolicyEntry] = []
    for index, item in enumerate(items):
        table = item if isinstance(item, dict) else {"policy": item}
        spot = where if not isinstance(item, dict) else f"{where}[{index}]"
        unknown_keys(spot, table, POLICY_ENTRY_KEYS)
        text = expect(f"{spot}.policy" if isinstance(item, dict) else spot, table.get("policy"), str,
                       "a policy such as 'exact' or 'bns:p=0.1' (or a table with policy, plans, compress)")
        try:
            policy = PolicySpec.parse(text)
        except ValueError as exc:
            raise StudyError(f"{where}: {exc}") from None
        only = None
        if "plans" in table:
            only = tuple(str_list(f"{spot}.plans", table["plans"]))
            stray = [plan for plan in only if plan not in plans]
            if stray:
                raise StudyError(f"{spot}.plans: {stray} not in study.plans {plans}")
        codecs = _compressions(f"{spot}.compress", table["compress"]) if "compress" in table else None
        name, options = _variant(spot, table)
        entries.append(PolicyEntry(policy, only, codecs, name, options))
    return entries


def _variant(spot: str, table: dict[str, Any]) -> tuple[str, tuple[tuple[str, Any], ...]]:
    """A policy entry's ``name`` and ``train`` options: both or neither (the name tells its runs apart)."""
    if ("name" in table) != ("train" in table):
        raise StudyError(f"{spot}: give 'name' and 'train' together (a variant's label and its own train options, "
                         f"e.g. name = \"minibatch\", train = {{ mode = \"minibatch\", fanouts = \"15,10,5\" }})")
    if "name" not in table:
        return "", ()
    name = expect(f"{spot}.name", table["name"], str, "a name")
    if not re.fullmatch(r"[A-Za-z0-9.-]+", name):
        raise StudyError(f"{spot}.name: use letters, digits, '.' or '-', found {name!r}")
    options = expect(f"{spot}.train", table["train"], dict, "a table of `train` options")
    clash = sorted(set(k.replace("-", "_") for k in options) & TRAIN_FLAGS_SET_BY_STUDY)
    if clash:
        raise StudyError(f"{spot}.train sets {clash}, which the study itself decides per run")
    return name, tuple(options.items())


def _network(path: Path, table: Any) -> NetworkSpec:
    where = f"{path}: [network]"
    expect(where, table, dict, "a table")
    unknown_keys(where, table, NETWORK_KEYS)
    bandwidths = str_list(f"{where}.bandwidth", table.get("bandwidth"))
    for bandwidth in bandwidths:
        try:
            parse_bandwidth(bandwidth)
        except ValueError as exc:
            raise StudyError(f"{where}.bandwidth: {exc}") from None
    if len(set(bandwidths)) != len(bandwidths):
        raise StudyError(f"{where}.bandwidth: each bandwidth once, found {bandwidths!r}")
    latency = table.get("latency")
    if latency is not None:
        try:
            parse_latency(expect(f"{where}.latency", latency, str, "a delay such as '50us'"))
        except ValueError as exc:
            raise StudyError(f"{where}.latency: {exc}") from None
    nodes = table.get("nodes")
    return NetworkSpec(bandwidths=bandwidths,
                       ranks_per_node=int_list(f"{where}.ranks_per_node", table.get("ranks_per_node", 1), 1)[0],
                       nodes=None if nodes is None else int_list(f"{where}.nodes", nodes, 1)[0], latency=latency)


def load_study(path: str | Path) -> Study:
    """Parse and check a study file; every problem names the file and the field."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise StudyError(f"{path}: study file not found") from None
    except UnicodeDecodeError as exc:
        raise StudyError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                         f"a study file is TOML in UTF-8") from None
    except tomllib.TOMLDecodeError as exc:
        raise StudyError(f"{path}: not valid TOML ({exc})") from None
    unknown_keys(str(path), document, {"study", "train", "dataset", "network"})
    study = expect(f"{path}: [study]", document.get("study"), dict, "a [study] table")
    unknown_keys(f"{path}: [study]", study, STUDY_KEYS)
    name = expect(f"{path}: study.name", study.get("name", path.stem), str, "a name")
    scaling = study.get("scaling", "strong")
    if scaling not in ("strong", "weak"):
        raise StudyError(f"{path}: study.scaling: expected 'strong' or 'weak', found {scaling!r}")
    plans = str_list(f"{path}: study.plans", study.get("plans", ["p2p"]))
    for plan in plans:
        if is_grid_plan(plan):
            try:
                parse_grid_plan(plan)
            except ValueError as exc:
                raise StudyError(f"{path}: study.plans: {exc}") from None
        elif plan not in PLAN_NAMES:
            raise StudyError(f"{path}: study.plans: unknown plan {plan!r}; expected some of {PLAN_NAMES} or "
                             f"grid:X,Y,Z or grid:auto (the process grid, `train --grid`)")
    compress = _compressions(f"{path}: study.compress", study.get("compress", ["none"]))
    policies = _policy_entries(path, study.get("policies", ["exact"]), plans)
    launcher = study.get("launcher", "auto")
    if launcher not in LAUNCHERS:
        raise StudyError(f"{path}: study.launcher: expected one of {LAUNCHERS}, found {launcher!r}")
    epochs = int_list(f"{path}: study.epochs", study.get("epochs", 10), 1)[0]
    warmup = int_list(f"{path}: study.warmup", study.get("warmup", 1), 0)[0]
    if warmup >= epochs:
        raise StudyError(f"{path}: study.warmup ({warmup}) must be below study.epochs ({epochs})")
    train = document.get("train", {})
    expect(f"{path}: [train]", train, dict, "a table")
    clash = sorted(set(k.replace("-", "_") for k in train) & TRAIN_FLAGS_SET_BY_STUDY)
    if clash:
        raise StudyError(f"{path}: [train] sets {clash}, which the study itself decides per run")
    tables = document.get("dataset")
    if not isinstance(tables, list) or not tables:
        raise StudyError(f"{path}: expected at least one [[dataset]] table")
    datasets = [parse_dataset(path, i, table, scaling) for i, table in enumerate(tables)]
    if len({d.name for d in datasets}) != len(datasets):
        raise StudyError(f"{path}: dataset names must be distinct")
    for index, dataset in enumerate(datasets):
        if dataset.epochs is not None and warmup >= dataset.epochs:
            raise StudyError(f"{path}: dataset[{index}].epochs ({dataset.epochs}) must be above study.warmup "
                             f"({warmup})")
    output = Path(expect(f"{path}: study.output", study.get("output", f"results/{name}"), str, "a directory"))
    timeout = study.get("timeout", 1800)
    expect(f"{path}: study.timeout", timeout, (int, float), "seconds")
    network = _network(path, document["network"]) if "network" in document else None
    target_acc = study.get("target_acc")
    if target_acc is not None and (isinstance(target_acc, bool) or not isinstance(target_acc, (int, float))
                                   or not 0 < target_acc <= 1):
        raise StudyError(f"{path}: study.target_acc: expected a validation accuracy in (0, 1], found {target_acc!r}")
    if network is not None and (launcher == "srun" or study.get("launcher_args")):
        raise StudyError(f"{path}: [network] runs go through `sparse-dist emulate`, which launches hydra's mpiexec "
                         f"itself; leave study.launcher at auto or mpiexec and study.launcher_args empty")
    parsed = Study(source=path, name=name,
                   output=output if output.is_absolute() else Path(os.path.normpath(Path.cwd() / output)),
                   scaling=scaling, ranks=int_list(f"{path}: study.ranks", study.get("ranks", [1]), 1),
                   replication=int_list(f"{path}: study.replication", study.get("replication", [1]), 1),
                   plans=plans, policies=policies, seeds=int_list(f"{path}: study.seeds", study.get("seeds", [0]), 0),
                   epochs=epochs, warmup=warmup, timeout=float(timeout), launcher=launcher,
                   launcher_args=str_list(f"{path}: study.launcher_args", study["launcher_args"])
                   if study.get("launcher_args") else [],
                   train=dict(train), datasets=datasets, network=network,
                   target_acc=float(target_acc) if target_acc is not None else None, compress=list(compress),
                   overwrite=expect(f"{path}: study.overwrite", study.get("overwrite", False), bool, "true or false"))
    configurations = parsed.entry_configurations()
    seen: set[tuple[str, str, str, str]] = set()
    for plan, policy, codec, entry in configurations:
        if (plan, policy.text, codec, entry.name) in seen:
            named = f", name {entry.name}" if entry.name else ""
            raise StudyError(f"{path}: study.policies: plan {plan}, policy {policy.text}, compress {codec}{named} "
                             f"comes from two entries; list each configuration once")
        seen.add((plan, policy.text, codec, entry.name))
    runs, _ = parsed.runs()
    data_dirs = sorted({parsed.prepared_dir(run) for run in runs}) or [parsed.data_dir]
    problem = check_train_table(train, configurations, data_dirs)
    if problem:
        raise StudyError(f"{path}: {problem}")
    return parsed
