"""Exchange plans of the distributed SpMM ``T = A H`` and its transpose ``dH = A^T dT``.

All three plans of DESIGN section 3, over one replica column (``col_comm``,
the ``G`` ranks sharing a replica index; in 1D that is every rank):

* ``dense-bcast`` (CAGNET 1D): owner ``j`` broadcasts all of ``H_j``.
* ``sparse-bcast``: owner ``j`` broadcasts only the rows ``B_j``.
* ``p2p``: owner ``j`` sends rows ``B_ij`` to each ``i`` (one alltoallv).

The transposes are the reverse exchanges: a reduce to the owner for the
broadcast plans, the reverse alltoallv for ``p2p``, each summing the
pieces ``A_ij^T dT_i`` that every rank computes locally. This is exact for
non-symmetric ``A``; no global ``A^T`` is formed (each rank transposes its own
blocks, lazily, on the first backward).

Overlap: the bcast plans post the next block's non-blocking broadcast
(reduce) before multiplying the current block (prefetch depth 1); ``p2p``
posts its alltoallv and multiplies the local block meanwhile. How much of
the transfer is really hidden depends on the MPI library's asynchronous
progress (e.g. ``MPICH_ASYNC_PROGRESS=1``).

A plan computes this rank's partial result only; :class:`sparse_dist.spmm.DistSpMM`
completes it across the replicas of a row group on the 1.5D grid.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.accounting import ComputeTimer
from sparse_dist.comm import Pending
from sparse_dist.dcsr import DistCSR
from sparse_dist.policy import BoundarySampler, ExchangeContext, StalenessRule, StalenessView

PLAN_NAMES: tuple[str, ...] = ("dense-bcast", "sparse-bcast", "p2p")


def torch_csr(matrix: sp.csr_matrix, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A torch sparse CSR tensor with the same structure (shares index memory on CPU)."""
    matrix = sp.csr_matrix(matrix)
    index_dtype = np.int64 if max(matrix.nnz, *matrix.shape) >= 2**31 - 1 else np.int32
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        tensor = torch.sparse_csr_tensor(
            torch.from_numpy(np.ascontiguousarray(matrix.indptr, dtype=index_dtype)),
            torch.from_numpy(np.ascontiguousarray(matrix.indices, dtype=index_dtype)),
            torch.from_numpy(np.ascontiguousarray(matrix.data)).to(dtype),
            size=matrix.shape, check_invariants=False,
        )
    return tensor.to(device)


def csr_bytes(tensor: torch.Tensor) -> int:
    """Bytes of a torch sparse CSR tensor's three arrays."""
    parts = (tensor.crow_indices(), tensor.col_indices(), tensor.values())
    return sum(part.numel() * part.element_size() for part in parts)


def is_symmetric(matrix: sp.csr_matrix) -> bool:
    """Whether ``matrix`` equals its transpose bitwise (structure and values)."""
    if matrix.shape[0] != matrix.shape[1]:
        return False
    mine = sp.csr_matrix(matrix)
    mine.sort_indices()
    flipped = sp.csr_matrix(matrix.T)
    flipped.sort_indices()
    return (mine.nnz == flipped.nnz and np.array_equal(mine.indptr, flipped.indptr)
            and np.array_equal(mine.indices, flipped.indices) and np.array_equal(mine.data, flipped.data))


def remap_columns(block: sp.csr_matrix, positions: np.ndarray, width: int) -> sp.csr_matrix:
    """``block`` with its columns renumbered: old column ``ids[k]`` becomes ``positions[k]``.

    ``positions`` is indexed by the block's sorted distinct column ids.
    """
    ids = np.unique(block.indices)
    new_indices = positions[np.searchsorted(ids, block.indices)]
    return sp.csr_matrix((block.data, new_indices, block.indptr), shape=(block.shape[0], width))


