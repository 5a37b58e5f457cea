"""The PyG peer of ``sparse-dist bench minibatch``: ``NeighborLoader`` + ``SAGEConv``, one process.

The same model (initial weights copied from :class:`algorithms.model.GraphModel` with the same seed, as
:mod:`runners.bench.pyg_peer` does), the same fanouts and the same global batch (``P * B`` seeds a step)
as the distributed mini-batch run it stands beside; Adam with the trainer's learning rate and
weight-decay scope; test accuracy from an exact full-graph forward, as sparse-dist evaluates.

PyG samples with a compiled kernel from ``pyg-lib`` or ``torch-sparse``. Where neither imports (this
project's CPU environment: neither is on its package index for torch 2.13), :class:`NumpyNeighborSampler`
takes the kernel's place inside PyG's own ``NeighborSampler``: everything else (the loader, its
worker-less iteration, ``filter_data``, the batch ``Data``) is PyG's. Its semantics are the kernel's
(directional subgraph, uniform without replacement, hop 1 from the seeds first, ``-1`` = every
neighbour), vectorised with numpy per hop. The report says which sampler ran, since a compiled one
would be faster.

``torch_geometric`` is imported only inside the functions here (an ``ImportError`` propagates; the
caller skips the peer).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from algorithms.model import GraphModel
from algorithms.train import LocalGraph, TrainConfig, scaled_features
from runners.bench.pyg_peer import DTYPES, _PygModel, trainer_adam


PEER_KINDS: tuple[str, ...] = ("sage",)
"""The layer kinds the mini-batch peers mirror (this one and :mod:`runners.bench.minibatch_dgl`): both stack
``SAGEConv`` (mean) over a sampled block, which is GraphSAGE-mean's layer and no other's. A table, not a switch."""


def peer_problem(kind: str) -> str | None:
    """Why the mini-batch peers cannot mirror ``--layer-kind kind`` (one sentence), or None."""
    if kind in PEER_KINDS:
        return None
    return (f"the mini-batch peers mirror --layer-kind {', '.join(PEER_KINDS)} only (SAGEConv, mean): they have no "
            f"layer to copy the weights of --layer-kind {kind} into")


def timed(batches: Iterable[Any], waited: list[float]) -> Iterator[Any]:
    """The items of ``batches``; ``waited[0]`` gains the seconds each took to arrive (a peer's sampling time)."""
    iterator, end = iter(batches), object()
    while True:
        start = time.perf_counter()
        item = next(iterator, end)
        waited[0] += time.perf_counter() - start
        if item is end:
            return
        yield item


def train_epoch(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Iterable[Any],
                loss_of: Callable[[Any], torch.Tensor]) -> dict[str, float]:
    """One epoch of a peer: for each batch, ``loss_of(batch)`` (a mean over its seeds), backward, an optimiser
    step. Returns its seconds, the seconds spent waiting for batches (``sample``), the steps, the mean loss."""
    model.train()
    began, sampling, losses, steps = time.perf_counter(), [0.0], 0.0, 0
    for batch in timed(batches, sampling):
        optimizer.zero_grad(set_to_none=False)
        loss = loss_of(batch)
        loss.backward()
        optimizer.step()
        losses += float(loss.detach())
        steps += 1
    return {"seconds": time.perf_counter() - began, "sample": sampling[0], "steps": steps,
            "loss": losses / max(steps, 1)}


def compiled_sampler() -> str | None:
    """The name of the compiled neighbour-sampling kernel PyG would use here, or None."""
    import torch_geometric.typing as pyg_typing

    if pyg_typing.WITH_PYG_LIB:
        return "pyg-lib"
    if pyg_typing.WITH_TORCH_SPARSE:
        return "torch-sparse"
    return None


def _segments(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For segments ``[starts[s], starts[s] + lengths[s])``: every position, and the segment it lies in."""
    owner = np.repeat(np.arange(lengths.size), lengths)
    first = np.cumsum(lengths) - lengths
    return starts[owner] + (np.arange(owner.size) - first[owner]), owner


def sample_hops(colptr: np.ndarray, sources: np.ndarray, seeds: np.ndarray, fanouts: list[int],
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[int], list[int]]:
    """Directional uniform sampling without replacement over a CSC graph (``sources[colptr[v]:colptr[v+1]]``
    are the in-neighbours of ``v``), hop 1 from ``seeds`` first.

    Returns ``(node, row, col, edge, nodes_per_hop, edges_per_hop)`` as PyG's ``SamplerOutput`` wants them:
    ``node`` the sampled global ids (seeds first, then each hop's new nodes in order of first appearance),
    ``row``/``col`` the local ids of each sampled edge's source and destination, ``edge`` its CSC position.
    """
    node = np.asarray(seeds, dtype=np.int64)
    position = np.full(colptr.size - 1, -1, dtype=np.int64)
    position[node] = np.arange(node.size)
    frontier = node
    rows, cols, edges = [], [], []
    nodes_per_hop, edges_per_hop = [int(node.size)], []
    for fanout in fanouts:
        degree = colptr[frontier + 1] - colptr[frontier]
        entries, owner = _segments(colptr[frontier], degree)
        if fanout >= 0:
            keys = rng.random(entries.size)
            order = np.lexsort((keys, owner))  # by segment, then by key
            first = np.cumsum(degree) - degree
            rank = np.empty(entries.size, dtype=np.int64)
            rank[order] = np.arange(entries.size) - first[owner[order]]
            kept = rank < fanout
            entries, owner = entries[kept], owner[kept]
        neighbours = sources[entries]
        fresh = neighbours[position[neighbours] < 0]
        fresh = fresh[np.sort(np.unique(fresh, return_index=True)[1])]
        position[fresh] = node.size + np.arange(fresh.size)
        node = np.concatenate([node, fresh])
        rows.append(position[neighbours])
        cols.append(position[frontier[owner]])
        edges.append(entries)
        nodes_per_hop.append(int(fresh.size))
        edges_per_hop.append(int(entries.size))
        frontier = fresh
    return (node, np.concatenate(rows), np.concatenate(cols), np.concatenate(edges), nodes_per_hop, edges_per_hop)


def numpy_neighbor_sampler(data: Any, fanouts: list[int], seed: int) -> Any:
    """PyG's ``NeighborSampler`` on ``data`` with :func:`sample_hops` as its kernel (homogeneous graphs)."""
    from torch_geometric.sampler import NeighborSampler, SamplerOutput

    class NumpyNeighborSampler(NeighborSampler):
        """PyG's sampler; only the compiled kernel call is replaced."""

        def _sample(self, seed: torch.Tensor, seed_time: torch.Tensor | None = None, **kwargs: Any) -> Any:
            if seed_time is not None or self.disjoint or self.replace:
                raise NotImplementedError("the numpy kernel samples without time, disjointness or replacement")
            node, row, col, edge, nodes_per_hop, edges_per_hop = sample_hops(
                self._colptr, self._sources, seed.numpy(), list(self.num_neighbors.get_mapped_values()),
                self._rng)
            return SamplerOutput(node=torch.from_numpy(node), row=torch.from_numpy(row), col=torch.from_numpy(col),
                                 edge=torch.from_numpy(edge), batch=None, num_sampled_nodes=nodes_per_hop,
                                 num_sampled_edges=edges_per_hop)

    with warnings.catch_warnings():  # PyG's notice that pyg-lib is missing: the report says which kernel ran
        warnings.simplefilter("ignore", UserWarning)
        sampler = NumpyNeighborSampler(data, num_neighbors=fanouts)
    sampler._colptr = sampler.colptr.numpy()
    sampler._sources = sampler.row.numpy()
    sampler._rng = np.random.default_rng(seed)
    return sampler


class PygMinibatchPeer:
    """One process's PyG mini-batch training of ``config``'s model on the whole ``graph`` (not collective).

    ``fanouts`` hop 1 (the seeds' neighbours) first, ``None`` = every neighbour; ``batch_size`` seeds a
    step. Raises ``ImportError`` without ``torch_geometric``, ``ValueError`` for a model it does not mirror.
    """

    def __init__(self, graph: LocalGraph, config: TrainConfig, fanouts: list[int | None], batch_size: int) -> None:
        from torch_geometric.data import Data
        from torch_geometric.loader import NeighborLoader

        problem = peer_problem(config.model)
        if problem:
            raise ValueError(problem)
        if graph.rows.shape[0] != graph.rows.shape[1]:
            raise ValueError("the PyG peer needs the whole graph")
        dtype = DTYPES[config.dtype]
        self.config, self.notes = config, []
        matrix = sp.coo_matrix(sp.csr_matrix(graph.rows, dtype=np.float64))
        if matrix.nnz and not np.all(matrix.data == 1.0):
            self.notes.append("edge weights are not all 1: PyG's mean divides by the edge count")
        # PyG's edge (source -> target) carries A[target, source]: row i aggregates over its stored columns
        edge_index = torch.from_numpy(np.vstack([matrix.col, matrix.row]).astype(np.int64))
        features = scaled_features(graph.features, config.feature_norm)
        self.data = Data(x=torch.from_numpy(features).to(dtype), edge_index=edge_index,
                         y=torch.from_numpy(graph.labels), num_nodes=graph.rows.shape[0])
        self.train_ids = torch.from_numpy(np.flatnonzero(graph.masks["train"]))
        self.test_mask = torch.from_numpy(graph.masks["test"].astype(bool))
        numbers = [-1 if k is None else int(k) for k in fanouts]
        self.sampler_name = compiled_sampler()
        generator = torch.Generator().manual_seed(config.seed)
        kwargs: dict[str, Any] = {}
        if self.sampler_name is None:
            self.sampler_name = "numpy kernel inside PyG's NeighborSampler (no pyg-lib / torch-sparse here)"
            kwargs["neighbor_sampler"] = numpy_neighbor_sampler(self.data, numbers, config.seed)
        self.loader = NeighborLoader(self.data, num_neighbors=numbers, batch_size=batch_size,
                                     input_nodes=self.train_ids, shuffle=True, generator=generator, **kwargs)
        dims = [graph.features.shape[1]] + [config.hidden] * (config.layers - 1) + [graph.num_classes]
        start = GraphModel(config.model, dims, dropout=config.dropout, seed=config.seed, dtype=dtype,
                           options=config.layer_options())
        self.model = _PygModel(config.model, dims, config.dropout, start).to(dtype)
        self.optimizer = trainer_adam(self.model, config)
        torch.manual_seed(config.seed)

    def _forward(self, batch: Any) -> torch.Tensor:
        return self.model(batch.x, batch.edge_index)

    def train_epoch(self) -> dict[str, float]:
        """One pass over the training nodes in batches (:func:`train_epoch`; the sampling seconds are the
        waits for the loader's next batch: sampling, ``filter_data`` and the batch's features)."""
        def loss_of(batch: Any) -> torch.Tensor:
            logits = self._forward(batch)[:batch.batch_size]
            return F.cross_entropy(logits, batch.y[:batch.batch_size])

        return train_epoch(self.model, self.optimizer, self.loader, loss_of)

    @torch.no_grad()
    def test_accuracy(self) -> float:
        """Exact full-graph forward, accuracy over the test rows."""
        self.model.eval()
        logits = self._forward(self.data)
        return float((logits[self.test_mask].argmax(1) == self.data.y[self.test_mask]).double().mean())
