"""``metis-train``: DistDGL's partitioner, METIS k-way with one balance constraint per node kind.

DistDGL (``partition_graph(..., balance_ntypes=train_mask, balance_edges=True)``)
hands METIS one vertex weight per constraint: a 0/1 column per node kind and
the degree, so every part gets its share of training nodes, of the other
nodes and of edges, and METIS minimises the edge cut (its default objective,
the one DGL asks for). Here the kinds are training, validation, test and
unlabelled nodes (the survey: DistDGL balances "training/validation/test
vertices/edges"), plus the degree in the symmetrised graph: five constraints.

Decision (how METIS is reached): pymetis (2025.2.2) has no ``ncon``; its
``part_graph`` reads any weight array as one constraint (we checked: a
two-column array interleaved row by row is taken as ``n`` single weights, the
first half of it). The METIS library pymetis ships does export
``METIS_PartGraphKway``, so we call it through ``ctypes`` with ``ncon = 5``:
METIS's own multi-constraint algorithm, not an imitation. Where that entry
point is missing (another pymetis build) ``metis-train`` refuses with a
sentence rather than silently balancing one constraint.

METIS meets each constraint within its default tolerance (3%) only where the
weights allow; with few training nodes (Cora: 140) a part may end a node or
two beyond it. The statistics (:mod:`runners.data.sampling_stats`) show it.
"""

from __future__ import annotations

import ctypes

import numpy as np
import scipy.sparse as sp

from runners.data.datasets import DatasetError

METIS_NOPTIONS = 40
"""Length of METIS 5's options array (``METIS_NOPTIONS`` in metis.h)."""
METIS_OBJTYPE_VOL = 1
"""``METIS_OBJTYPE_VOL`` in metis.h: minimise the total communication volume."""


class MetisUnavailable(DatasetError):
    """METIS's multi-constraint entry point cannot be reached in this installation (a user error: one sentence)."""


def symmetric_pattern(adjacency: sp.spmatrix) -> sp.csr_matrix:
    """The undirected 0/1 pattern of ``adjacency`` without self-loops, indices sorted (what METIS reads)."""
    pattern = sp.csr_matrix(adjacency, dtype=np.float64)
    symmetric = ((pattern + pattern.T) != 0).astype(np.int8).tocsr()
    symmetric.setdiag(0)
    symmetric.eliminate_zeros()
    symmetric.sort_indices()
    return symmetric


def balance_constraints(symmetric: sp.csr_matrix, masks: dict[str, np.ndarray]) -> np.ndarray:
    """``n x 5`` vertex weights: training, validation, test, unlabelled (0/1 each) and degree.

    A node in several splits counts in the first of them (train, val, test), so the 0/1 columns sum to
    one per node and together balance the node count too. A column that is zero everywhere (no
    validation set, say) is dropped: METIS cannot balance an empty constraint.
    """
    n = symmetric.shape[0]
    kind = np.full(n, 3, dtype=np.int64)
    for index, name in reversed(list(enumerate(("train", "val", "test")))):
        mask = masks.get(name)
        if mask is not None:
            kind[np.asarray(mask, dtype=bool)] = index
    columns = [(kind == index).astype(np.int64) for index in range(4)]
    columns.append(np.maximum(np.diff(symmetric.indptr), 1).astype(np.int64))  # an isolated node weighs 1
    return np.stack([column for column in columns if column.any()], axis=1)


def metis_library() -> tuple[ctypes.CDLL, type, int]:
    """pymetis's extension module as a C library, its ``idx_t`` dtype and the index of the seed option."""
    try:
        from pymetis import _internal
    except ImportError as exc:
        raise MetisUnavailable("--partitioner metis-train needs pymetis (METIS); install pymetis") from exc
    try:
        library = ctypes.CDLL(_internal.__file__)
        library.METIS_PartGraphKway  # noqa: B018  (raises AttributeError when not exported)
        library.METIS_SetDefaultOptions  # noqa: B018
        width = int(_internal._idx_type_width())
        seed_index = int(_internal.options_indices.SEED)
    except (OSError, AttributeError) as exc:
        raise MetisUnavailable(f"--partitioner metis-train calls METIS_PartGraphKway with several constraints, "
                               f"which this pymetis build does not export ({exc}); use --partitioner metis "
                               f"(one constraint, training nodes balanced afterwards)") from exc
    return library, (np.int64 if width == 64 else np.int32), seed_index


