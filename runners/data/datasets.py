"""Whole-graph datasets as ``prepare`` reads them: the planted-class generator, edge lists, OGB (Planetoid files:
:mod:`runners.data.planetoid`).

A :class:`GraphData` is held by the single ``prepare`` process only; training
ranks read shards (:mod:`runners.data.shards`).
"""

from __future__ import annotations

import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from runners.data.part_checks import npy_header, plain
from runners.data.synthetic import synthetic_rows


class DatasetError(ValueError):
    """Input data in the wrong format; the message names the file and what was expected."""


@dataclass
class GraphData:
    """A whole graph: adjacency (N x N, rows aggregate from columns), node data, splits."""

    name: str
    adjacency: sp.csr_matrix
    features: np.ndarray          # N x F float32, or float64 when the input was (kept in the shards)
    labels: np.ndarray            # N int64 class ids, or N x C {0,1} for multi-label
    masks: dict[str, np.ndarray]  # train / val / test -> bool N
    num_classes: int
    multilabel: bool = False
    meta_extra: dict = field(default_factory=dict)  # written into meta.json (e.g. the OGB name and metric)

    @property
    def num_nodes(self) -> int:
        return self.adjacency.shape[0]


def planted_classes(nodes: int = 50_000, classes: int = 8, degree: int = 10, features: int = 128,
                    community_size: int = 500, mixing: float = 0.05, label_noise: float = 0.3, words: int = 20,
                    signal: float = 0.15, train: float = 0.1, val: float = 0.1, test: float = 0.3,
                    seed: int = 0) -> GraphData:
    """A clustered synthetic graph whose classes are planted in both structure and features.

    Communities of ``community_size`` contiguous nodes (edges leave their
    community with probability ``mixing``; the graph is symmetrised) carry
    class ``community % classes``; a node takes a uniformly random class
    instead with probability ``label_noise``. Features are bag-of-words: each
    node draws ``words`` words, each from its own class's ``features /
    classes`` words with probability ``signal`` and uniformly otherwise. So
    the graph gives the community's class, only the (weak) features tell a
    relabelled node apart, and accuracy stays below 100%. With contiguous
    partitions (``block``) the boundary is small, as after a good partitioner.
    Splits are uniform random with the given fractions.
    """
    if classes < 2 or features < classes or not 0 < train and train + val + test <= 1:
        raise ValueError(f"planted_classes: need classes >= 2, features >= classes, 0 < train, "
                         f"train + val + test <= 1; got {classes=}, {features=}, {train=}, {val=}, {test=}")
    rng = np.random.default_rng(seed)
    directed = synthetic_rows("clustered", 0, nodes, nodes, degree, seed=seed,
                              community_size=community_size, mixing=mixing)
    adjacency = ((directed + directed.T) > 0).astype(np.float32).tocsr()
    adjacency.setdiag(0)
    adjacency.eliminate_zeros()
    labels = ((np.arange(nodes) // community_size) % classes).astype(np.int64)
    relabelled = rng.random(nodes) < label_noise
    labels[relabelled] = rng.integers(0, classes, size=int(relabelled.sum()))
    feature_matrix = bag_of_words(labels, classes, features, words, signal, rng)
    draw = rng.random(nodes)
    masks = {"train": draw < train, "val": (draw >= train) & (draw < train + val),
             "test": (draw >= train + val) & (draw < train + val + test)}
    return GraphData(name=f"planted-{nodes}", adjacency=adjacency, features=feature_matrix, labels=labels,
                     masks=masks, num_classes=classes)


def bag_of_words(labels: np.ndarray, classes: int, features: int, words: int, signal: float,
                 rng: np.random.Generator) -> np.ndarray:
    """Word counts (``nodes x features``, float32): each node draws ``words`` words, each from its class's own
    ``features / classes`` words with probability ``signal`` and uniformly otherwise."""
    nodes = labels.size
    block = features // classes
    own = labels[:, None] * block + rng.integers(0, block, size=(nodes, words))
    anywhere = rng.integers(0, features, size=(nodes, words))
    chosen = np.where(rng.random((nodes, words)) < signal, own, anywhere)
    counts = np.zeros((nodes, features), dtype=np.float32)
    np.add.at(counts, (np.repeat(np.arange(nodes), words), chosen.ravel()), 1.0)
    return counts


def feature_dtype(features: np.ndarray) -> type:
    """The dtype features are stored in: float64 stays float64 (``train --dtype float64`` then sees the
    input's values bitwise), anything else (float32, float16, integers, bool) becomes float32."""
    return np.float64 if features.dtype == np.float64 else np.float32


def _load_array(path: Path, what: str) -> np.ndarray:
    """A user's numeric array (``.npy``, single-array ``.npz`` or integer text), its ``.npy`` header checked
    before any data is read (:func:`runners.data.part_checks.npy_header`: no allocation from a claimed size,
    no objects) and its dtype numeric; anything else is one :class:`DatasetError` naming the file."""
    if not path.is_file():
        raise DatasetError(f"{path}: {what} file not found")
    try:
        if path.suffix == ".npz":
            with zipfile.ZipFile(path) as archive:
                members = archive.infolist()
                if len(members) != 1:
                    raise DatasetError(f"{path}: expected one array in the .npz, found "
                                       f"{[m.filename.removesuffix('.npy') for m in members]}")
                if members[0].compress_type == zipfile.ZIP_STORED and members[0].file_size > path.stat().st_size:
                    raise DatasetError(f"{path}: its member claims {members[0].file_size} bytes, more than the file")
                with archive.open(members[0]) as member:
                    problem, _, dtype = npy_header(member, members[0].file_size)
                    if not problem and members[0].compress_type == zipfile.ZIP_STORED:
                        member.seek(0)
                        array = np.lib.format.read_array(member, allow_pickle=False)
                    elif not problem:
                        raise DatasetError(f"{path}: a compressed .npz; save it with np.savez or np.save")
        elif path.suffix == ".npy":
            with open(path, "rb") as handle:
                problem, _, dtype = npy_header(handle, path.stat().st_size)
                if not problem:
                    handle.seek(0)
                    array = np.lib.format.read_array(handle, allow_pickle=False)
        else:
            return np.loadtxt(path, dtype=np.int64, comments="#", ndmin=2)
    except DatasetError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DatasetError(f"{path}: cannot read {what} ({str(exc).splitlines()[0] if str(exc) else exc!r})") from None
    if problem:
        raise DatasetError(f"{path}: {what} {problem}")
    if not plain(dtype, "biuf"):
        raise DatasetError(f"{path}: {what} of type {dtype}, expected numbers (integers, floats or booleans)")
    return array


def check_class_ids(y: np.ndarray, path: Path, num_classes: int | None) -> int:
    """The number of classes of 1-D class ids ``y`` read from ``path``; refuses ids that do not fit.

    With ``num_classes`` C the ids must lie in ``0..C-1`` (a class may be absent). Without it C is the
    number of distinct ids, which must then be exactly ``0..C-1``: ids 0, 1, 2, 3, 99 are refused
    rather than taken as 100 classes, 95 of them empty.
    """
    if not np.issubdtype(y.dtype, np.integer):
        raise DatasetError(f"{path}: class labels must be integers, got {y.dtype}")
    negative = np.flatnonzero(y < 0)
    if negative.size:
        node = int(negative[0])
        raise DatasetError(f"{path}: node {node} has class id {int(y[node])}; class ids must be 0 or more "
                           f"({negative.size} negative id(s))")
    if num_classes is not None:
        if num_classes < 1:
            raise DatasetError(f"--num-classes must be at least 1, got {num_classes}")
        limit, why = num_classes, f"--num-classes {num_classes} means classes 0..{num_classes - 1}"
    else:
        limit = int(np.unique(y).size) if y.size else 1
        why = f"the file's {limit} distinct id(s) imply classes 0..{limit - 1}"
    outside = np.flatnonzero(y >= limit)
    if outside.size:
        node, value = int(outside[0]), int(y[outside[0]])
        hint = (f"; pass --num-classes {int(y.max()) + 1} if {value} is meant" if num_classes is None
                else f"; pass --num-classes {int(y.max()) + 1} or more")
        raise DatasetError(f"{path}: node {node} has class id {value}, but {why} "
                           f"({outside.size} node(s) outside){hint}")
    return limit


def load_edge_list(edges: str | Path, features: str | Path, labels: str | Path, *,
                   masks: str | Path | None = None, split: tuple[float, float, float] = (0.1, 0.1, 0.8),
                   symmetrize: bool = False, seed: int = 0, name: str | None = None,
                   num_classes: int | None = None) -> GraphData:
    """A user's graph: edges ``src dst`` (text, ``.npy`` or single-array ``.npz``), features and labels.

    Edge ``(u, v)`` means node ``u`` aggregates from ``v`` (row ``u``, column
    ``v`` of ``A``). Decisions: duplicate edges collapse to one edge of weight
    1; self-loops are dropped (GCN adds its own); ``symmetrize`` adds every
    reverse edge. ``masks`` is an ``.npz`` with boolean ``train``, ``val``,
    ``test`` arrays; without it a seeded uniform split by ``split``
    fractions is drawn. Labels (``.npy``, ``.npz`` or text) are class ids,
    one per node (a text file: one id per line), or a nodes x classes 0/1
    matrix (multi-label; ``.npy``/``.npz``, or text with several columns);
    class ids are checked by :func:`check_class_ids` against ``num_classes``.
    """
    edges, features, labels = Path(edges), Path(features), Path(labels)
    x = _load_array(features, "features")
    if x.ndim != 2:
        raise DatasetError(f"{features}: features must be a 2-D array (nodes x width), got shape {x.shape}")
    n = x.shape[0]
    if not np.all(np.isfinite(x)):
        raise DatasetError(f"{features}: features contain non-finite values")
    pairs = _load_array(edges, "edges")
    if pairs.ndim != 2 or pairs.shape[1] != 2 or not np.issubdtype(pairs.dtype, np.integer):
        raise DatasetError(f"{edges}: edges must be integer pairs (E x 2), got {pairs.dtype} of shape {pairs.shape}")
    if pairs.size and (pairs.min() < 0 or pairs.max() >= n):
        raise DatasetError(f"{edges}: node ids must lie in [0, {n}) (the rows of {features.name}), "
                           f"found [{pairs.min()}, {pairs.max()}]")
    y = _load_array(labels, "labels")
    if labels.suffix not in (".npy", ".npz") and y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]  # a text file of one class id per line
    if y.shape[0] != n or y.ndim not in (1, 2):
        raise DatasetError(f"{labels}: expected {n} labels (one per feature row), got shape {y.shape}")
    multilabel = y.ndim == 2
    if multilabel:
        if not np.isin(y, (0, 1)).all():
            raise DatasetError(f"{labels}: a 2-D label array must hold only 0 and 1 (multi-label)")
        if num_classes is not None and num_classes != y.shape[1]:
            raise DatasetError(f"{labels}: a multi-label array of {y.shape[1]} columns, but --num-classes "
                               f"{num_classes}; expected one column per class")
        num_classes = y.shape[1]
        y = y.astype(np.float32)
    else:
        num_classes = check_class_ids(y, labels, num_classes)
        y = y.astype(np.int64)
    src, dst = pairs[:, 0], pairs[:, 1]
    if symmetrize:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    keep = src != dst
    adjacency = sp.csr_matrix((np.ones(int(keep.sum()), dtype=np.float32), (src[keep], dst[keep])), shape=(n, n))
    adjacency.data[:] = 1.0  # duplicates were summed: collapse to weight 1
    if masks is not None:
        if not Path(masks).is_file():
            raise DatasetError(f"{masks}: masks file not found; expected an .npz with boolean train, val, test")
        with np.load(Path(masks), allow_pickle=False) as archive:
            missing = [k for k in ("train", "val", "test") if k not in archive.files]
            if missing:
                raise DatasetError(f"{masks}: missing mask arrays {missing}")
            split_masks = {k: archive[k].astype(bool) for k in ("train", "val", "test")}
        bad = [k for k, m in split_masks.items() if m.shape != (n,)]
        if bad:
            raise DatasetError(f"{masks}: masks {bad} must have shape ({n},)")
    else:
        if len(split) != 3 or min(split) < 0 or sum(split) > 1 + 1e-9:
            raise DatasetError(f"split fractions must be three non-negative numbers summing to <= 1, got {split}")
        draw = np.random.default_rng(seed).random(n)
        split_masks = {"train": draw < split[0], "val": (draw >= split[0]) & (draw < split[0] + split[1]),
                       "test": (draw >= split[0] + split[1]) & (draw < sum(split))}
    return GraphData(name=name or edges.stem, adjacency=adjacency, features=x.astype(feature_dtype(x)), labels=y,
                     masks=split_masks, num_classes=num_classes, multilabel=multilabel,
                     meta_extra={"feature_norm": "none"})


def _ogb_necessary_files(root: Path, name: str) -> tuple[Path, list[str]]:
    directory = root / name.replace("-", "_")
    return directory, ["raw/edge.csv.gz", "raw/num-node-list.csv.gz", "raw/num-edge-list.csv.gz",
                       "raw/node-feat.csv.gz", "raw/node-label.csv.gz"]


def _read_ogb_raw(name: str, directory: Path) -> tuple:
    """Run OGB's own reader on ``directory/raw`` and ``split`` through a scratch copy of its layout.

    ogb 1.3.6 caches into ``processed/`` with pickle protocol 4 and reloads
    it with ``torch.load``'s defaults, which modern torch refuses; reading
    from raw in a scratch directory (links to the user's ``raw`` and
    ``split``) keeps OGB's code path and leaves the user's directory as it is.
    """
    import os
    import tempfile

    import ogb
    import pandas as pd
    from ogb.nodeproppred import NodePropPredDataset

    master = pd.read_csv(Path(ogb.__file__).parent / "nodeproppred" / "master.csv", index_col=0,
                         keep_default_na=False)
    if name not in master:
        raise DatasetError(f"{name}: not an OGB node-property dataset; known: {list(master.keys())}")
    meta = master[name].to_dict()
    with tempfile.TemporaryDirectory(prefix="sparse-dist-ogb-") as scratch:
        work = Path(scratch) / directory.name
        (work / "processed").mkdir(parents=True)
        for sub in ("raw", "split"):
            os.symlink((directory / sub).resolve(), work / sub)
        (work / f"RELEASE_v{meta['version']}.txt").write_text("read by sparse-dist\n")
        dataset = NodePropPredDataset(name=name, meta_dict={**meta, "dir_path": str(work)})
        graph, labels = dataset[0]
        split = dataset.get_idx_split()
    return dataset, graph, labels, split


def _check_ogb_arrays(name: str, directory: Path, graph: dict, labels: np.ndarray, split: dict, tasks: int,
                      classes: int) -> None:
    """Refuse what OGB's reader handed over from ``directory/raw`` and ``split`` that does not fit together, before
    anything is sized or indexed from it: node ids of the edges and the split in ``[0, num_nodes)``, features
    finite with one row per node, labels one row per node (class ids in ``[0, num_classes)`` where labelled)."""
    def refuse(what: str) -> DatasetError:
        return DatasetError(f"{name}: {directory}: {what}")

    n = graph.get("num_nodes")
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise refuse(f"raw/num-node-list.csv.gz gives {n!r} nodes, expected an integer >= 1")
    edges = np.asarray(graph.get("edge_index"))
    if edges.ndim != 2 or edges.shape[0] != 2 or edges.dtype.kind not in "iu" or edges.size and (
            edges.min() < 0 or edges.max() >= n):
        raise refuse(f"raw/edge.csv.gz must hold integer node id pairs in [0, {n}), found {edges.dtype} of "
                     f"shape {edges.shape}")
    features = graph.get("node_feat")
    if features is not None and (np.asarray(features).shape[:1] != (n,) or np.asarray(features).dtype.kind not in "biuf"
                                 or not np.isfinite(features).all()):
        raise refuse(f"raw/node-feat.csv.gz must hold {n} rows of finite numbers")
    if labels.shape[:1] != (n,) or labels.dtype.kind not in "biuf":
        raise refuse(f"raw/node-label.csv.gz must hold {n} rows of numbers, found shape {labels.shape}")
    if tasks == 1:
        known = labels.reshape(-1)[np.isfinite(labels.reshape(-1))] if labels.dtype.kind == "f" else labels.reshape(-1)
        if known.size and (known.min() < 0 or known.max() >= classes or not np.all(known == np.floor(known))):
            raise refuse(f"raw/node-label.csv.gz must hold class ids in [0, {classes}) (or NaN for unlabelled)")
    for key in ("train", "valid", "test"):
        ids = np.asarray(split.get(key, ()))
        if ids.dtype.kind not in "iu" or ids.size and (ids.min() < 0 or ids.max() >= n):
            raise refuse(f"the {key} split must hold node ids in [0, {n})")


def load_ogb(name: str, root: str | Path, *, symmetrize: bool = True, allow_download: bool = False) -> GraphData:
    """An OGB node-property dataset through ``ogb``'s own ``NodePropPredDataset``, with OGB's split.

    ``root`` is the directory that holds (or will hold) ``ogbn_NAME/``. Without
    network the files must already be there; if they are absent and
    ``allow_download`` is off (or the download fails) one sentence says where
    to put them. ``symmetrize`` adds reverse edges (the usual practice for
    ``ogbn-arxiv``; OGB itself already adds them for ``ogbn-products``).
    The dataset's evaluation metric name is kept in ``meta.json``.
    """
    from ogb.nodeproppred import NodePropPredDataset

    root = Path(root)
    directory, needed = _ogb_necessary_files(root, name)
    present = all((directory / f).is_file() for f in needed)
    if not present and not allow_download:
        raise DatasetError(f"{name}: no dataset under {directory}; download it on a machine with network access "
                           f"(python -c \"from ogb.nodeproppred import NodePropPredDataset; "
                           f"NodePropPredDataset('{name}', root='DIR')\") and copy DIR/{directory.name} to {root}/")
    try:
        if present:
            dataset, graph, labels, split = _read_ogb_raw(name, directory)
        else:
            dataset = NodePropPredDataset(name=name, root=str(root))  # downloads and processes
            (graph, labels), split = dataset[0], dataset.get_idx_split()
    except (OSError, RuntimeError, EOFError, ValueError, IndexError, KeyError, TypeError, zlib.error) as exc:
        raise DatasetError(f"{name}: could not read or download the dataset under {directory} "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                           f"put the OGB files in {directory}") from None
    if dataset.is_hetero:
        raise DatasetError(f"{name}: heterogeneous OGB graphs are not supported")
    _check_ogb_arrays(name, directory, graph, np.asarray(labels), split, dataset.num_tasks, dataset.num_classes)
    n = int(graph["num_nodes"])
    src, dst = graph["edge_index"]
    if symmetrize:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    keep = src != dst
    adjacency = sp.csr_matrix((np.ones(int(keep.sum()), dtype=np.float32), (dst[keep], src[keep])), shape=(n, n))
    adjacency.data[:] = 1.0
    labels = np.asarray(labels)
    multilabel = dataset.num_tasks > 1
    masks = {}
    for ours, theirs in (("train", "train"), ("val", "valid"), ("test", "test")):
        mask = np.zeros(n, dtype=bool)
        mask[np.asarray(split[theirs], dtype=np.int64)] = True
        masks[ours] = mask
    if multilabel:
        y = labels.astype(np.float32)
        num_classes = labels.shape[1]
    else:
        y = labels.reshape(-1).astype(np.float64)
        unlabelled = ~np.isfinite(y)
        for mask in masks.values():
            mask &= ~unlabelled
        y = np.where(unlabelled, 0, y).astype(np.int64)
        num_classes = dataset.num_classes
    features = graph["node_feat"].astype(np.float32) if graph["node_feat"] is not None else np.ones((n, 1), np.float32)
    return GraphData(name=name, adjacency=adjacency, features=features, labels=y, masks=masks,
                     num_classes=num_classes, multilabel=multilabel,
                     meta_extra={"ogb_name": name, "eval_metric": dataset.eval_metric, "feature_norm": "none"})