def keep_columns(block: sp.csr_matrix, keep: np.ndarray, scale: float) -> sp.csr_matrix:
    """``block`` restricted to the columns where ``keep`` is true, renumbered densely, values times ``scale``."""
    kept_entry = keep[block.indices]
    new_position = np.cumsum(keep) - 1
    cumulative = np.concatenate(([0], np.cumsum(kept_entry)))
    return sp.csr_matrix((block.data[kept_entry] * scale, new_position[block.indices[kept_entry]],
                          cumulative[block.indptr]), shape=(block.shape[0], int(keep.sum())))


def _run_pipelined(items: list[int], post: Callable[[int], tuple[Pending | None, object]],
                   consume: Callable[[int, object], None]) -> None:
    """Post item k+1's exchange before consuming item k (prefetch depth 1)."""
    if not items:
        return
    in_flight = post(items[0])
    for k, item in enumerate(items):
        following = post(items[k + 1]) if k + 1 < len(items) else None
        pending, payload = in_flight
        if pending is not None:
            pending.wait()
        consume(item, payload)
        in_flight = following  # type: ignore[assignment]


class _Output:
    """A product's output rows: the first sparse product writes them (``beta = 0``, no zero fill
    pass over the output), later ones accumulate; :meth:`tensor` zero-fills only if none wrote."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer
        self._written = False

    def add_product(self, a: torch.Tensor, x: torch.Tensor) -> None:
        self._buffer.addmm_(a, x, beta=1.0 if self._written else 0.0)
        self._written = True

    def tensor(self) -> torch.Tensor:
        if not self._written:
            self._buffer.zero_()
            self._written = True
        return self._buffer


class ExchangePlan(ABC):
    """One way of moving ``H`` rows between ranks; owns the blocks in the form it needs."""

    name: str

    def __init__(self, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer,
                 sampler: BoundarySampler | None = None, staleness: StalenessRule | None = None) -> None:
        self.sampler = sampler if sampler is not None and sampler.p < 1.0 else None  # p = 1 is the exact path
        self.staleness = staleness
        self.matrix = matrix
        self.dtype = dtype
        self.device = device
        self.timer = timer
        self.col_comm = matrix.col_comm
        self.group = matrix.group
        self.n_rows = matrix.lshape[0]
        self._transposed: dict[object, torch.Tensor] = {}
        self.local_block: torch.Tensor | None = None  # the diagonal block A_gg as a CSR (set by the plans)

    def _csr(self, matrix: sp.csr_matrix) -> torch.Tensor:
        return torch_csr(matrix, self.dtype, self.device)

    def _transpose_of(self, key: object, matrix: sp.csr_matrix) -> torch.Tensor:
        """The (cached) CSR of ``matrix.T``, built locally on first use.

        The local diagonal block of a symmetric matrix (GCN on an undirected graph: the whole
        matrix at P = 1) is its own transpose: the forward CSR is reused, so no second copy of
        the largest block is stored. Directed graphs get the transposed copy (exact either way).
        """
        if key not in self._transposed:
            if key == "local" and self.local_block is not None and is_symmetric(matrix):
                self._transposed[key] = self.local_block
            else:
                self._transposed[key] = self._csr(sp.csr_matrix(matrix.T))
        return self._transposed[key]

    def transpose_bytes(self) -> int:
        """Bytes of the transposed blocks this rank stores (a symmetric local block reuses its forward CSR)."""
        return sum(csr_bytes(t) for t in self._transposed.values() if t is not self.local_block)

    def _output(self, rows: int, width: int) -> "_Output":
        return _Output(torch.empty(rows, width, dtype=self.dtype, device=self.device))

    def _multiply_into(self, out: "_Output", a: torch.Tensor, x: torch.Tensor) -> None:
        """``out += a @ x`` timed as local SpMM (with events on CUDA: no device synchronisation)."""
        if a._nnz() == 0:
            return
        with self.timer.measure("local_spmm", self.device):
            out.add_product(a, x)

    def _product(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        out = self._output(a.shape[0], x.shape[1])
        self._multiply_into(out, a, x)
        return out.tensor()

    def _sample_scale(self) -> float:
        """``1/p`` for kept boundary columns (p = 0 keeps none, so the scale is never used)."""
        assert self.sampler is not None
        return 1.0 / self.sampler.p if self.sampler.p > 0 else 0.0

    def _policy_active(self, context: ExchangeContext | None) -> bool:
        return context is not None and context.training and (self.sampler is not None or self.staleness is not None)

    def policy_state(self) -> dict[str, object]:
        """Per-rank policy state to checkpoint (caches, versions); empty for exact plans."""
        return {}

    def load_policy_state(self, state: dict[str, object]) -> None:
        if state:
            raise ValueError(f"plan {self.name} keeps no policy state, but the checkpoint has some")

    def cache_bytes(self) -> int:
        """Bytes held in historical-block caches on this rank."""
        return 0

    @abstractmethod
    def forward(self, h: torch.Tensor, phase: str, context: ExchangeContext | None = None) -> torch.Tensor:
        """This rank's partial ``sum_j A_gj H_j`` over its column share (``n_g x F``)."""

    @abstractmethod
    def transpose(self, dt: torch.Tensor, phase: str, context: ExchangeContext | None = None) -> torch.Tensor:
        """This rank's ``dH_g`` summed over the row groups of its replica column (``n_g x F``)."""


