"""Planetoid's ``ind.NAME.*`` files (Cora, CiteSeer, PubMed) read as a :class:`~runners.data.datasets.GraphData`, for
``prepare planetoid``: pickles read by a bounded unpickler that builds only the types those files hold, every array
checked before it is used (a hand-edited file is refused in one sentence naming it, never a traceback or a crash).
"""

from __future__ import annotations

import io
import pickle
import struct
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from runners.data.datasets import DatasetError, GraphData

BUILTIN_PLANETOID = Path(__file__).resolve().parent / "builtin_data" / "planetoid"
PLANETOID_PARTS = ("x", "tx", "allx", "y", "ty", "ally", "graph")


def _latin1_bytes(text: str, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """What pickle protocol 2 means by ``_codecs.encode(text, 'latin1')``: the bytes of a ``bytes``
    object (Python 3 writes bytes that way for Python 2 readers). Only latin-1 is accepted, so a file
    cannot reach any other codec."""
    if not isinstance(text, str) or encoding.lower().replace("_", "-") not in ("latin1", "latin-1", "iso-8859-1"):
        raise DatasetError(f"unexpected _codecs.encode({type(text).__name__}, {encoding!r}) in a Planetoid file; "
                           "only latin-1 text (pickle protocol 2's bytes) is accepted")
    return text.encode("latin-1", errors)


class _PlanetoidUnpickler(pickle._Unpickler):  # noqa: SLF001 - Python's own: a dict memo, bounded reads
    """Refuses anything but the containers the Planetoid files hold (no arbitrary code).

    Accepted: the files as Kipf & Welling wrote them (Python 2, protocol 2) and as Python 3's
    ``pickle.dump(..., protocol=0..5)`` writes the same objects (numpy arrays through
    ``_reconstruct``/``_frombuffer`` in ``numpy.core`` or ``numpy._core``, their bytes through
    ``_codecs.encode(..., 'latin1')`` in protocol 2, scipy CSR/CSC/COO matrices, lists, dicts,
    ``defaultdict``). Every other global, and ``_codecs.encode`` with another codec, is refused.
    """

    _ALLOWED = {("collections", "defaultdict"), ("builtins", "list"), ("builtins", "dict"),
                ("builtins", "set"), ("builtins", "int"), ("builtins", "object"), ("copyreg", "_reconstructor"),
                ("numpy", "ndarray"), ("numpy", "dtype")}
    _NUMPY = {(f"numpy.{core}.{module}", name) for core in ("core", "_core")
              for module, name in (("multiarray", "_reconstruct"), ("multiarray", "scalar"),
                                   ("numeric", "_frombuffer"))}

    def find_class(self, module: str, name: str):  # noqa: ANN201
        module = {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module, module)
        if (module, name) in self._ALLOWED or (module, name) in self._NUMPY:
            return super().find_class(module, name)
        if (module, name) == ("_codecs", "encode"):
            return _latin1_bytes
        if module.startswith("scipy.sparse") and name in ("csr_matrix", "csc_matrix", "coo_matrix"):
            return getattr(sp, name)
        raise DatasetError(f"unexpected object {module}.{name} in a Planetoid file")


def _read_pickle(path: Path) -> object:
    """One Planetoid file's object, unpickled by :class:`_PlanetoidUnpickler` from its bytes in memory.

    Why Python's own unpickler over a ``BytesIO`` and not the C one over the file: a pickle names sizes that
    the C unpickler allocates before it reads (``LONG_BINPUT 0xFFFFFFF0``, seven bytes, makes it size its memo
    array for 2^32 entries: a MemoryError under a 4 GiB limit, found by the fuzzer); the Python one keeps its
    memo in a dict and a ``BytesIO`` returns no more than the file holds. The files are small (Cora's eight
    hold 0.6 MB)."""
    try:
        data = path.read_bytes()
        return _PlanetoidUnpickler(io.BytesIO(data), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, KeyError, IndexError, TypeError,
            MemoryError, OverflowError, struct.error) as exc:
        if isinstance(exc, DatasetError):
            raise DatasetError(f"{path}: {exc}") from None
        raise DatasetError(f"{path}: not a Planetoid pickle ({exc})") from None


def load_planetoid(directory: str | Path, name: str) -> GraphData:
    """Read ``ind.NAME.{x,tx,allx,y,ty,ally,graph,test.index}`` with the standard public split.

    As in Kipf & Welling's loader: test rows are re-ordered by their index,
    test ids missing from the graph (Citeseer) get zero features and no
    label, train = the first ``len(y)`` nodes, val = the next 500, test = the
    ids in ``test.index``. The adjacency is made symmetric and binary, without
    self-loops (the GCN normalisation adds them).
    """
    directory = Path(directory)
    missing = [f"ind.{name}.{part}" for part in (*PLANETOID_PARTS, "test.index")
               if not (directory / f"ind.{name}.{part}").is_file()]
    if missing:
        raise DatasetError(f"{directory}: not a Planetoid dataset directory for {name!r}; missing {missing}")
    objects = {part: _read_pickle(directory / f"ind.{name}.{part}") for part in PLANETOID_PARTS}
    for part in ("x", "tx", "allx"):
        objects[part] = _checked_sparse(objects[part], directory / f"ind.{name}.{part}")
    for part in ("y", "ty", "ally"):
        label = objects[part]
        if (not isinstance(label, np.ndarray) or label.ndim != 2 or label.dtype.kind not in "biuf"
                or not np.isfinite(label).all()):
            raise DatasetError(f"{directory / f'ind.{name}.{part}'}: expected a 2-D one-hot label array of numbers")
    try:
        return _planetoid_graph(directory, name, objects)
    except (ValueError, IndexError, TypeError, KeyError, OverflowError, MemoryError) as exc:
        if isinstance(exc, DatasetError):
            raise
        raise DatasetError(f"{directory}: the ind.{name}.* files do not fit together as a Planetoid dataset "
                           f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''})") from None


