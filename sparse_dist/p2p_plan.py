"""The ``p2p`` plan (DESIGN section 3; BNS-GCN's vanilla partition parallelism): one alltoallv per call.

Owner ``j`` sends rows ``B_ij`` to each receiver ``i``; a block ``A_ij`` that is empty needs nothing from
``j``. The transpose is the reverse alltoallv. Each receiver can get its own subset of an owner's rows,
so this plan carries receiver-side and per-edge sampling (BNS-GCN, ``psc``), not cached blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.accounting import ComputeTimer
from sparse_dist.cost import Network, alltoallv_time
from sparse_dist.csr import csr_bytes, remap_columns
from sparse_dist.dcsr import DistCSR
from sparse_dist.exchange import ExchangeContext, ExchangeStrategy, Flight, Transfer
from sparse_dist.exchange_plan import ExchangePlan
from sparse_dist.layout import Grid

if TYPE_CHECKING:  # annotations only: the byte model (sparse_dist.predict) loads without MPI
    from sparse_dist.comm import Pending


@dataclass
class _PairExchange:
    """One call's alltoallv: owner side (``send_index``, ``send_rows`` per receiver) and receiver side
    (``recv_rows`` per owner, the remote CSR over the concatenated receive buffer)."""

    send_index: torch.Tensor
    send_rows: list[int]
    recv_rows: list[int]
    remote_block: torch.Tensor
    remote_matrix: sp.csr_matrix
    traffic: bool                      # False: no rank of the column moves a row (skip the collective)
    epoch: int | None = None           # the epoch of a sample (None: the exact pairs)
    recv_global: np.ndarray | None = None  # global ids of the receive buffer's rows (receiver-side dropout)
    transposed: torch.Tensor | None = None  # CSR of remote_matrix.T, built on the first transpose
    recv_positions: np.ndarray | None = None  # a sample's received rows as positions of the exact receive buffer
    send_positions: np.ndarray | None = None  # a sample's sent rows as positions of the exact send buffer


class PointToPointPlan(ExchangePlan):
    """BNS-GCN's vanilla partition parallelism: owner ``j`` sends ``B_ij`` to each ``i`` (alltoallv).

    With a sampling strategy (training only) each pair's rows are sampled per epoch,
    receiver-side (stream = receiver, as BNS-GCN) or owner-side (stream = owner); both sides
    compute the same sample, so the counts need no extra exchange. Kept columns are scaled by
    ``1/p`` in the forward and, through the transposed block, in the backward.
    """

    name = "p2p"
    progresses_unattended = True
    no_history_reason = ("staleness policies (cached historical blocks) need a broadcast plan: "
                         "use dense-bcast or sparse-bcast")

    def __init__(self, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer,
                 strategy: ExchangeStrategy | None = None, *, row_masks: bool = False) -> None:
        super().__init__(matrix, dtype, device, timer, strategy, row_masks=row_masks)
        groups = self.groups
        recv_rows = [int(matrix.recv_ids[j].size) if j in matrix.recv_ids else 0 for j in range(groups)]
        send_rows = [int(matrix.send_ids[i].size) if i in matrix.send_ids else 0 for i in range(groups)]
        send_ids = [matrix.send_ids[i] for i in range(groups) if i in matrix.send_ids]
        send_index = torch.from_numpy(np.concatenate(send_ids).astype(np.int64) if send_ids
                                      else np.empty(0, np.int64)).to(device)
        # One CSR over the concatenated receive buffer (segments in owner order).
        starts = np.concatenate(([0], np.cumsum(recv_rows)))
        remote = [remap_columns(matrix.blocks[j], np.arange(starts[j], starts[j + 1]), int(starts[-1]))
                  for j in range(groups) if j in matrix.recv_ids]
        remote_matrix = sp.csr_matrix(sum(remote[1:], remote[0])) if remote else sp.csr_matrix((self.n_rows, 0))
        share = matrix.column_share
        traffic = bool(sum(int(matrix.boundary_counts[i, j]) for j in share for i in range(groups) if i != j) > 0)
        self.exact_pairs = _PairExchange(send_index, send_rows, recv_rows, self.csr(remote_matrix), remote_matrix,
                                         traffic, recv_global=self._global_ids(
                                             [matrix.recv_ids.get(j, np.empty(0, np.int64)) for j in range(groups)]))
        self._sampled: _PairExchange | None = None

    @classmethod
    def moved_rows(cls, rows: np.ndarray, boundary_counts: np.ndarray, union_sizes: np.ndarray) -> np.ndarray:
        return np.asarray(boundary_counts)

    def _global_ids(self, local_ids: list[np.ndarray]) -> np.ndarray | None:
        """Global ids of a receive buffer made of owner ``j``'s rows ``local_ids[j]``, in owner order
        (None unless receivers mask rows: nothing else needs them)."""
        if not self.row_masks:
            return None
        offsets = self.matrix.layout.offsets
        return np.concatenate([ids.astype(np.int64) + offsets[j] for j, ids in enumerate(local_ids)]
                              + [np.empty(0, np.int64)])

    @classmethod
    def exchange_seconds(cls, rows: np.ndarray, boundary_counts: np.ndarray, union_sizes: np.ndarray, grid: Grid,
                         row_bytes: float, net: Network) -> float:
        counts = np.asarray(boundary_counts, dtype=float)
        sent = counts.sum(axis=0) * row_bytes        # owner j sends sum_i |B_ij|
        received = counts.sum(axis=1) * row_bytes    # receiver i
        peers = np.maximum((counts > 0).sum(axis=0), (counts > 0).sum(axis=1))
        return alltoallv_time(sent, received, peers, grid.groups, net)

    def _pairs(self, context: ExchangeContext | None) -> _PairExchange:
        """The exact pairs, or this epoch's sample (both sides compute it alike; one per epoch kept)."""
        strategy = self.strategy_for(context)
        if not strategy.samples:
            return self.exact_pairs
        assert context is not None
        if self._sampled is None or self._sampled.epoch != context.epoch:
            self._sampled = self._sample(strategy, context.epoch)
        return self._sampled

    def _sample(self, strategy: ExchangeStrategy, epoch: int) -> _PairExchange:
        strategy.prepare(epoch)  # collective where the strategy agrees on new probabilities (the same epochs everywhere)
        matrix, me, offsets = self.matrix, self.group, self.matrix.layout.offsets
        receiver_side = strategy.side == "receiver"
        send_kept, send_rows, send_keep = [], [], []
        for i in range(self.groups):
            ids = matrix.send_ids.get(i, np.empty(0, np.int64))
            kept = strategy.keep(epoch, i if receiver_side else me, ids + offsets[me])
            send_kept.append(ids[kept])
            send_rows.append(int(kept.sum()))
            send_keep.append(kept)
        recv_keep, recv_rows, recv_kept_ids = [], [], []
        for j in range(self.groups):
            ids = matrix.recv_ids.get(j, np.empty(0, np.int64))
            kept = strategy.keep(epoch, me if receiver_side else j, ids + offsets[j])
            recv_keep.append(kept)
            recv_rows.append(int(kept.sum()))
            recv_kept_ids.append(ids[kept])
        kept_columns = np.concatenate(recv_keep)
        remote = strategy.sampled_block(epoch, self.exact_pairs.remote_matrix, kept_columns)
        send_index = torch.from_numpy(np.concatenate(send_kept).astype(np.int64)).to(self.device)
        traffic = self.exact_pairs.traffic and strategy.scale > 0
        return _PairExchange(send_index, send_rows, recv_rows, self.csr(remote), remote, traffic, epoch,
                             self._global_ids(recv_kept_ids), recv_positions=np.flatnonzero(kept_columns),
                             send_positions=np.flatnonzero(np.concatenate(send_keep + [np.empty(0, bool)])))

    def exact_parts(self) -> list[Transfer]:
        return [Transfer(-1, self.exact_pairs)]

    def post_rows(self, h: torch.Tensor, phase: str, context: ExchangeContext | None,
                  strategy: ExchangeStrategy) -> Flight:
        pairs = self._pairs(context)
        return self._post_pairs(context, pairs, strategy, lambda: h.index_select(0, pairs.send_index), h.shape[1],
                                phase, backward=False)

    def post_gradients(self, forward: Flight, piece_of: Callable[[Transfer], torch.Tensor], width: int, phase: str,
                       context: ExchangeContext | None, strategy: ExchangeStrategy) -> Flight:
        (used,) = forward.parts
        return self._post_pairs(context, used.message, strategy, lambda: piece_of(used), width, phase, backward=True,
                                source_epoch=forward.source_epoch)

    def _post_pairs(self, context: ExchangeContext | None, pairs: _PairExchange, strategy: ExchangeStrategy,
                    payload: Callable[[], torch.Tensor], width: int, phase: str, *, backward: bool,
                    source_epoch: int | None = None) -> Flight:
        """One alltoallv of ``pairs`` as a one-part flight: rows from owners to receivers, or (``backward``) the
        receivers' gradient pieces back to the owners. ``payload`` makes what this rank sends (when posted)."""
        what = "gradients" if backward else "rows"
        codec = self._codec_for(context, what)
        epoch, layer = (context.epoch, context.layer) if context is not None else (-1, -1)
        sends, receives = (pairs.recv_rows, pairs.send_rows) if backward else (pairs.send_rows, pairs.recv_rows)
        exact_sends = self.exact_pairs.recv_rows if backward else self.exact_pairs.send_rows
        positions = pairs.recv_positions if backward else pairs.send_positions
        part = Transfer(-1, pairs)

        def start() -> tuple[Pending | None, torch.Tensor | None]:
            if not pairs.traffic:
                return None, None
            recv = self._receive_buffer(part, sum(receives), width, codec)
            send = self._coded(payload(), codec, (layer, what, -1), sum(exact_sends), positions,
                               (epoch, layer, int(backward), self.group))
            return self.col_comm.ialltoallv(send, sends, recv, receives, phase=phase), recv

        part.start = start
        return self._flight(context, [part], strategy, source_epoch, gradients=backward)

    def _messages_of(self, strategy: ExchangeStrategy, epoch: int) -> list[Transfer]:
        return [Transfer(-1, self._sample(strategy, epoch) if strategy.samples else self.exact_pairs)]

    # ------------------------------------------------- what each part is
    def part_operand(self, part: Transfer) -> torch.Tensor | None:
        return part.message.remote_block

    def part_transposed(self, part: Transfer) -> torch.Tensor | None:
        pairs = part.message
        if pairs.transposed is None:
            pairs.transposed = self.csr(sp.csr_matrix(pairs.remote_matrix.T))
        return pairs.transposed

    def gradient_rows(self, part: Transfer) -> torch.Tensor | None:
        return part.message.send_index

    def part_block(self, part: Transfer) -> sp.csr_matrix | None:
        return part.message.remote_matrix if part.message.traffic else None

    def part_global_rows(self, part: Transfer) -> np.ndarray | range | None:
        return part.message.recv_global

    def part_rows(self, part: Transfer) -> int:
        return sum(part.message.recv_rows)

    def transpose_bytes(self) -> int:
        pairs = [p.transposed for p in (self.exact_pairs, self._sampled) if p is not None and p.transposed is not None]
        return super().transpose_bytes() + sum(csr_bytes(t) for t in pairs)
