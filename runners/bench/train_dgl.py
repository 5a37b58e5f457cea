"""The DGL peer of ``sparse-dist bench train --peer dgl``: DGL 2.1's layers on the same whole graph, one process.

It puts sparse-dist's full-graph epoch next to DGL's compiled message
passing (``gspmm``) on the same device, graph, features and initial
weights, as the PyG peer (:mod:`runners.bench.pyg_peer`) does for PyG:

* GCN: ``GraphConv(in, out, weight=True, bias=True,
  allow_zero_in_degree=True)`` by DGL's fastest exact path. On a symmetric
  0/1 graph without loops (the synthetic graphs, Cora), ``norm='both'`` on
  ``A + I``: unweighted messages (``copy_u`` + ``sum``) between DGL's own
  degree scalings, which is ``Â`` there. Otherwise ``norm='none'`` with
  ``edge_weight`` = the values of ``Â``
  (:func:`runners.bench.pyg_peer.gcn_adjacency`, computed with scipy
  independently of the trainer): the ``u_mul_e`` + ``sum`` kernel, about
  5x slower on the CPU (0.53 s against 0.095 s a forward product on the
  200k synthetic at two threads). The notes say which. DGL keeps its own
  order of products (``A (H W)`` when the layer narrows, else ``(A H) W``).
* SAGE: ``SAGEConv(in, out, 'mean', bias=True)`` on the raw pattern
  (DGL's mean divides by the in-edge count; ours by the weighted degree:
  equal for 0/1 adjacencies, else a note says so).

Edges run column -> row (row ``i`` aggregates its stored columns), so the
messages are those of ``Â H``. Dropout, activations, loss and Adam are the
PyG peer's (:class:`runners.bench.pyg_peer.WholeGraphPeer`). DGL's own
OpenMP pool gets torch's thread count. GAT is not mirrored (a sentence says
so). ``dgl`` is the optional extra ``dgl`` and is imported only inside
:class:`DglPeer` (through :func:`runners.bench.minibatch_dgl.import_dgl`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from algorithms.model import GraphModel
from algorithms.train import LocalGraph, TrainConfig
from runners.bench.minibatch_dgl import import_dgl
from runners.bench.pyg_peer import MirroredModel, WholeGraphPeer, gcn_adjacency, mean_pattern


@dataclass(frozen=True)
class DglOperand:
    """The whole graph as a DGL layer takes it: the graph (edges column -> row), the edge weights or None, and
    ``GraphConv``'s ``norm`` (``both``: DGL scales by its own degrees; ``none``: the weights are ``Â``)."""

    graph: Any
    edge_weight: torch.Tensor | None
    norm: str = "none"


def _dgl_graph(dgl: Any, matrix: sp.csr_matrix, device: torch.device) -> Any:
    coo = sp.coo_matrix(matrix)
    return dgl.graph((torch.from_numpy(coo.col.astype(np.int64)), torch.from_numpy(coo.row.astype(np.int64))),
                     num_nodes=matrix.shape[0]).to(device)


def degrees_give_gcn_normalisation(rows: sp.spmatrix) -> bool:
    """Whether DGL's ``norm='both'`` on ``rows`` plus a loop on every node is exactly ``Â``: a symmetric 0/1
    pattern without loops (then in- and out-degrees of ``A + I`` are its row sums)."""
    matrix = sp.csr_matrix(rows, dtype=np.float64)
    matrix.sum_duplicates()
    return (not matrix.diagonal().any() and bool(np.all(matrix.data == 1.0))
            and (matrix != matrix.T).nnz == 0)


def _gcn_operand(dgl: Any, rows: sp.spmatrix, dtype: torch.dtype, device: torch.device,
                 notes: list[str]) -> DglOperand:
    """DGL's fastest exact path: unweighted messages (``copy_u``) with its own degree scaling where that is
    ``Â`` (:func:`degrees_give_gcn_normalisation`), else ``Â``'s values as edge weights (``u_mul_e``)."""
    if degrees_give_gcn_normalisation(rows):
        with_loops = sp.csr_matrix(rows, dtype=np.float64) + sp.identity(rows.shape[0], format="csr")
        notes.append("GCN: DGL's unweighted kernel with norm='both' on A + I (equal to Â: a symmetric 0/1 graph)")
        return DglOperand(_dgl_graph(dgl, with_loops, device), None, "both")
    normalised = sp.coo_matrix(gcn_adjacency(rows))
    notes.append("GCN: DGL's weighted kernel (u_mul_e) with Â's values as edge weights (the graph is weighted, "
                 "directed or has loops, so DGL's own degree scaling would not be Â)")
    return DglOperand(_dgl_graph(dgl, normalised, device), torch.from_numpy(normalised.data).to(dtype).to(device))


