"""The PyG peer of ``sparse-dist bench train``: the same model on the same whole graph, one process.

It exists to put sparse-dist's epoch time and memory next to what a
single-process PyTorch Geometric user gets on the same device. It mirrors
:mod:`algorithms.model` and :class:`algorithms.train.Trainer`:

* GCN: a stack of ``GCNConv(in, out, normalize=False, cached=False,
  bias=True)`` applied to ``Â`` given as a ``torch.sparse_csr_tensor``
  (int64 indices, PyG's index type). ``Â`` is computed here from the raw
  whole adjacency with scipy (:func:`gcn_adjacency`), independently of
  :func:`algorithms.normalize.gcn_normalize`, with the same definition.
* SAGE: ``SAGEConv(in, out, aggr='mean')`` (``root_weight=True``: ``H W_r +
  mean_j(H_j) W_l + b``, our ``H W_self + (D^-1 A H) W_neigh + b``) applied
  to the raw adjacency. PyG's mean divides by the number of stored edges of
  a row, ours by its weighted degree: equal for 0/1 adjacencies; otherwise
  the peer's result carries a note.
* GAT: ``GATConv(in, F', heads=K, concat=..., negative_slope=0.2,
  dropout=attention_dropout, add_self_loops=False)`` on an ``edge_index``
  (source = column, target = row: a row attends over its stored entries)
  whose self-loops PyG's own ``remove_self_loops`` and ``add_self_loops``
  made once here (what ``GATConv`` does in every forward by default; done
  once so the peer's epoch does not pay for it, as ours does not).
  Hidden layers concatenate ``--heads`` heads, the output layer averages
  ``--output-heads``; ELU between layers.
* ``F.dropout(p)`` on every layer's input (the first included), ReLU
  between layers (ELU for GAT), cross-entropy (BCE for multi-label) averaged
  over the training rows, Adam with the trainer's learning rate and
  weight-decay scope; features row-normalised as the trainer does.

Initial weights are copied from :class:`algorithms.model.GraphModel` with
the same seed, so both runs start from the same point; dropout masks come
from torch's RNG and differ from sparse-dist's per-global-row masks, so
the losses are comparable in size but never equal.

``torch_geometric`` is optional and imported only inside :class:`PygPeer`
(an ``ImportError`` propagates; the caller skips the peer).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from algorithms.model import GraphModel
from algorithms.train import LocalGraph, TrainConfig, scaled_features

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def gcn_adjacency(adjacency: sp.spmatrix) -> sp.csr_matrix:
    """``D^-1/2 (A + I_remaining) D^-1/2`` of a whole square adjacency (float64 CSR).

    Self-loops already present keep their weight; every other node gets a
    loop of weight 1. ``D`` holds the row sums of ``A + I_remaining`` and
    scales rows and columns alike; a zero degree gives a zero scale.
    """
    a = sp.coo_matrix(adjacency, dtype=np.float64)
    a.sum_duplicates()
    n = a.shape[0]
    if a.shape != (n, n):
        raise ValueError(f"gcn_adjacency needs a square matrix, got {a.shape}")
    has_loop = np.zeros(n, dtype=bool)
    has_loop[a.row[a.row == a.col]] = True
    loops = sp.diags((~has_loop).astype(np.float64))
    with_loops = sp.csr_matrix(a.tocsr() + loops)
    degree = np.asarray(with_loops.sum(axis=1)).ravel()
    scale = np.where(degree > 0, 1.0 / np.sqrt(np.where(degree > 0, degree, 1.0)), 0.0)
    result = sp.csr_matrix(sp.diags(scale) @ with_loops @ sp.diags(scale))
    result.sort_indices()
    return result


def sparse_csr(matrix: sp.csr_matrix, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``matrix`` as a torch sparse CSR tensor with int64 indices on ``device``."""
    matrix = sp.csr_matrix(matrix)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        tensor = torch.sparse_csr_tensor(torch.from_numpy(matrix.indptr.astype(np.int64)),
                                         torch.from_numpy(matrix.indices.astype(np.int64)),
                                         torch.from_numpy(matrix.data).to(dtype), size=matrix.shape,
                                         check_invariants=False)
    return tensor.to(device)


def gat_edge_index(adjacency: sp.spmatrix) -> torch.Tensor:
    """``2 x E`` int64 (source = column, target = row) of a whole adjacency's pattern, self-loops made by
    PyG's ``remove_self_loops`` then ``add_self_loops`` (one per node), as ``GATConv`` does by default."""
    from torch_geometric.utils import add_self_loops, remove_self_loops

    a = sp.coo_matrix(adjacency)
    a.sum_duplicates()
    edge_index = torch.from_numpy(np.vstack([a.col, a.row]).astype(np.int64))
    edge_index, _ = remove_self_loops(edge_index)
    edge_index, _ = add_self_loops(edge_index, num_nodes=a.shape[0])
    return edge_index


