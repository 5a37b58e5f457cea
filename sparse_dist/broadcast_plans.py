"""The broadcast plans (DESIGN section 3): ``dense-bcast`` (CAGNET 1D) and ``sparse-bcast``.

Owners of a replica column take turns: owner ``j`` broadcasts its message (all of ``H_j``, or its
boundary rows ``B_j``), prefetch depth 1 (the next owner's broadcast is posted before the current
one is multiplied). The transpose is a reduce of the pieces ``A_gj^T dT_g`` to each owner, or a gather
that the owner sums: when the pieces are compressed (MPI cannot sum codes), and in a column of two ranks.
There the one other piece is all a reduce would move, yet MPICH's large-message ireduce (reduce-scatter, then
gather) sends 1.5x its bytes; with both owners' reduces in flight, the link carried 1.5x the data of a send
each way (1 Gbit/s emulated link, 16 MiB pieces: 0.219 s against 0.140 s). Every receiver gets the same
block, so these plans can carry cached historical blocks (SANCUS).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import TYPE_CHECKING, Callable

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.accounting import ComputeTimer
from sparse_dist.compress import Codec
from sparse_dist.cost import Network, bcast_time
from sparse_dist.csr import keep_columns, remap_columns
from sparse_dist.dcsr import DistCSR
from sparse_dist.exchange import ExchangeContext, ExchangeStrategy, Flight, Message, Transfer
from sparse_dist.exchange_plan import ExchangePlan
from sparse_dist.layout import Grid

if TYPE_CHECKING:  # annotations only: the byte model (sparse_dist.predict) loads without MPI
    from sparse_dist.comm import Pending

_Start = Callable[[], "tuple[Pending | None, torch.Tensor | None]"]


class _BroadcastPlan(ExchangePlan):
    """Shared exchange of the two broadcast plans; they differ in which owner rows travel.

    Owners of this replica column take turns (``owners``, in order): each broadcasts its message,
    receivers multiply it by their block ``A_gj`` (columns numbered as message rows). A STALE
    message (cached strategy) moves nothing; receivers multiply their cached rows instead. The
    transpose reduces the pieces ``A_gj^T dT_g`` to each owner, mirroring the forward's messages.
    """

    carries_history = True
    carries_per_receiver = False
    no_per_receiver_reason = ("per-receiver sampling (psc, dgs: each receiver's own edges or rows) needs the p2p "
                              "plan: a broadcast sends every receiver the same rows")

    def __init__(self, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer,
                 strategy: ExchangeStrategy | None = None, *, row_masks: bool = False) -> None:
        super().__init__(matrix, dtype, device, timer, strategy, row_masks=row_masks)
        self.remote_blocks: dict[int, sp.csr_matrix] = {j: self._remote_form(j, block)
                                                        for j, block in matrix.blocks.items() if j != self.group}
        self.remote_torch = {j: self.csr(block) for j, block in self.remote_blocks.items()}
        owner_rows = self._owner_rows()
        self.send_index = torch.from_numpy(owner_rows).to(device) if owner_rows is not None else None
        self.owners = [j for j in matrix.column_share if self._message_rows(j) > 0]
        self.boundary_of = self._share_boundaries() if self.strategy.samples or self._needs_boundaries() else {}

    @abstractmethod
    def _remote_form(self, j: int, block: sp.csr_matrix) -> sp.csr_matrix:
        """Block ``A_gj`` with columns numbered as rows of the broadcast buffer."""

    @abstractmethod
    def _owner_rows(self) -> np.ndarray | None:
        """Rows of ``H_g`` this rank broadcasts (None: all of them)."""

    @abstractmethod
    def _message_rows(self, j: int) -> int:
        """Rows in owner ``j``'s exact broadcast (the same on every rank)."""

    @abstractmethod
    def _message_global_rows(self, j: int) -> np.ndarray | range | None:
        """Global ids of owner ``j``'s exact broadcast rows (None where this rank does not know them)."""

    def _needs_boundaries(self) -> bool:
        """Whether receivers must learn every owner's ``B_j`` ids at set-up (beyond sampling's need)."""
        return False

    @classmethod
    def exchange_seconds(cls, rows: np.ndarray, boundary_counts: np.ndarray, union_sizes: np.ndarray, grid: Grid,
                         row_bytes: float, net: Network) -> float:
        # Owners take turns; a replica column handles the owners j with j % c == its replica. Between two
        # groups the prefetch has both owners' broadcasts in flight at once, one each way: the larger one counts
        # (measured over a 1 Gbit/s emulated link: two 16 MiB ibcasts in 0.140 s, as one send each way).
        message_rows = cls.moved_rows(rows, boundary_counts, union_sizes).max(axis=0, initial=0)
        per_column: list[list[float]] = [[] for _ in range(grid.replication)]
        for j in range(grid.groups):
            per_column[grid.replica_for_block(j)].append(bcast_time(float(message_rows[j]) * row_bytes, grid.groups, net))
        combine = max if grid.groups == 2 else sum
        return max((combine(times) for times in per_column if times), default=0.0)

    # -------------------------------------------------- what strategies ask
    def exact_message(self, owner: int) -> Message:
        return Message(self._message_rows(owner), True, self.remote_blocks.get(owner), self.remote_torch.get(owner),
                       self.send_index if owner == self.group else None,
                       global_rows=self._message_global_rows(owner) if owner != self.group else None)

    def sampled_message(self, owner: int, kept: np.ndarray, scale: float) -> Message:
        """Owner ``owner`` sends the rows of ``B_owner`` where ``kept``; receivers scale their columns."""
        owner_rows = torch.from_numpy(self.boundary_of[owner][kept]).to(self.device) if owner == self.group else None
        block = keep_columns(self.remote_blocks[owner], kept, scale) if owner in self.remote_blocks else None
        return Message(int(kept.sum()), True, block, self.csr(block) if block is not None else None, owner_rows,
                       global_rows=self.boundary_rows(owner)[kept] if owner != self.group else None,
                       positions=np.flatnonzero(kept))

    def boundary_rows(self, owner: int) -> np.ndarray:
        """Global ids of ``B_owner`` (the candidates of owner-side sampling)."""
        return self.boundary_of[owner] + self.matrix.layout.offsets[owner]

    def broadcastable(self, h: torch.Tensor) -> torch.Tensor:
        """The rows of ``h`` this rank would broadcast as an owner in the exact exchange."""
        return h if self.send_index is None else h.index_select(0, self.send_index)

    def _share_boundaries(self) -> dict[int, np.ndarray]:
        """``B_j`` ids of every owner in this column's share, broadcast once at set-up (phase ``other``).

        Collective over the replica column (built only when the strategy samples, the same on every rank).
        """
        boundaries = {}
        for j in self.owners:
            if j == self.group:
                ids = torch.from_numpy(self.matrix.union_ids.astype(np.int64))
            else:
                ids = torch.empty(int(self.matrix.union_sizes[j]), dtype=torch.int64)
            self.col_comm.bcast_(ids, root=j, phase="other")
            boundaries[j] = ids.numpy()
        return boundaries

    # ------------------------------------------------------------ exchange
    def exact_parts(self) -> list[Transfer]:
        return [Transfer(j, self.exact_message(j)) for j in self.owners]

    def post_rows(self, h: torch.Tensor, phase: str, context: ExchangeContext | None,
                  strategy: ExchangeStrategy) -> Flight:
        messages = (strategy.forward_messages(self, context, h) if context is not None
                    else {j: self.exact_message(j) for j in self.owners})
        width = h.shape[1]

        codec = self._codec_for(context, "rows")
        epoch, layer = (context.epoch, context.layer) if context is not None else (-1, -1)

        def starter(part: Transfer) -> _Start:
            j, message = part.owner, part.message

            def start() -> tuple[Pending | None, torch.Tensor | None]:
                if not message.fresh:
                    return None, message.values
                if j == self.group:
                    buffer = h if message.owner_rows is None else h.index_select(0, message.owner_rows)
                    if message.count == 0:
                        return None, buffer
                    sent = self._coded(buffer, codec, (layer, "rows", j), self._message_rows(j),
                                       message.positions, (epoch, layer, 0, j))
                    return self.col_comm.ibcast_(sent, root=j, phase=phase), buffer
                buffer = self._receive_buffer(part, message.count, width, codec)
                if message.count == 0:
                    return None, buffer
                return self.col_comm.ibcast_(buffer, root=j, phase=phase), buffer
            return start

        parts = [Transfer(j, m) for j, m in messages.items()]
        for part in parts:
            part.start = starter(part)
        return self._flight(context, parts, strategy)

    def post_gradients(self, forward: Flight, piece_of: Callable[[Transfer], torch.Tensor], width: int, phase: str,
                       context: ExchangeContext | None, strategy: ExchangeStrategy) -> Flight:
        codec = self._codec_for(context, "gradients")
        epoch, layer = (context.epoch, context.layer) if context is not None else (-1, -1)
        gather = codec is not None or self.col_comm.size == 2

        def starter(part: Transfer) -> _Start:
            j, count = part.owner, part.message.count

            def start() -> tuple[Pending | None, torch.Tensor | None]:
                if gather:  # the owner receives every other rank's piece and sums them itself
                    if j == self.group:
                        gathered = (torch.empty(self.col_comm.size * count, width, dtype=self.dtype, device=self.device)
                                    if codec is None else codec.empty(self.col_comm.size * count, width, self.device))
                        part.decode = lambda payload: self._sum_pieces(payload, count, width, codec)
                        return self.col_comm.igather_(None, gathered, root=j, phase=phase), gathered
                    sent = (piece_of(part) if codec is None else
                            codec.send(piece_of(part), (layer, "gradients", j), self._message_rows(j),
                                       part.message.positions, (epoch, layer, 1, self.group, j)))
                    return self.col_comm.igather_(sent, None, root=j, phase=phase), None
                if j == self.group:  # the owner receives the sum in place into a zeroed message buffer
                    result = torch.zeros(count, width, dtype=self.dtype, device=self.device)
                    return self.col_comm.ireduce(None, result, root=j, phase=phase), result
                return self.col_comm.ireduce(piece_of(part), None, root=j, phase=phase), None
            return start

        sent = [Transfer(part.owner, part.message) for part in self._gradient_parts(forward.parts, strategy)]
        for part in sent:
            part.start = starter(part)
        return self._flight(context, sent, strategy, forward.source_epoch, gradients=True)

    def _sum_pieces(self, payload: torch.Tensor, count: int, width: int, codec: Codec | None) -> torch.Tensor:
        """The owner's sum of the other ranks' (decoded) pieces (its own slot of the gather is empty)."""
        pieces = payload.view(self.col_comm.size, count, -1)
        total = torch.zeros(count, width, dtype=self.dtype, device=self.device)
        for rank in range(self.col_comm.size):
            if rank != self.col_comm.rank:
                total += pieces[rank] if codec is None else codec.decode(pieces[rank], width, self.dtype)
        return total

    def _gradient_parts(self, parts: list[Transfer], strategy: ExchangeStrategy) -> list[Transfer]:
        """Empty messages and skipped gradients (a cached strategy's ``skip_backward``) post nothing."""
        return [part for part in parts if part.message.count > 0 and strategy.sends_gradient(part.message)]

    def _messages_of(self, strategy: ExchangeStrategy, epoch: int) -> list[Transfer]:
        return [Transfer(j, strategy.fresh_message(self, epoch, j)) for j in self.owners]

    # ------------------------------------------------- what each part is
    def part_operand(self, part: Transfer) -> torch.Tensor | None:
        return part.message.block_torch if part.owner != self.group else None

    def part_transposed(self, part: Transfer) -> torch.Tensor | None:
        message, j = part.message, part.owner
        if message.block is None:
            return None
        if message.block is self.remote_blocks.get(j):
            return self._transpose_of(j, message.block)
        return self.csr(sp.csr_matrix(message.block.T))

    def gradient_rows(self, part: Transfer) -> torch.Tensor | None:
        return part.message.owner_rows

    def part_block(self, part: Transfer) -> sp.csr_matrix | None:
        return part.message.block if part.owner != self.group else None

    def part_global_rows(self, part: Transfer) -> np.ndarray | range | None:
        return part.message.global_rows

    def part_rows(self, part: Transfer) -> int:
        return part.message.count


