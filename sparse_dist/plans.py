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
from typing import Callable

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.accounting import ComputeTimer
from sparse_dist.comm import Pending
from sparse_dist.dcsr import DistCSR

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


def remap_columns(block: sp.csr_matrix, positions: np.ndarray, width: int) -> sp.csr_matrix:
    """``block`` with its columns renumbered: old column ``ids[k]`` becomes ``positions[k]``.

    ``positions`` is indexed by the block's sorted distinct column ids.
    """
    ids = np.unique(block.indices)
    new_indices = positions[np.searchsorted(ids, block.indices)]
    return sp.csr_matrix((block.data, new_indices, block.indptr), shape=(block.shape[0], width))


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


class ExchangePlan(ABC):
    """One way of moving ``H`` rows between ranks; owns the blocks in the form it needs."""

    name: str

    def __init__(self, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer) -> None:
        self.matrix = matrix
        self.dtype = dtype
        self.device = device
        self.timer = timer
        self.col_comm = matrix.col_comm
        self.group = matrix.group
        self.n_rows = matrix.lshape[0]
        self._transposed: dict[object, torch.Tensor] = {}

    def _csr(self, matrix: sp.csr_matrix) -> torch.Tensor:
        return torch_csr(matrix, self.dtype, self.device)

    def _transpose_of(self, key: object, matrix: sp.csr_matrix) -> torch.Tensor:
        """The (cached) CSR of ``matrix.T``, built locally on first use."""
        if key not in self._transposed:
            self._transposed[key] = self._csr(sp.csr_matrix(matrix.T))
        return self._transposed[key]

    def _multiply_into(self, out: torch.Tensor, a: torch.Tensor, x: torch.Tensor) -> None:
        """``out += a @ x`` timed as local SpMM."""
        with self.timer.measure("local_spmm"):
            if a._nnz() > 0:
                out.addmm_(a, x)
            if out.is_cuda:
                torch.cuda.current_stream(out.device).synchronize()

    def _product(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(a.shape[0], x.shape[1], dtype=self.dtype, device=self.device)
        self._multiply_into(out, a, x)
        return out

    @abstractmethod
    def forward(self, h: torch.Tensor, phase: str) -> torch.Tensor:
        """This rank's partial ``sum_j A_gj H_j`` over its column share (``n_g x F``)."""

    @abstractmethod
    def transpose(self, dt: torch.Tensor, phase: str) -> torch.Tensor:
        """This rank's ``dH_g`` summed over the row groups of its replica column (``n_g x F``)."""


class _BroadcastPlan(ExchangePlan):
    """Shared loop of the two broadcast plans; they differ in which owner rows travel."""

    def __init__(self, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer) -> None:
        super().__init__(matrix, dtype, device, timer)
        self.local_block = self._csr(matrix.blocks[self.group]) if self.group in matrix.blocks else None
        self.remote_blocks: dict[int, sp.csr_matrix] = {j: self._remote_form(j, block)
                                                        for j, block in matrix.blocks.items() if j != self.group}
        self.remote_torch = {j: self._csr(block) for j, block in self.remote_blocks.items()}
        self.send_index = torch.from_numpy(self._owner_rows()).to(device) if self._owner_rows() is not None else None

    @abstractmethod
    def _remote_form(self, j: int, block: sp.csr_matrix) -> sp.csr_matrix:
        """Block ``A_gj`` with columns numbered as rows of the broadcast buffer."""

    @abstractmethod
    def _owner_rows(self) -> np.ndarray | None:
        """Rows of ``H_g`` this rank broadcasts (None: all of them)."""

    @abstractmethod
    def _message_rows(self, j: int) -> int:
        """Rows in owner ``j``'s broadcast (the same on every rank)."""

    def _exchanged(self) -> list[int]:
        return [j for j in self.matrix.column_share if self._message_rows(j) > 0]

    def forward(self, h: torch.Tensor, phase: str) -> torch.Tensor:
        width = h.shape[1]
        out = torch.zeros(self.n_rows, width, dtype=self.dtype, device=self.device)
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
        return out

    def transpose(self, dt: torch.Tensor, phase: str) -> torch.Tensor:
        width = dt.shape[1]
        out = torch.zeros(self.n_rows, width, dtype=self.dtype, device=self.device)
        exchanged = self._exchanged()
        if self.local_block is not None:
            self._multiply_into(out, self._transpose_of("local", self.matrix.blocks[self.group]), dt)
        previous: tuple[Pending, torch.Tensor | None] | None = None
        for j in exchanged:
            if j == self.group:
                # Owner: receive the sum in place into a zeroed message buffer.
                result = torch.zeros(self._message_rows(j), width, dtype=self.dtype, device=self.device)
                pending = self.col_comm.ireduce(None, result, root=j, phase=phase)
                current: tuple[Pending, torch.Tensor | None] = (pending, result)
            else:
                if j in self.remote_blocks:
                    piece = self._product(self._transpose_of(j, self.remote_blocks[j]), dt)
                else:
                    piece = torch.zeros(self._message_rows(j), width, dtype=self.dtype, device=self.device)
                current = (self.col_comm.ireduce(piece, None, root=j, phase=phase), None)
            if previous is not None:
                self._finish_reduce(out, *previous)
            previous = current
        if previous is not None:
            self._finish_reduce(out, *previous)
        return out

    def _finish_reduce(self, out: torch.Tensor, pending: Pending, result: torch.Tensor | None) -> None:
        pending.wait()
        if result is not None:
            if self.send_index is None:
                out += result
            else:
                out.index_add_(0, self.send_index, result)


class DenseBroadcastPlan(_BroadcastPlan):
    """CAGNET 1D: every owner broadcasts its whole block of ``H``."""

    name = "dense-bcast"

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
    """BNS-GCN's vanilla partition parallelism: owner ``j`` sends ``B_ij`` to each ``i`` (alltoallv)."""

    name = "p2p"

    def __init__(self, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer) -> None:
        super().__init__(matrix, dtype, device, timer)
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

    def forward(self, h: torch.Tensor, phase: str) -> torch.Tensor:
        width = h.shape[1]
        out = torch.zeros(self.n_rows, width, dtype=self.dtype, device=self.device)
        pending = None
        if self.any_traffic:
            send = h.index_select(0, self.send_index)
            recv = torch.empty(sum(self.recv_rows), width, dtype=self.dtype, device=self.device)
            pending = self.col_comm.ialltoallv(send, self.send_rows, recv, self.recv_rows, phase=phase)
        if self.local_block is not None:
            self._multiply_into(out, self.local_block, h)
        if pending is not None:
            pending.wait()
            self._multiply_into(out, self.remote_block, recv)
        return out

    def transpose(self, dt: torch.Tensor, phase: str) -> torch.Tensor:
        width = dt.shape[1]
        out = torch.zeros(self.n_rows, width, dtype=self.dtype, device=self.device)
        pending = None
        if self.any_traffic:
            pieces = self._product(self._transpose_of("remote", self.remote_matrix), dt)
            back = torch.empty(sum(self.send_rows), width, dtype=self.dtype, device=self.device)
            pending = self.col_comm.ialltoallv(pieces, self.recv_rows, back, self.send_rows, phase=phase)
        if self.local_block is not None:
            self._multiply_into(out, self._transpose_of("local", self.matrix.blocks[self.group]), dt)
        if pending is not None:
            pending.wait()
            out.index_add_(0, self.send_index, back)
        return out


_PLANS: dict[str, type[ExchangePlan]] = {
    "dense-bcast": DenseBroadcastPlan,
    "sparse-bcast": SparseBroadcastPlan,
    "p2p": PointToPointPlan,
}


def make_plan(name: str, matrix: DistCSR, dtype: torch.dtype, device: torch.device,
              timer: ComputeTimer) -> ExchangePlan:
    """The exchange plan called ``name`` (one of :data:`PLAN_NAMES`)."""
    try:
        cls = _PLANS[name]
    except KeyError:
        raise ValueError(f"unknown exchange plan {name!r}; expected one of {PLAN_NAMES}") from None
    return cls(matrix, dtype, device, timer)