@dataclass
class _Message:
    """What one layer's forward used from owner ``j``; its transpose mirrors it exactly."""

    count: int                         # rows in the message, the same on every rank of the column
    fresh: bool                        # False: receivers reused their cached block (owner STALE)
    block: sp.csr_matrix | None        # receiver: A_gj with columns numbered as message rows (scaled)
    owner_rows: torch.Tensor | None    # owner: its local row ids in the message (None: all rows)


@dataclass
class _CachedBlock:
    """A receiver's historical block from one owner in one layer (never aliased to a receive buffer)."""

    block: sp.csr_matrix
    block_torch: torch.Tensor
    values: torch.Tensor
    version: int


class _BroadcastPlan(ExchangePlan):
    """Shared loop of the two broadcast plans; they differ in which owner rows travel.

    With policies (training only): owner-side boundary sampling (each owner
    samples ``B_j`` once per epoch and broadcasts the kept rows, receivers
    scale kept columns by ``1/p``), and SANCUS-style caching: an owner the
    staleness rule marks STALE skips its broadcast and receivers multiply
    their cached block. Gradients of a stale block still go back to the owner
    (reduce) unless the rule says ``skip_backward``.
    """

    def __init__(self, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer,
                 sampler: BoundarySampler | None = None, staleness: StalenessRule | None = None) -> None:
        super().__init__(matrix, dtype, device, timer, sampler, staleness)
        self.local_block = self._csr(matrix.blocks[self.group]) if self.group in matrix.blocks else None
        self.remote_blocks: dict[int, sp.csr_matrix] = {j: self._remote_form(j, block)
                                                        for j, block in matrix.blocks.items() if j != self.group}
        self.remote_torch = {j: self._csr(block) for j, block in self.remote_blocks.items()}
        owner_rows = self._owner_rows()
        self.send_index = torch.from_numpy(owner_rows).to(device) if owner_rows is not None else None
        self.versions: dict[int, np.ndarray] = {}
        self.message_counts: dict[tuple[int, int], int] = {}
        self.cache: dict[tuple[int, int], _CachedBlock] = {}
        self.sent_rows: dict[int, torch.Tensor | None] = {}
        self.sent_reference: dict[int, torch.Tensor] = {}
        self.used: dict[int, dict[int, _Message]] = {}
        self.decisions: list[dict[str, object]] = []
        self._sample_epoch: int | None = None
        self._sample: dict[int, np.ndarray] = {}
        self.boundary_of = self._share_boundaries() if self.sampler is not None else {}

    @abstractmethod
    def _remote_form(self, j: int, block: sp.csr_matrix) -> sp.csr_matrix:
        """Block ``A_gj`` with columns numbered as rows of the broadcast buffer."""

    @abstractmethod
    def _owner_rows(self) -> np.ndarray | None:
        """Rows of ``H_g`` this rank broadcasts (None: all of them)."""

    @abstractmethod
    def _message_rows(self, j: int) -> int:
        """Rows in owner ``j``'s exact broadcast (the same on every rank)."""

    def _exchanged(self) -> list[int]:
        return [j for j in self.matrix.column_share if self._message_rows(j) > 0]

    # ------------------------------------------------------------ exact path
    def forward(self, h: torch.Tensor, phase: str, context: ExchangeContext | None = None) -> torch.Tensor:
        if self._policy_active(context):
            assert context is not None
            return self._policy_forward(h, phase, context)
        width = h.shape[1]
        out = self._output(self.n_rows, width)
        if self.local_block is not None and self.group not in self._exchanged():
            self._multiply_into(out, self.local_block, h)

        def post(j: int) -> tuple[Pending, torch.Tensor]:
            if j == self.group:
                buffer = h if self.send_index is None else h.index_select(0, self.send_index)
            else:
                buffer = torch.empty(self._message_rows(j), width, dtype=self.dtype, device=self.device)
            return self.col_comm.ibcast_(buffer, root=j, phase=phase), buffer

        def consume(j: int, buffer: object) -> None:
            if j == self.group:
                if self.local_block is not None:
                    self._multiply_into(out, self.local_block, h)
            elif j in self.remote_torch:
                self._multiply_into(out, self.remote_torch[j], buffer)  # type: ignore[arg-type]

        _run_pipelined(self._exchanged(), post, consume)
        return out.tensor()

    def transpose(self, dt: torch.Tensor, phase: str, context: ExchangeContext | None = None) -> torch.Tensor:
        if self._policy_active(context):
            assert context is not None
            messages = self.used[context.layer]
        else:
            messages = {j: _Message(self._message_rows(j), True, self.remote_blocks.get(j),
                                    self.send_index if j == self.group else None) for j in self._exchanged()}
        skip_stale = self.staleness is not None and self.staleness.skip_backward
        width = dt.shape[1]
        out = self._output(self.n_rows, width)
        if self.local_block is not None:
            self._multiply_into(out, self._transpose_of("local", self.matrix.blocks[self.group]), dt)
        previous: tuple[Pending, torch.Tensor | None, torch.Tensor | None] | None = None
        for j, message in messages.items():
            if message.count == 0 or (skip_stale and not message.fresh):
                continue
            if j == self.group:
                # Owner: receive the sum in place into a zeroed message buffer.
                result = torch.zeros(message.count, width, dtype=self.dtype, device=self.device)
                current = (self.col_comm.ireduce(None, result, root=j, phase=phase), result, message.owner_rows)
            else:
                if message.block is None:
                    piece = torch.zeros(message.count, width, dtype=self.dtype, device=self.device)
                elif message.block is self.remote_blocks.get(j):
                    piece = self._product(self._transpose_of(j, message.block), dt)
                else:
                    piece = self._product(self._csr(sp.csr_matrix(message.block.T)), dt)
                current = (self.col_comm.ireduce(piece, None, root=j, phase=phase), None, None)
            if previous is not None:
                self._finish_reduce(out, *previous)
            previous = current
        if previous is not None:
            self._finish_reduce(out, *previous)
        return out.tensor()

    @staticmethod
    def _finish_reduce(out: _Output, pending: Pending, result: torch.Tensor | None,
                       rows: torch.Tensor | None) -> None:
        pending.wait()
        if result is not None:
            if rows is None:
                out.tensor().add_(result)
            else:
                out.tensor().index_add_(0, rows, result)

    # ----------------------------------------------------------- policy path
    def _share_boundaries(self) -> dict[int, np.ndarray]:
        """``B_j`` ids of every owner in this column's share, broadcast once at set-up (phase ``other``)."""
        boundaries = {}
        for j in self._exchanged():
            if j == self.group:
                ids = torch.from_numpy(self.matrix.union_ids.astype(np.int64))
            else:
                ids = torch.empty(int(self.matrix.union_sizes[j]), dtype=torch.int64)
            self.col_comm.bcast_(ids, root=j, phase="other")
            boundaries[j] = ids.numpy()
        return boundaries

    def _kept(self, epoch: int, j: int) -> np.ndarray:
        """Owner ``j``'s sample of ``B_j`` for ``epoch`` (computed identically on every rank)."""
        if self._sample_epoch != epoch:
            self._sample_epoch, self._sample = epoch, {}
        if j not in self._sample:
            assert self.sampler is not None
            global_rows = self.boundary_of[j] + self.matrix.layout.offsets[j]
            self._sample[j] = np.asarray(self.sampler.keep(epoch, j, global_rows), dtype=bool)
        return self._sample[j]

    def _fresh_message(self, epoch: int, j: int) -> _Message:
        if self.sampler is None:
            return _Message(self._message_rows(j), True, self.remote_blocks.get(j),
                            self.send_index if j == self.group else None)
        kept = self._kept(epoch, j)
        owner_rows = torch.from_numpy(self.boundary_of[j][kept]).to(self.device) if j == self.group else None
        block = keep_columns(self.remote_blocks[j], kept, self._sample_scale()) if j in self.remote_blocks else None
        return _Message(int(kept.sum()), True, block, owner_rows)

    def _stale_message(self, layer: int, j: int) -> _Message:
        entry = self.cache.get((layer, j))
        return _Message(self.message_counts[(layer, j)], False, entry.block if entry else None,
                        self.sent_rows.get(layer) if j == self.group else None)

    def _broadcastable(self, h: torch.Tensor) -> torch.Tensor:
        return h if self.send_index is None else h.index_select(0, self.send_index)

    def _decide(self, context: ExchangeContext, h: torch.Tensor) -> np.ndarray:
        groups = self.matrix.grid.groups
        versions = self.versions.setdefault(context.layer, np.full(groups, -1, dtype=np.int64))
        if self.staleness is None:
            return np.ones(groups, dtype=bool)
        cached = np.full(groups, -1, dtype=np.int64)
        for j in self._exchanged():
            entry = self.cache.get((context.layer, j))
            if entry is not None:
                cached[j] = entry.version
        gap = None
        if self.staleness.needs_gap and self.group in self._exchanged():
            reference = self.sent_reference.get(context.layer)
            if reference is None:
                gap = float("inf")
            else:
                current = self._broadcastable(h.detach())
                gap = float(torch.linalg.norm(current - reference) / max(float(torch.linalg.norm(reference)), 1e-30))
        view = StalenessView(context.epoch, context.layer, self.group, self._exchanged(), versions.copy(), cached, gap)
        active = np.asarray(self.staleness.decide(view, self.col_comm), dtype=bool).copy()
        active |= versions < 0  # nothing cached yet: the owner must send
        return active

    def _policy_forward(self, h: torch.Tensor, phase: str, context: ExchangeContext) -> torch.Tensor:
        layer, epoch = context.layer, context.epoch
        width = h.shape[1]
        out = self._output(self.n_rows, width)
        active = self._decide(context, h)
        if self.local_block is not None:
            self._multiply_into(out, self.local_block, h)
        messages: dict[int, _Message] = {}
        for j in self._exchanged():
            if active[j]:
                messages[j] = self._fresh_message(epoch, j)
                self.versions[layer][j] = epoch
                self.message_counts[(layer, j)] = messages[j].count
            else:
                messages[j] = self._stale_message(layer, j)
        if self.staleness is not None and self.group in messages and messages[self.group].fresh:
            self.sent_rows[layer] = messages[self.group].owner_rows
            if self.staleness.needs_gap:
                self.sent_reference[layer] = self._broadcastable(h.detach()).clone()

        def post(j: int) -> tuple[Pending, torch.Tensor]:
            message = messages[j]
            if j == self.group:
                buffer = h if message.owner_rows is None else h.index_select(0, message.owner_rows)
            else:
                buffer = torch.empty(message.count, width, dtype=self.dtype, device=self.device)
            return self.col_comm.ibcast_(buffer, root=j, phase=phase), buffer

        def consume(j: int, buffer: object) -> None:
            message = messages[j]
            if j == self.group or message.block is None:
                return
            block_torch = self.remote_torch[j] if message.block is self.remote_blocks.get(j) else self._csr(message.block)
            self._multiply_into(out, block_torch, buffer)  # type: ignore[arg-type]
            if self.staleness is not None:
                # The receive buffer is fresh per call, so the cache never aliases a later broadcast.
                self.cache[(layer, j)] = _CachedBlock(message.block, block_torch, buffer.detach(), epoch)  # type: ignore[union-attr]

        _run_pipelined([j for j, m in messages.items() if m.fresh and m.count > 0], post, consume)
        for j, message in messages.items():
            entry = self.cache.get((layer, j))
            if j == self.group or message.block is None:
                continue
            if message.fresh and message.count == 0 and self.staleness is not None:
                empty = torch.empty(0, width, dtype=self.dtype, device=self.device)
                self.cache[(layer, j)] = _CachedBlock(message.block, self._csr(message.block), empty, epoch)
            elif not message.fresh and entry is not None and entry.values.shape[0] > 0:
                self._multiply_into(out, entry.block_torch, entry.values)
        self.used[layer] = messages
        if self.staleness is not None:
            self.decisions.append({"epoch": epoch, "layer": layer, "owners": len(self._exchanged()),
                                   "active": [int(j) for j in self._exchanged() if active[j]]})
        return out.tensor()

    # ------------------------------------------------------------ state
    def cache_bytes(self) -> int:
        total = sum(entry.values.numel() * entry.values.element_size() + entry.block.data.nbytes
                    + entry.block.indices.nbytes + entry.block.indptr.nbytes for entry in self.cache.values())
        return int(total + sum(r.numel() * r.element_size() for r in self.sent_reference.values()))

    def policy_state(self) -> dict[str, object]:
        if self.staleness is None:
            return {}
        def tensor(array: np.ndarray) -> torch.Tensor:  # checkpoints hold tensors, never pickled arrays
            return torch.from_numpy(np.array(array, copy=True))

        return {
            "versions": {layer: tensor(v) for layer, v in self.versions.items()},
            "message_counts": dict(self.message_counts),
            "cache": {key: {"indptr": tensor(e.block.indptr), "indices": tensor(e.block.indices),
                            "data": tensor(e.block.data), "shape": list(e.block.shape), "values": e.values.cpu(),
                            "version": e.version}
                      for key, e in self.cache.items()},
            "sent_rows": {layer: None if rows is None else rows.cpu() for layer, rows in self.sent_rows.items()},
            "sent_reference": {layer: ref.cpu() for layer, ref in self.sent_reference.items()},
        }

    def load_policy_state(self, state: dict[str, object]) -> None:
        if self.staleness is None:
            super().load_policy_state(state)
            return
        self.versions = {int(k): v.numpy().copy() for k, v in state["versions"].items()}  # type: ignore[union-attr]
        self.message_counts = {tuple(k): int(v) for k, v in state["message_counts"].items()}  # type: ignore[union-attr]
        self.cache = {}
        for key, e in state["cache"].items():  # type: ignore[union-attr]
            block = sp.csr_matrix((e["data"].numpy(), e["indices"].numpy(), e["indptr"].numpy()),
                                  shape=tuple(e["shape"]))
            self.cache[tuple(key)] = _CachedBlock(block, self._csr(block), e["values"].to(self.device), int(e["version"]))
        self.sent_rows = {int(k): None if v is None else v.to(self.device)
                          for k, v in state["sent_rows"].items()}  # type: ignore[union-attr]
        self.sent_reference = {int(k): v.to(self.device) for k, v in state["sent_reference"].items()}  # type: ignore[union-attr]