def metis_kway(indptr: np.ndarray, indices: np.ndarray, parts: int, seed: int = 0,
               weights: np.ndarray | None = None, volume: bool = False) -> np.ndarray:
    """``part_of`` from ``METIS_PartGraphKway`` on the symmetric graph ``indptr``/``indices`` (no self-loops).

    ``weights``: ``n x ncon`` vertex weights (None: one constraint, unit weights); ``volume``: the
    communication-volume objective (``OBJTYPE = VOL``, what ``--partitioner metis`` asks for through
    pymetis, the same options as pymetis's ``part_graph(..., recursive=False)``), else the edge cut.
    The graph reaches METIS once: arrays already of METIS's index type are passed as they are, others are
    converted once, and the copies are freed as soon as METIS returns. ctypes releases the GIL during the
    call, so a progress thread keeps running."""
    n = indptr.size - 1
    library, idx_t, seed_index = metis_library()
    if parts == 1:
        return np.zeros(n, dtype=np.int64)

    def pointer(array: np.ndarray | None) -> ctypes.c_void_p | None:
        return None if array is None else array.ctypes.data_as(ctypes.c_void_p)

    xadj = np.ascontiguousarray(indptr, dtype=idx_t)
    adjncy = np.ascontiguousarray(indices, dtype=idx_t)
    vwgt = None if weights is None else np.ascontiguousarray(weights, dtype=idx_t)
    ncon = 1 if weights is None else weights.shape[1]
    options = np.zeros(METIS_NOPTIONS, dtype=idx_t)
    library.METIS_SetDefaultOptions(pointer(options))
    options[seed_index] = seed
    if volume:
        from pymetis import _internal

        options[int(_internal.options_indices.OBJTYPE)] = METIS_OBJTYPE_VOL
    counts = {name: np.array([value], dtype=idx_t) for name, value in
              (("nvtxs", n), ("ncon", ncon), ("nparts", parts))}
    objective = np.zeros(1, dtype=idx_t)
    part_of = np.zeros(n, dtype=idx_t)
    status = library.METIS_PartGraphKway(
        pointer(counts["nvtxs"]), pointer(counts["ncon"]), pointer(xadj), pointer(adjncy), pointer(vwgt),
        None, None, pointer(counts["nparts"]), None, None, pointer(options), pointer(objective), pointer(part_of))
    del xadj, adjncy, vwgt
    if status != 1:  # METIS_OK
        raise MetisUnavailable(f"METIS_PartGraphKway failed with status {status} "
                               f"({n} nodes, {ncon} constraint(s), {parts} parts)")
    return part_of.astype(np.int64)


def metis_train_partition(adjacency: sp.spmatrix, parts: int, masks: dict[str, np.ndarray],
                          seed: int = 0, symmetric: bool = False) -> np.ndarray:
    """``part_of`` from METIS k-way (edge-cut objective) under :func:`balance_constraints`; ``symmetric``:
    ``adjacency`` is already a symmetric CSR without self-loops, indices sorted (given to METIS as it is)."""
    n = adjacency.shape[0]
    metis_library()  # refuse before any work when METIS cannot be reached
    if parts == 1:
        return np.zeros(n, dtype=np.int64)
    graph = sp.csr_matrix(adjacency) if symmetric else symmetric_pattern(adjacency)
    weights = balance_constraints(graph, masks)
    return metis_kway(graph.indptr, graph.indices, parts, seed, weights=weights)
