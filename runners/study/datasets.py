"""The ``[[dataset]]`` tables of a study file: a prepared directory (``path``), or what the sweep prepares
(``synthetic``, ``planetoid``, ``rmat``), and how each is partitioned (:class:`DatasetSpec`)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners.argtypes import FLAG_RANGES
from runners.study.tables import StudyError, expect, int_list, unknown_keys

DATASET_KEYS = {"name", "path", "synthetic", "planetoid", "rmat", "partitioner", "parts", "nodes_per_rank", "sizes", "seed",
                "epochs"}
PLANETOID_KEYS = {"name", "root"}
SYNTHETIC_KEYS = {"nodes", "degree", "features", "classes", "homophily"}
"""A ``synthetic`` table's keys, ``prepare synthetic``'s flags; ``homophily`` (a share) makes it the stochastic block
model (:mod:`runners.data.sbm`), the others are positive integers."""
RMAT_KEYS = {"scale": "--scale", "edge_factor": "--edge-factor", "features": "--features", "classes": "--classes"}
"""An ``rmat`` table's keys and the ``prepare rmat`` flags they become (ranges: :data:`FLAG_RANGES`)."""


@dataclass(frozen=True)
class DatasetSpec:
    """Where one dataset of the study comes from."""

    name: str
    path: Path | None = None
    synthetic: dict[str, float] = field(default_factory=dict)
    planetoid: dict[str, str] = field(default_factory=dict)  # prepare planetoid's --name and --root
    rmat: dict[str, int] = field(default_factory=dict)  # prepare rmat's --scale, --edge-factor, ... (RMAT_KEYS)
    partitioner: str = "metis"
    parts: int | None = None
    nodes_per_rank: int | None = None
    sizes: dict[int, int] = field(default_factory=dict)
    seed: int = 0
    epochs: int | None = None  # None: the study's epochs

    def nodes_for(self, ranks: int, scaling: str) -> int | None:
        """Node count of the run with ``ranks`` ranks where the sweep sizes the graph by ``P``: a synthetic
        graph, or an R-MAT graph under weak scaling (``2^(scale + log2 P)`` vertices: ``scale`` is the graph of
        one rank, so vertices and edges per rank stay fixed; ``P`` must be a power of two). None for a prepared
        directory, Planetoid, or R-MAT under strong scaling (its size is its scale)."""
        if self.rmat and scaling == "weak":
            if ranks < 1 or ranks & (ranks - 1):
                raise StudyError(f"dataset {self.name!r}: weak scaling of an R-MAT graph doubles its vertices with "
                                 f"P, so P must be a power of two, not {ranks}")
            return 2 ** (int(self.rmat["scale"]) + ranks.bit_length() - 1)
        if self.path is not None or self.planetoid or self.rmat:
            return None
        if scaling == "weak":
            if ranks in self.sizes:
                return self.sizes[ranks]
            if self.nodes_per_rank is None:
                raise StudyError(f"dataset {self.name!r}: weak scaling needs nodes_per_rank or sizes[{ranks}]")
            return self.nodes_per_rank * ranks
        return int(self.synthetic["nodes"])


def _planetoid(path: Path, where: str, table: dict[str, Any], scaling: str, epochs: int | None) -> DatasetSpec:
    """A ``planetoid = { name, root }`` dataset: prepared by the sweep (``prepare planetoid``); ``root`` is
    relative to the study file, and without it ``name`` must be the built-in ``cora``."""
    if scaling == "weak":
        raise StudyError(f"{where}: weak scaling needs a synthetic dataset (one size per P), not planetoid")
    planetoid = expect(f"{where}.planetoid", table["planetoid"], dict, "a table")
    unknown_keys(f"{where}.planetoid", planetoid, PLANETOID_KEYS)
    settings = {key: expect(f"{where}.planetoid.{key}", value, str, "a string") for key, value in planetoid.items()}
    if not re.fullmatch(r"[a-z]+", settings.get("name", "")):
        raise StudyError(f"{where}.planetoid.name: expected a Planetoid name such as cora, citeseer or pubmed")
    if "root" in settings:
        root = Path(settings["root"])
        settings["root"] = str(root if root.is_absolute() else Path(os.path.normpath(path.parent / root)))
    elif settings["name"] != "cora":
        raise StudyError(f"{where}.planetoid: {settings['name']} needs root = the directory of its ind.* files "
                         f"(only cora is built in)")
    parts = table.get("parts")
    if parts is not None:
        int_list(f"{where}.parts", parts, 1)
    return DatasetSpec(name=expect(f"{where}.name", table.get("name"), str, "a name"), planetoid=settings,
                       partitioner=table.get("partitioner", "metis"), parts=parts, seed=int(table.get("seed", 0)),
                       epochs=epochs)