def _checked_sparse(matrix: object, path: Path) -> sp.csr_matrix:
    """An unpickled sparse matrix as CSR, its structure checked first: unpickling sets a matrix's arrays without
    scipy's checks, and an ``indptr`` that ends short of its entries makes scipy write past an array."""
    if not sp.issparse(matrix) or matrix.format not in ("csr", "csc", "coo"):
        raise DatasetError(f"{path}: expected a scipy sparse matrix, got {type(matrix).__name__}")
    try:
        shape = tuple(int(n) for n in matrix.shape)
        if len(shape) != 2 or min(shape) < 0 or matrix.data.dtype.kind not in "biuf":
            raise ValueError(f"shape {shape}, data of type {matrix.data.dtype}")
        if matrix.format == "coo":
            row, col = np.asarray(matrix.row), np.asarray(matrix.col)
            if (row.dtype.kind not in "iu" or col.dtype.kind not in "iu" or not row.shape == col.shape
                    == matrix.data.shape or row.ndim != 1 or row.size and (row.min() < 0 or row.max() >= shape[0]
                                                                       or col.min() < 0 or col.max() >= shape[1])):
                raise ValueError("its row and column ids do not fit its shape and entries")
        else:
            matrix.check_format(full_check=True)
        if not np.isfinite(matrix.data).all():
            raise ValueError("non-finite values")
    except (ValueError, TypeError, AttributeError, OverflowError) as exc:
        raise DatasetError(f"{path}: not a valid sparse matrix ({exc})") from None
    return sp.csr_matrix(matrix)