def _mean_operand(dgl: Any, rows: sp.spmatrix, dtype: torch.dtype, device: torch.device,
                  notes: list[str]) -> DglOperand:
    return DglOperand(_dgl_graph(dgl, mean_pattern(rows, "DGL", notes), device), None)


def _gcn_conv(ours: Any, fan_in: int, operand: DglOperand) -> Any:
    from dgl.nn import GraphConv

    conv = GraphConv(fan_in, ours.fan_out, norm=operand.norm, weight=True, bias=True, allow_zero_in_degree=True)
    conv.weight.copy_(ours.weight)
    conv.bias.copy_(ours.bias)
    return conv


def _sage_conv(ours: Any, fan_in: int, operand: DglOperand) -> Any:
    from dgl.nn import SAGEConv

    conv = SAGEConv(fan_in, ours.fan_out, "mean", bias=True)
    conv.fc_self.weight.copy_(ours.weight.T)
    conv.fc_neigh.weight.copy_(ours.neighbour_weight.T)
    conv.fc_self.bias.copy_(ours.bias)
    return conv


@dataclass(frozen=True)
class DglMirror:
    """How the DGL peer mirrors one layer kind: the DGL layer made from ours (weights copied), and the whole
    graph as that layer takes it."""

    conv: Callable[[Any, int, DglOperand], Any]
    operand: Callable[[Any, sp.spmatrix, torch.dtype, torch.device, list[str]], DglOperand]


DGL_MIRRORS: dict[str, DglMirror] = {"gcn": DglMirror(_gcn_conv, _gcn_operand),
                                     "sage": DglMirror(_sage_conv, _mean_operand)}
"""The layer kinds the DGL peer mirrors, by ``--layer-kind``."""


def dgl_mirror_problem(kind: str) -> str | None:
    """Why the DGL peer cannot mirror ``--layer-kind kind`` (one sentence), or None."""
    if kind in DGL_MIRRORS:
        return None
    return (f"the DGL peer of bench train mirrors --layer-kind {', '.join(DGL_MIRRORS)} only, not --layer-kind "
            f"{kind}; choose --peer pyg")


class _DglModel(MirroredModel):
    """The DGL layers of ``kind`` (``DGL_MIRRORS``) made from ``start``'s for ``operand``."""

    def __init__(self, kind: str, dropout: float, start: GraphModel, operand: DglOperand) -> None:
        super().__init__(lambda ours, fan_in: DGL_MIRRORS[kind].conv(ours, fan_in, operand), dropout, start)

    def convolve(self, conv: Any, h: torch.Tensor, operand: DglOperand) -> torch.Tensor:
        if operand.edge_weight is None:
            return conv(operand.graph, h)
        return conv(operand.graph, h, edge_weight=operand.edge_weight)


class DglPeer(WholeGraphPeer):
    """DGL's layers (``DGL_MIRRORS``) on the whole ``graph`` (not collective). Raises ``ImportError``
    without dgl, ``ValueError`` for a kind it does not mirror."""

    library = "the DGL peer"

    def __init__(self, graph: LocalGraph, config: TrainConfig, device: torch.device) -> None:
        problem = dgl_mirror_problem(config.model)
        if problem is not None:
            raise ValueError(problem)
        dgl, import_notes = import_dgl()
        super().__init__(graph, config, device)
        self.notes += import_notes
        dgl.utils.internal.set_num_threads(torch.get_num_threads())  # DGL's OpenMP pool: the peer's threads
        self.operand = DGL_MIRRORS[config.model].operand(dgl, graph.rows, self.dtype, device, self.notes)
        self.model = _DglModel(config.model, config.dropout, self.start, self.operand).to(self.dtype).to(device)
        self._ready()