def _gcn_conv(ours: Any, fan_in: int, attention_dropout: float) -> Any:
    from torch_geometric.nn import GCNConv

    conv = GCNConv(fan_in, ours.fan_out, normalize=False, cached=False, bias=True)
    conv.lin.weight.copy_(ours.weight.T)
    conv.bias.copy_(ours.bias)
    return conv


def _sage_conv(ours: Any, fan_in: int, attention_dropout: float) -> Any:
    from torch_geometric.nn import SAGEConv

    conv = SAGEConv(fan_in, ours.fan_out, aggr="mean", root_weight=True, bias=True)
    conv.lin_r.weight.copy_(ours.weight.T)
    conv.lin_l.weight.copy_(ours.neighbour_weight.T)
    conv.lin_l.bias.copy_(ours.bias)
    return conv


def _gat_conv(ours: Any, fan_in: int, attention_dropout: float) -> Any:
    from torch_geometric.nn import GATConv

    conv = GATConv(fan_in, ours.head_width, heads=ours.heads, concat=ours.concat, negative_slope=ours.negative_slope,
                   dropout=attention_dropout, add_self_loops=False, bias=True)
    conv.lin.weight.copy_(ours.weight.T)
    conv.att_src.copy_(ours.att_src.unsqueeze(0))
    conv.att_dst.copy_(ours.att_dst.unsqueeze(0))
    conv.bias.copy_(ours.bias)
    return conv


def _gcn_operand(rows: sp.spmatrix, dtype: torch.dtype, device: torch.device, notes: list[str]) -> torch.Tensor:
    return sparse_csr(gcn_adjacency(rows), dtype, device)


def mean_pattern(rows: sp.spmatrix, library: str, notes: list[str]) -> sp.csr_matrix:
    """The whole adjacency a peer's mean aggregation reads (float64 CSR, duplicates summed); a note where its
    weights are not all 1 (``library``'s mean divides by the edge count, ours by the weighted degree)."""
    matrix = sp.csr_matrix(rows, dtype=np.float64)
    matrix.sum_duplicates()
    if matrix.nnz and not np.all(matrix.data == 1.0):
        notes.append(f"edge weights are not all 1: {library}'s mean divides by the edge count, sparse-dist by the "
                     f"weighted degree")
    return matrix


def _mean_operand(rows: sp.spmatrix, dtype: torch.dtype, device: torch.device, notes: list[str]) -> torch.Tensor:
    return sparse_csr(mean_pattern(rows, "PyG", notes), dtype, device)


def _gat_operand(rows: sp.spmatrix, dtype: torch.dtype, device: torch.device, notes: list[str]) -> torch.Tensor:
    return gat_edge_index(rows).to(device)


@dataclass(frozen=True)
class Mirror:
    """How the peer mirrors one layer kind: the PyG layer made from ours (weights copied), and the whole graph
    as that layer takes it (``rows``: the raw adjacency; ``notes`` collects where the two runs differ)."""

    conv: Callable[[Any, int, float], Any]
    operand: Callable[[sp.spmatrix, torch.dtype, torch.device, list[str]], torch.Tensor]


MIRRORS: dict[str, Mirror] = {"gcn": Mirror(_gcn_conv, _gcn_operand), "sage": Mirror(_sage_conv, _mean_operand),
                              "gat": Mirror(_gat_conv, _gat_operand)}
"""The layer kinds the peer mirrors, by ``--layer-kind`` (a table of PyG's counterparts, not a switch)."""


def mirror_problem(kind: str) -> str | None:
    """Why the peer cannot mirror ``--layer-kind kind`` (one sentence), or None."""
    if kind in MIRRORS:
        return None
    return (f"the PyG peer mirrors --layer-kind {', '.join(MIRRORS)} only: it has no PyG layer to copy the weights of "
            f"--layer-kind {kind} into")


class MirroredModel(torch.nn.Module):
    """Another library's layers made from ``start``'s (``make_conv(our_layer, fan_in)``, weights copied), with
    dropout on every input and the activation our layers declare between them; a subclass says how one layer
    is called on the whole graph as that library takes it (:meth:`convolve`)."""

    def __init__(self, make_conv: Callable[[Any, int], Any], dropout: float, start: GraphModel) -> None:
        super().__init__()
        self.dropout = dropout
        self.activation = F.elu if start.layers[0].activation == "elu" else torch.relu
        self.convs = torch.nn.ModuleList()
        with torch.no_grad():
            for layer, fan_in in enumerate(start.widths[:-1]):
                self.convs.append(make_conv(start.layers[layer], fan_in))

    def convolve(self, conv: Any, h: torch.Tensor, operand: Any) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor, operand: Any) -> torch.Tensor:
        h = x
        for layer, conv in enumerate(self.convs):
            h = F.dropout(h, p=self.dropout, training=self.training)
            h = self.convolve(conv, h, operand)
            if layer < len(self.convs) - 1:
                h = self.activation(h)
        return h