def _check_planetoid_shapes(directory: Path, name: str, allx: sp.csr_matrix, tx: sp.csr_matrix, ally: np.ndarray,
                            ty: np.ndarray, y: np.ndarray, test_index: np.ndarray, graph: dict) -> None:
    """Refuse Planetoid parts that do not fit together before anything is sized from them: feature widths and
    label widths equal, one label row per feature row, the training labels a prefix, test ids distinct, as many
    as ``tx``'s rows and among the graph's nodes after ``allx``'s, and the graph a dict of node ids to lists of
    node ids."""
    files = f"{directory}/ind.{name}"
    nodes = len(graph)
    if allx.shape[1] != tx.shape[1] or not ally.shape[1] == ty.shape[1] == y.shape[1]:
        raise DatasetError(f"{files}.*: allx and tx must have one width ({allx.shape[1]}, {tx.shape[1]}) and "
                           f"ally, ty, y one label width ({ally.shape[1]}, {ty.shape[1]}, {y.shape[1]})")
    if allx.shape[0] != ally.shape[0] or tx.shape[0] != ty.shape[0] or y.shape[0] > ally.shape[0]:
        raise DatasetError(f"{files}.*: expected one label row per feature row (allx {allx.shape[0]}, ally "
                           f"{ally.shape[0]}; tx {tx.shape[0]}, ty {ty.shape[0]}) and y no longer than ally")
    if (test_index.size != tx.shape[0] or np.unique(test_index).size != test_index.size or test_index.size
            and (test_index.min() < allx.shape[0] or test_index.max() >= max(nodes, allx.shape[0] + tx.shape[0]))):
        raise DatasetError(f"{files}.test.index: expected {tx.shape[0]} distinct node ids (one per row of tx) in "
                           f"[{allx.shape[0]}, {max(nodes, allx.shape[0] + tx.shape[0])})")
    for node, neighbours in graph.items():
        if (not isinstance(node, (int, np.integer)) or not isinstance(neighbours, (list, tuple, set))
                or not all(isinstance(other, (int, np.integer)) for other in neighbours)):
            raise DatasetError(f"{files}.graph: expected a dict of node ids to lists of node ids, found "
                               f"{type(node).__name__} -> {type(neighbours).__name__}")


def _planetoid_graph(directory: Path, name: str, objects: dict[str, object]) -> GraphData:
    """The graph of checked Planetoid objects (:func:`load_planetoid`)."""
    try:
        test_index = np.loadtxt(directory / f"ind.{name}.test.index", dtype=np.int64, ndmin=1)
    except ValueError as exc:
        raise DatasetError(f"{directory / f'ind.{name}.test.index'}: expected one integer per line ({exc})") from None
    graph = objects["graph"]
    if not isinstance(graph, dict):
        raise DatasetError(f"{directory / f'ind.{name}.graph'}: expected a dict of adjacency lists")

    tx, allx = sp.csr_matrix(objects["tx"]), sp.csr_matrix(objects["allx"])
    ty, ally, y = objects["ty"], objects["ally"], objects["y"]
    _check_planetoid_shapes(directory, name, allx, tx, ally, ty, y, test_index, graph)
    test_sorted = np.sort(test_index)
    n_nodes = max(allx.shape[0] + (test_sorted.max() - test_sorted.min() + 1), len(graph))
    if test_sorted.max() - test_sorted.min() + 1 != tx.shape[0]:  # Citeseer: isolated test nodes
        full_tx = sp.lil_matrix((test_sorted.max() - test_sorted.min() + 1, tx.shape[1]))
        full_tx[test_sorted - test_sorted.min(), :] = tx
        tx = sp.csr_matrix(full_tx)
        full_ty = np.zeros((full_tx.shape[0], ty.shape[1]))
        full_ty[test_sorted - test_sorted.min(), :] = ty
        ty = full_ty
    features = sp.vstack([allx, tx]).tolil()
    features[test_index, :] = features[test_sorted, :]
    onehot = np.vstack([ally, ty])
    onehot[test_index, :] = onehot[test_sorted, :]
    n_nodes = features.shape[0]

    sources, targets = [], []
    for node, neighbours in graph.items():
        for other in neighbours:
            if node != other and 0 <= other < n_nodes and 0 <= node < n_nodes:
                sources.append(node)
                targets.append(other)
    adjacency = sp.csr_matrix((np.ones(len(sources)), (sources, targets)), shape=(n_nodes, n_nodes))
    adjacency = ((adjacency + adjacency.T) > 0).astype(np.float32).tocsr()

    has_label = onehot.sum(axis=1) > 0
    labels = onehot.argmax(axis=1).astype(np.int64)
    masks = {split: np.zeros(n_nodes, dtype=bool) for split in ("train", "val", "test")}
    masks["train"][: y.shape[0]] = True
    masks["val"][y.shape[0]: y.shape[0] + 500] = True
    masks["test"][test_sorted] = True
    masks["test"] &= has_label
    return GraphData(name=name, adjacency=adjacency, features=np.asarray(features.todense(), dtype=np.float32),
                     labels=labels, masks=masks, num_classes=onehot.shape[1])
