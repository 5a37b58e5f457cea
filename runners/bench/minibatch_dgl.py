"""The DGL peer of ``sparse-dist bench minibatch --peer dgl``: ``dgl.dataloading.NeighborSampler`` + ``SAGEConv``.

One process on the whole graph, as the PyG peer (:mod:`runners.bench.minibatch_peer`): the same model
(SAGE-mean, initial weights copied from :class:`algorithms.model.GraphModel` with the same seed), the same
fanouts, the same global batch (``P * B`` seeds a step, so both take the same steps per epoch), Adam with the
trainer's learning rate and weight-decay scope, dropout on every layer's input, test accuracy from an exact
full-graph forward. DGL samples with its compiled C++ kernel (``libdgl``, OpenMP), which is what makes it the
named peer of the compiled sampler (issue 41).

Fanouts: ours count hops from the seeds (``fanouts[0]`` builds the last layer's block); DGL's
``NeighborSampler`` takes one per layer from the input side, so it is given ours reversed. ``None`` ("all")
is DGL's ``-1``. Each row ``i`` of the adjacency aggregates over its stored columns, so DGL's in-edges of
``i`` are those columns (edges ``column -> i``), as the PyG peer does.

Threads: DGL's C++ kernels run on their own OpenMP pool; it is given torch's thread count at construction
(the bench's ``threads * P``), so sampler and model use the threads the report states.

Figures per epoch: ``seconds`` (the whole epoch), ``sample`` (seconds spent waiting for the loader's next
batch inside training: sampling and block construction) and, apart, :meth:`DglMinibatchPeer.sample_epoch`:
one pass of the loader with no training (the sampler alone).

Installing: ``dgl==2.1.0`` (the optional extra ``dgl``: ``pip install -c constraints.txt -e '.[dgl]'``)
runs beside torch 2.13 except for one part: its ``graphbolt`` package loads a C++ library built only for
torch <= 2.2 at import, and ``import dgl`` imports it (through ``dgl.distributed``). Graphbolt is DGL's new
loading pipeline, used by its distributed training only; the classic ``NeighborSampler`` and ``DataLoader``
do not touch it. So where that library is missing for this torch, :func:`import_dgl` registers an empty
stand-in module for ``dgl.graphbolt`` before the import, and the peer's notes say so. ``dgl`` is imported
only inside functions here.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from algorithms.model import GraphModel
from algorithms.train import LocalGraph, TrainConfig, scaled_features
from runners.bench.minibatch_peer import peer_problem, train_epoch
from runners.bench.pyg_peer import DTYPES, trainer_adam

GRAPHBOLT_NOTE = ("dgl.graphbolt (DGL's distributed pipeline; its C++ library is built for torch <= 2.2 only) "
                  "is replaced by an empty stand-in so that `import dgl` works beside torch {torch}; the "
                  "classic NeighborSampler and the nn layers do not use it")


def dgl_problem() -> str | None:
    """Why the DGL peer cannot run here (checked before MPI starts, without importing dgl), or None."""
    if importlib.util.find_spec("dgl") is None:
        return ("--peer dgl: dgl is not installed; install the optional extra "
                "(pip install -c constraints.txt -e '.[dgl]') or choose --peer pyg or --peer none")
    return None


def import_dgl() -> tuple[Any, list[str]]:
    """``dgl`` (with the pytorch backend) and the notes on what was done to import it (module docstring)."""
    os.environ.setdefault("DGLBACKEND", "pytorch")
    notes: list[str] = []
    if "dgl" not in sys.modules:
        spec = importlib.util.find_spec("dgl")
        if spec is None or spec.origin is None:
            raise ImportError("dgl is not installed")
        version = torch.__version__.split("+", maxsplit=1)[0]
        library = Path(spec.origin).parent / "graphbolt" / f"libgraphbolt_pytorch_{version}.so"
        if not library.exists() and "dgl.graphbolt" not in sys.modules:
            sys.modules["dgl.graphbolt"] = types.ModuleType("dgl.graphbolt")
            notes.append(GRAPHBOLT_NOTE.format(torch=version))
    elif isinstance(sys.modules.get("dgl.graphbolt"), types.ModuleType) and \
            not hasattr(sys.modules["dgl.graphbolt"], "__file__"):
        notes.append(GRAPHBOLT_NOTE.format(torch=torch.__version__.split("+", maxsplit=1)[0]))
    import dgl

    return dgl, notes


class _DglSage(torch.nn.Module):
    """DGL ``SAGEConv`` (mean) layers with ``start``'s weights; dropout on every input, ReLU between layers."""

    def __init__(self, dims: list[int], dropout: float, start: GraphModel) -> None:
        super().__init__()
        from dgl.nn import SAGEConv  # optional dependency (imported through import_dgl first)

        self.dropout = dropout
        self.convs = torch.nn.ModuleList()
        with torch.no_grad():
            for layer, (fan_in, fan_out) in enumerate(zip(start.widths[:-1], dims[1:])):
                conv = SAGEConv(fan_in, fan_out, "mean", bias=True)
                conv.fc_self.weight.copy_(start.weights[layer].T)
                conv.fc_neigh.weight.copy_(start.neighbour_weights[layer].T)
                conv.fc_self.bias.copy_(start.biases[layer])
                self.convs.append(conv)

    def forward(self, blocks: list[Any], x: torch.Tensor) -> torch.Tensor:
        h = x
        for layer, (conv, block) in enumerate(zip(self.convs, blocks)):
            h = F.dropout(h, p=self.dropout, training=self.training)
            h = conv(block, h)
            if layer < len(self.convs) - 1:
                h = torch.relu(h)
        return h