class _PygModel(MirroredModel):
    """The PyG layers of ``kind`` (``MIRRORS``) made from ``start``'s."""

    def __init__(self, kind: str, dims: list[int], dropout: float, start: GraphModel,
                 attention_dropout: float = 0.0) -> None:
        super().__init__(lambda ours, fan_in: MIRRORS[kind].conv(ours, fan_in, attention_dropout), dropout, start)

    def convolve(self, conv: Any, h: torch.Tensor, adjacency: torch.Tensor) -> torch.Tensor:
        return conv(h, adjacency)


def trainer_adam(model: "_PygModel", config: TrainConfig) -> torch.optim.Adam:
    """Adam over ``model``'s convolutions with the trainer's learning rate and weight-decay scope (``first``:
    the first layer only, as Kipf & Welling; ``all``)."""
    first = list(model.convs[0].parameters())
    rest = [p for conv in model.convs[1:] for p in conv.parameters()]
    if config.weight_decay_scope == "first":
        groups = [{"params": first, "weight_decay": config.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    else:
        groups = [{"params": first + rest, "weight_decay": config.weight_decay}]
    return torch.optim.Adam([g for g in groups if g["params"]], lr=config.lr)


class WholeGraphPeer:
    """One process's full-graph training of ``config``'s model with another library's layers (not collective).

    Holds what every peer shares: the scaled features, labels, the training
    rows, Adam with the trainer's settings and the step. A subclass gives
    ``model`` (``model(features, operand)`` returns the logits of every row)
    and ``operand`` (the whole graph as that library's layers take it).
    ``graph`` holds every row (``graph.rows`` is ``N x N``).
    """

    library = "the peer"

    def __init__(self, graph: LocalGraph, config: TrainConfig, device: torch.device) -> None:
        if graph.rows.shape[0] != graph.rows.shape[1]:
            raise ValueError(f"{self.library} needs the whole graph, got {graph.rows.shape[0]} of "
                             f"{graph.rows.shape[1]} rows")
        self.config = config
        self.device = device
        self.dtype = DTYPES[config.dtype]
        self.multilabel = graph.multilabel
        self.num_classes = graph.num_classes
        self.notes: list[str] = []
        features = scaled_features(graph.features, config.feature_norm)
        self.features = torch.from_numpy(features).to(self.dtype).to(device)
        self.labels = torch.from_numpy(graph.labels).to(device)
        if graph.multilabel:
            self.labels = self.labels.to(self.dtype)
        self.train_mask = torch.from_numpy(graph.masks["train"].astype(bool)).to(device)
        if not bool(self.train_mask.any()):
            raise ValueError(f"{graph.name}: the training split is empty")
        self.dims = [graph.features.shape[1]] + [config.hidden] * (config.layers - 1) + [graph.num_classes]
        self.start = GraphModel(config.model, self.dims, dropout=config.dropout, seed=config.seed, dtype=self.dtype,
                                options=config.layer_options())
        self.model: torch.nn.Module
        self.operand: Any

    def _ready(self) -> None:
        """Call at the end of a subclass's ``__init__``: the optimiser over ``model``, the peer's RNG seeded."""
        self.optimizer = trainer_adam(self.model, self.config)  # type: ignore[arg-type]
        torch.manual_seed(self.config.seed)

    def train_epoch(self) -> float:
        """One full-graph step; returns the training loss (synchronises with the device to read it)."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        logits = self.model(self.features, self.operand)[self.train_mask]
        labels = self.labels[self.train_mask]
        if self.multilabel:
            loss = F.binary_cross_entropy_with_logits(logits, labels)
        else:
            loss = F.cross_entropy(logits, labels)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())


class PygPeer(WholeGraphPeer):
    """PyG's layers (``MIRRORS``) on the whole ``graph`` (not collective). Raises ``ImportError`` when
    ``torch_geometric`` is missing."""

    library = "the PyG peer"

    def __init__(self, graph: LocalGraph, config: TrainConfig, device: torch.device) -> None:
        import torch_geometric  # noqa: F401  (optional dependency: fail here, before any work)

        problem = mirror_problem(config.model)
        if problem is not None:
            raise ValueError(problem)
        super().__init__(graph, config, device)
        self.operand = MIRRORS[config.model].operand(graph.rows, self.dtype, device, self.notes)
        self.model = _PygModel(config.model, self.dims, config.dropout, self.start,
                               config.attention_dropout).to(self.dtype).to(device)
        self._ready()