class DenseBroadcastPlan(_BroadcastPlan):
    """CAGNET 1D: every owner broadcasts its whole block of ``H``."""

    name = "dense-bcast"
    carries_samples = False
    no_samples_reason = ("boundary sampling needs the sparse-bcast or p2p plan: "
                         "dense-bcast sends every row of H_j by definition")

    @classmethod
    def moved_rows(cls, rows: np.ndarray, boundary_counts: np.ndarray, union_sizes: np.ndarray) -> np.ndarray:
        return np.broadcast_to(np.asarray(rows)[None, :], np.shape(boundary_counts))

    def _remote_form(self, j: int, block: sp.csr_matrix) -> sp.csr_matrix:
        return block

    def _owner_rows(self) -> np.ndarray | None:
        return None

    def _message_rows(self, j: int) -> int:
        return self.matrix.layout.count(j)

    def _message_global_rows(self, j: int) -> range:
        start = int(self.matrix.layout.offsets[j])
        return range(start, start + self.matrix.layout.count(j))


class SparseBroadcastPlan(_BroadcastPlan):
    """Sparsity-aware broadcast: owner ``j`` broadcasts rows ``B_j`` only."""

    name = "sparse-bcast"
    sends_union = True

    @classmethod
    def moved_rows(cls, rows: np.ndarray, boundary_counts: np.ndarray, union_sizes: np.ndarray) -> np.ndarray:
        return np.broadcast_to(np.asarray(union_sizes)[None, :], np.shape(boundary_counts))

    def _remote_form(self, j: int, block: sp.csr_matrix) -> sp.csr_matrix:
        return remap_columns(block, self.matrix.union_positions[j], int(self.matrix.union_sizes[j]))

    def _owner_rows(self) -> np.ndarray | None:
        return self.matrix.union_ids.astype(np.int64)

    def _message_rows(self, j: int) -> int:
        return int(self.matrix.union_sizes[j])

    def _needs_boundaries(self) -> bool:
        return self.row_masks

    def _message_global_rows(self, j: int) -> np.ndarray | None:
        return self.boundary_rows(j) if j in self.boundary_of else None