class DglMinibatchPeer:
    """One process's DGL mini-batch training of ``config``'s model on the whole ``graph`` (not collective).

    ``fanouts``: hop 1 (the seeds' neighbours) first, ``None`` = every neighbour; ``batch_size`` seeds a step.
    Raises ``ImportError`` without dgl, ``ValueError`` for a model it does not mirror.
    """

    def __init__(self, graph: LocalGraph, config: TrainConfig, fanouts: list[int | None], batch_size: int) -> None:
        dgl, self.notes = import_dgl()
        problem = peer_problem(config.model)
        if problem:
            raise ValueError(problem)
        if graph.rows.shape[0] != graph.rows.shape[1]:
            raise ValueError("the DGL peer needs the whole graph")
        dtype = DTYPES[config.dtype]
        self.config = config
        matrix = sp.coo_matrix(sp.csr_matrix(graph.rows, dtype=np.float64))
        if matrix.nnz and not np.all(matrix.data == 1.0):
            self.notes.append("edge weights are not all 1: DGL's mean divides by the edge count")
        n = graph.rows.shape[0]
        # in-edges of node i are row i's stored columns: edges column -> i
        self.graph = dgl.graph((torch.from_numpy(matrix.col.astype(np.int64)),
                                torch.from_numpy(matrix.row.astype(np.int64))), num_nodes=n)
        self.features = torch.from_numpy(scaled_features(graph.features, config.feature_norm)).to(dtype)
        self.labels = torch.from_numpy(graph.labels)
        self.train_ids = torch.from_numpy(np.flatnonzero(graph.masks["train"]).astype(np.int64))
        self.test_mask = torch.from_numpy(graph.masks["test"].astype(bool))
        layer_fanouts = [-1 if k is None else int(k) for k in reversed(fanouts)]  # DGL: input layer first
        self.sampler_name = f"DGL {dgl.__version__} NeighborSampler (compiled C++ kernel)"
        dgl.utils.internal.set_num_threads(torch.get_num_threads())  # DGL's own OpenMP: the peer's thread count
        dgl.seed(config.seed)
        torch.manual_seed(config.seed)
        self.loader = dgl.dataloading.DataLoader(self.graph, self.train_ids,
                                                 dgl.dataloading.NeighborSampler(layer_fanouts),
                                                 batch_size=batch_size, shuffle=True, drop_last=False)
        dims = [graph.features.shape[1]] + [config.hidden] * (config.layers - 1) + [graph.num_classes]
        start = GraphModel(config.model, dims, dropout=config.dropout, seed=config.seed, dtype=dtype,
                           options=config.layer_options())
        self.model = _DglSage(dims, config.dropout, start).to(dtype)
        self.optimizer = trainer_adam(self.model, config)  # type: ignore[arg-type]  # .convs as the PyG model's

    def train_epoch(self) -> dict[str, float]:
        """One pass over the training nodes in batches (:func:`runners.bench.minibatch_peer.train_epoch`: seconds,
        sampling seconds, steps, the mean loss)."""
        def loss_of(item: tuple[torch.Tensor, torch.Tensor, list[Any]]) -> torch.Tensor:
            input_nodes, output_nodes, blocks = item
            logits = self.model(blocks, self.features.index_select(0, input_nodes))
            return F.cross_entropy(logits, self.labels.index_select(0, output_nodes))

        return train_epoch(self.model, self.optimizer, self._batches(), loss_of)

    def sample_epoch(self) -> float:
        """Seconds of one pass of the loader alone (the sampler's epoch, no training)."""
        start = time.perf_counter()
        for _ in self._batches():
            pass
        return time.perf_counter() - start

    def _batches(self) -> Any:
        """An iterator over the loader, without DGL's advice to pin dataloader threads to cores (a run
        here keeps the threads it was given)."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Dataloader CPU affinity opt is not enabled")
            return iter(self.loader)

    @torch.no_grad()
    def test_accuracy(self) -> float:
        """Exact full-graph forward (every layer on the whole graph), accuracy over the test rows."""
        self.model.eval()
        logits = self.model([self.graph] * len(self.model.convs), self.features)
        return float((logits[self.test_mask].argmax(1) == self.labels[self.test_mask]).double().mean())