class DenseBroadcastPlan(_BroadcastPlan):
    """CAGNET 1D: every owner broadcasts its whole block of ``H``."""

    name = "dense-bcast"

    def __init__(self, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer,
                 sampler: BoundarySampler | None = None, staleness: StalenessRule | None = None) -> None:
        problem = unsupported_policy(self.name, sampling=sampler is not None and sampler.p < 1.0, staleness=False)
        if problem:
            raise ValueError(problem)
        super().__init__(matrix, dtype, device, timer, sampler, staleness)

    def _remote_form(self, j: int, block: sp.csr_matrix) -> sp.csr_matrix:
        return block

    def _owner_rows(self) -> np.ndarray | None:
        return None

    def _message_rows(self, j: int) -> int:
        return self.matrix.layout.count(j)


class SparseBroadcastPlan(_BroadcastPlan):
    """Sparsity-aware broadcast: owner ``j`` broadcasts rows ``B_j`` only."""

    name = "sparse-bcast"

    def _remote_form(self, j: int, block: sp.csr_matrix) -> sp.csr_matrix:
        return remap_columns(block, self.matrix.union_positions[j], int(self.matrix.union_sizes[j]))

    def _owner_rows(self) -> np.ndarray | None:
        return self.matrix.union_ids.astype(np.int64)

    def _message_rows(self, j: int) -> int:
        return int(self.matrix.union_sizes[j])