def _rmat(where: str, table: dict[str, Any], scaling: str, epochs: int | None) -> DatasetSpec:
    """An ``rmat = { scale, edge_factor, features, classes }`` dataset: prepared by the sweep (``prepare rmat``),
    each value in its flag's range (:data:`runners.argtypes.FLAG_RANGES`), ``scale`` required. Under weak
    scaling ``scale`` is the graph of one rank: the run at ``P`` ranks gets ``scale + log2 P``
    (:meth:`DatasetSpec.nodes_for`)."""
    rmat = expect(f"{where}.rmat", table["rmat"], dict, "a table")
    unknown_keys(f"{where}.rmat", rmat, set(RMAT_KEYS))
    if "scale" not in rmat:
        raise StudyError(f"{where}.rmat.scale: expected the R-MAT scale (2^scale vertices), found none")
    for key, value in rmat.items():
        limit = FLAG_RANGES["prepare"][RMAT_KEYS[key]]
        if not isinstance(value, int) or isinstance(value, bool) or not limit.low <= value <= limit.high:
            raise StudyError(f"{where}.rmat.{key}: expected an integer in {limit.interval()} ({limit.why}), "
                             f"found {value!r}")
    parts = table.get("parts")
    if parts is not None:
        int_list(f"{where}.parts", parts, 1)
    return DatasetSpec(name=expect(f"{where}.name", table.get("name"), str, "a name"), rmat=dict(rmat),
                       partitioner=table.get("partitioner", "auto"),  # prepare rmat's: metis-train parts=parts, seed=int(table.get("seed", 0)),
                       epochs=epochs)


def parse_dataset(path: Path, index: int, table: Any, scaling: str) -> DatasetSpec:
    where = f"{path}: dataset[{index}]"
    expect(where, table, dict, "a table")
    unknown_keys(where, table, DATASET_KEYS)
    name = expect(f"{where}.name", table.get("name"), str, "a name")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise StudyError(f"{where}.name: use letters, digits, '.', '_' or '-', found {name!r}")
    has_path, has_synthetic = "path" in table, "synthetic" in table
    if has_path + has_synthetic + ("planetoid" in table) + ("rmat" in table) != 1:
        raise StudyError(f"{where}: give exactly one of 'path' (a prepared directory), 'synthetic', 'planetoid' "
                         f"or 'rmat'")
    sizes: dict[int, int] = {}
    for key, value in (table.get("sizes") or {}).items():
        if not key.isdigit() or not isinstance(value, int) or value < 1:
            raise StudyError(f"{where}.sizes: expected {{\"P\" = nodes}} with positive integers, found {key}={value!r}")
        sizes[int(key)] = value
    epochs = int_list(f"{where}.epochs", table["epochs"], 1)[0] if "epochs" in table else None
    if has_path:
        if scaling == "weak":
            raise StudyError(f"{where}: weak scaling needs a synthetic dataset (one size per P), not a path")
        directory = Path(expect(f"{where}.path", table["path"], str, "a directory"))
        return DatasetSpec(name=name, path=directory if directory.is_absolute()
                           else Path(os.path.normpath(path.parent / directory)), epochs=epochs)
    if "planetoid" in table:
        return _planetoid(path, where, table, scaling, epochs)
    if "rmat" in table:
        return _rmat(where, table, scaling, epochs)
    synthetic = expect(f"{where}.synthetic", table["synthetic"], dict, "a table")
    unknown_keys(f"{where}.synthetic", synthetic, SYNTHETIC_KEYS)
    for key, value in synthetic.items():
        if key == "homophily":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise StudyError(f"{where}.synthetic.homophily: expected a share in [0, 1], found {value!r}")
        else:
            expect(f"{where}.synthetic.{key}", value, int, "a positive integer")
    if scaling == "strong" and "nodes" not in synthetic:
        raise StudyError(f"{where}.synthetic.nodes: strong scaling needs the node count")
    parts = table.get("parts")
    if parts is not None:
        int_list(f"{where}.parts", parts, 1)
    return DatasetSpec(name=name, synthetic=dict(synthetic), partitioner=table.get("partitioner", "metis"),
                       parts=parts, nodes_per_rank=table.get("nodes_per_rank"), sizes=sizes,
                       seed=int(table.get("seed", 0)), epochs=epochs)