class PointToPointPlan(ExchangePlan):
    """BNS-GCN's vanilla partition parallelism: owner ``j`` sends ``B_ij`` to each ``i`` (alltoallv).

    With a boundary sampler (training only) each pair's rows are sampled per
    epoch, receiver-side (stream = receiver, as BNS-GCN) or owner-side
    (stream = owner); both sides compute the same sample, so the counts need
    no extra exchange. Kept columns are scaled by ``1/p`` in the forward and,
    through the transposed block, in the backward.
    """

    name = "p2p"

    def __init__(self, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer,
                 sampler: BoundarySampler | None = None, staleness: StalenessRule | None = None) -> None:
        problem = unsupported_policy(self.name, sampling=False, staleness=staleness is not None)
        if problem:
            raise ValueError(problem)
        super().__init__(matrix, dtype, device, timer, sampler, staleness)
        groups = matrix.grid.groups
        self.local_block = self._csr(matrix.blocks[self.group]) if self.group in matrix.blocks else None
        self.recv_rows = [int(matrix.recv_ids[j].size) if j in matrix.recv_ids else 0 for j in range(groups)]
        self.send_rows = [int(matrix.send_ids[i].size) if i in matrix.send_ids else 0 for i in range(groups)]
        send_ids = [matrix.send_ids[i] for i in range(groups) if i in matrix.send_ids]
        self.send_index = torch.from_numpy(np.concatenate(send_ids).astype(np.int64) if send_ids
                                           else np.empty(0, np.int64)).to(device)
        # One CSR over the concatenated receive buffer (segments in owner order).
        starts = np.concatenate(([0], np.cumsum(self.recv_rows)))
        remote = [remap_columns(matrix.blocks[j], np.arange(starts[j], starts[j + 1]), int(starts[-1]))
                  for j in range(groups) if j in matrix.recv_ids]
        self.remote_matrix = (sp.csr_matrix(sum(remote[1:], remote[0])) if remote
                              else sp.csr_matrix((self.n_rows, 0)))
        self.remote_block = self._csr(self.remote_matrix)
        share = matrix.column_share
        self.any_traffic = bool(sum(int(matrix.boundary_counts[i, j]) for j in share
                                    for i in range(groups) if i != j) > 0)
        self._sample_epoch: int | None = None
        self._sample: tuple | None = None

    def _exchange_shape(self, context: ExchangeContext | None) -> tuple:
        """(send_index, send_rows, recv_rows, remote CSR, remote scipy, traffic) for this call."""
        if not self._policy_active(context):
            return self.send_index, self.send_rows, self.recv_rows, self.remote_block, self.remote_matrix, \
                self.any_traffic
        assert context is not None and self.sampler is not None
        if self._sample_epoch != context.epoch:
            self._sample_epoch, self._sample = context.epoch, self._sampled(context.epoch)
        return self._sample  # type: ignore[return-value]

    def _sampled(self, epoch: int) -> tuple:
        assert self.sampler is not None
        matrix, me, offsets = self.matrix, self.group, self.matrix.layout.offsets
        receiver_side = self.sampler.side == "receiver"
        send_kept, send_rows = [], []
        for i in range(matrix.grid.groups):
            ids = matrix.send_ids.get(i, np.empty(0, np.int64))
            kept = np.asarray(self.sampler.keep(epoch, i if receiver_side else me, ids + offsets[me]), dtype=bool)
            send_kept.append(ids[kept])
            send_rows.append(int(kept.sum()))
        recv_keep, recv_rows = [], []
        for j in range(matrix.grid.groups):
            ids = matrix.recv_ids.get(j, np.empty(0, np.int64))
            kept = np.asarray(self.sampler.keep(epoch, me if receiver_side else j, ids + offsets[j]), dtype=bool)
            recv_keep.append(kept)
            recv_rows.append(int(kept.sum()))
        remote = keep_columns(self.remote_matrix, np.concatenate(recv_keep), self._sample_scale())
        send_index = torch.from_numpy(np.concatenate(send_kept).astype(np.int64)).to(self.device)
        traffic = self.any_traffic and self.sampler.p > 0
        return send_index, send_rows, recv_rows, self._csr(remote), remote, traffic

    def forward(self, h: torch.Tensor, phase: str, context: ExchangeContext | None = None) -> torch.Tensor:
        send_index, send_rows, recv_rows, remote_block, _, traffic = self._exchange_shape(context)
        width = h.shape[1]
        out = self._output(self.n_rows, width)
        pending = None
        if traffic:
            send = h.index_select(0, send_index)
            recv = torch.empty(sum(recv_rows), width, dtype=self.dtype, device=self.device)
            pending = self.col_comm.ialltoallv(send, send_rows, recv, recv_rows, phase=phase)
        if self.local_block is not None:
            self._multiply_into(out, self.local_block, h)
        if pending is not None:
            pending.wait()
            self._multiply_into(out, remote_block, recv)
        return out.tensor()

    def transpose(self, dt: torch.Tensor, phase: str, context: ExchangeContext | None = None) -> torch.Tensor:
        send_index, send_rows, recv_rows, _, remote_matrix, traffic = self._exchange_shape(context)
        width = dt.shape[1]
        out = self._output(self.n_rows, width)
        pending = None
        if traffic:
            key = "remote" if remote_matrix is self.remote_matrix else ("sampled", self._sample_epoch)
            if key != "remote":  # keep only this epoch's sampled transpose
                self._transposed = {k: v for k, v in self._transposed.items() if not isinstance(k, tuple) or k == key}
            pieces = self._product(self._transpose_of(key, remote_matrix), dt)
            back = torch.empty(sum(send_rows), width, dtype=self.dtype, device=self.device)
            pending = self.col_comm.ialltoallv(pieces, recv_rows, back, send_rows, phase=phase)
        if self.local_block is not None:
            self._multiply_into(out, self._transpose_of("local", self.matrix.blocks[self.group]), dt)
        if pending is not None:
            pending.wait()
            out.tensor().index_add_(0, send_index, back)
        return out.tensor()


_PLANS: dict[str, type[ExchangePlan]] = {
    "dense-bcast": DenseBroadcastPlan,
    "sparse-bcast": SparseBroadcastPlan,
    "p2p": PointToPointPlan,
}


def unsupported_policy(plan: str, *, sampling: bool, staleness: bool) -> str | None:
    """Why ``plan`` cannot run a policy with sampling and/or staleness, or None when it can."""
    if sampling and plan == "dense-bcast":
        return "boundary sampling needs the sparse-bcast or p2p plan: dense-bcast sends every row of H_j by definition"
    if staleness and plan == "p2p":
        return ("staleness policies (cached historical blocks) need a broadcast plan: "
                "use dense-bcast or sparse-bcast")
    return None


def make_plan(name: str, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer,
              sampler: BoundarySampler | None = None, staleness: StalenessRule | None = None) -> ExchangePlan:
    """The exchange plan called ``name`` (one of :data:`PLAN_NAMES`)."""
    try:
        cls = _PLANS[name]
    except KeyError:
        raise ValueError(f"unknown exchange plan {name!r}; expected one of {PLAN_NAMES}") from None
    return cls(matrix, dtype, device, timer, sampler, staleness)
