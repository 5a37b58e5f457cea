"""The ``cover`` plan (DESIGN section 3; SuperGCN's pre/post aggregation): per pair, a minimum vertex cover.

For receiver ``i`` and owner ``j`` (a pair of one replica column), every nonzero ``(r, c)`` of the boundary
block ``B = A_ij`` must reach ``i``: either as column ``c`` (the row ``H_j[c]``, post-aggregated by ``i``, as in
``p2p``) or inside row ``r``'s partial sum ``sum_{c not in C} B[r, c] H_j[c]``, pre-aggregated by ``j``. A König
cover of ``B``'s nonzeros (:mod:`sparse_dist.cover_sets`) gives the columns ``C_ij`` and rows ``R_ij``; an entry
whose column is in ``C_ij`` is never in a partial sum (no double counting). Per call:

* forward: ``j`` sends ``|C_ij| + |R_ij|`` rows of width ``F`` to ``i``: ``S_ij H_j`` with ``S_ij`` the unit rows
  of ``C_ij`` over the rows ``B[R_ij, not C_ij]``; ``i`` multiplies them by
  ``O_ij = [B[:, C_ij] | unit columns of R_ij]`` (its partial sums are added into its rows, the rest multiplied),
  so ``O_ij S_ij = B``;
* transpose (``dH = A^T dT``): ``i`` sends ``O_ij^T dT_i`` back, that is ``B[:, C_ij]^T dT_i`` for the columns
  and ``dT_i[R_ij]`` for the partial sums, the same count; ``j`` adds ``S_ij^T`` of what arrives into ``dH_j``.
  Exact for non-symmetric ``A``: no ``A^T`` anywhere.

One alltoallv per call, as ``p2p`` (this class reuses its exchange; only what is sent and how the owner adds
the gradients differ), and never more rows than ``p2p``: a cover is at most ``B``'s nonzero columns.

Set-up (collective over the replica column, once; phase ``other``): receivers compute the covers of their
blocks; an allgather of checksums, then one of order-independent block fingerprints where checksums agree,
tells per pair whether the owner holds ``B^T`` itself (``A_ji`` equals ``A_ij^T`` bitwise and ``j`` multiplies
it: a symmetric ``A`` in 1D), and then the owner computes the same cover from it, reusing the maximum matching
it found for ``A_ji`` as a receiver (a cover depends on the pattern only, not on which maximum matching found
it: :class:`~sparse_dist.cover_sets.MatchedBlock`); otherwise the receiver sends ``C_ij`` and the entries of
``B[R_ij, not C_ij]`` (ids and values, :attr:`CoverPlan.setup_bytes`) once. A pair whose cover is its nonzero
columns needs neither (the owner knows them from ``p2p``'s send lists). A world allgather of
``|C_ij| + |R_ij|`` gives every rank the byte model's input (:attr:`CoverPlan.pair_counts`).

What it refuses (one sentence each, :attr:`no_samples_reason` and :meth:`run_refusal`): sampling (bns, psc,
dgs drop columns of ``B``, but a partial sum mixes kept and dropped columns), cached blocks (SANCUS: not a
broadcast), receiver-side dropout and attention (the receiver must see the rows themselves). Compression and
``pipe`` compose: messages are rows either way, and a stale partial sum is as valid as a stale row. 1.5D
composes: the pairs are those of each replica column, completed across the replicas as every plan is.
"""

from __future__ import annotations

import time
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.accounting import ComputeTimer
from sparse_dist.cover_sets import (BlockCover, MatchedBlock, block_checksum, block_fingerprint, pre_aggregated,
                                    pre_aggregated_of_transpose)
from sparse_dist.csr import csr_bytes
from sparse_dist.dcsr import DistCSR
from sparse_dist.exchange import ExchangeContext, ExchangeStrategy, Flight, Transfer
from sparse_dist.exchange_plan import ExchangePlan
from sparse_dist.p2p_plan import PointToPointPlan, _PairExchange


class CoverPlan(PointToPointPlan):
    """Per pair, a minimum vertex cover of the boundary block: columns as rows of ``H``, rows as partial sums.

    Attributes (besides the plan's): ``covers[j]`` this receiver's cover of ``A_gj``; ``pair_counts[i, j]``
    ``|C_ij| + |R_ij|`` for every pair (the same on every rank); ``send_matrix`` ``S`` (the owner's rows of every
    receiver's message over its own rows, CSR), ``setup_bytes`` (sent, received) of the set-up values and
    ``setup_seconds``, this rank's time building the plan (covers, set-up exchanges, matrices).
    """

    name = "cover"
    pair_counted: ClassVar[bool] = True
    carries_samples = False
    carries_per_receiver = False
    no_samples_reason = ("sampling drops columns of a boundary block, but the cover plan pre-aggregates rows over "
                         "several columns at their owner: use --plan p2p or sparse-bcast to sample")
    no_per_receiver_reason = no_samples_reason
    no_history_reason = ("staleness policies (cached historical blocks) need a broadcast plan: "
                         "use dense-bcast or sparse-bcast (pipe composes with cover)")

    def __init__(self, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer,
                 strategy: ExchangeStrategy | None = None, *, row_masks: bool = False) -> None:
        if row_masks:
            raise ValueError("the cover plan cannot carry the received rows' global ids (receiver-side dropout, "
                             "attention dropout): " + str(self.run_refusal(receiver_dropout=True)))
        began = time.perf_counter()
        ExchangePlan.__init__(self, matrix, dtype, device, timer, strategy, row_masks=row_masks)
        groups, me, share = self.groups, self.group, matrix.column_share
        # one matching per block: this receiver's cover of A_gj, and the owner's of A_jg = A_gj^T where symmetric
        matched = {j: MatchedBlock(matrix.blocks[j]) for j in share if j != me and j in matrix.blocks}
        self.covers: dict[int, BlockCover] = {j: pattern.cover() for j, pattern in matched.items()}
        row = np.zeros(groups, dtype=np.int64)
        for j, cover in self.covers.items():
            row[j] = cover.size
        world = matrix.comm.allgather_array(row)  # (P, G): each pair from the replica column that exchanges it
        grid = matrix.grid
        self.pair_counts = np.array([[world[grid.rank_of(i, grid.replica_for_block(j)), j] for j in range(groups)]
                                     for i in range(groups)], dtype=np.int64)
        owner_side = self._owner_parts(matched)
        self._build(owner_side)
        self._sampled = None
        self.setup_seconds = time.perf_counter() - began  # this rank's covers, set-up exchanges and matrices

    # ------------------------------------------------------------ set-up
    def _owner_parts(self, matched: dict[int, MatchedBlock]) -> dict[int, tuple[np.ndarray, sp.csr_matrix]]:
        """For each receiver ``i`` of this owner: ``(C_ig, B_ig[R_ig, not C_ig])``, the latter over this rank's
        rows; ``matched``: this rank's blocks' patterns and matchings. Collective over the replica column
        (:meth:`_symmetric`'s allgathers, one of sizes, one or two alltoallvs of ids and values where some pair
        needs them)."""
        matrix, groups, me = self.matrix, self.groups, self.group
        share = set(matrix.column_share)
        symmetric = self._symmetric(matched)
        # what this receiver sends each owner at set-up: ints (|C|, |R|, C ids, entries per R row, their columns)
        # and values; nothing where the owner can compute the cover itself or the cover is all columns
        ints_out: dict[int, np.ndarray] = {}
        values_out: dict[int, np.ndarray] = {}
        for j, cover in self.covers.items():
            if cover.rows.size == 0 or symmetric[me, j]:
                continue
            rows = pre_aggregated(matrix.blocks[j], cover)
            ints_out[j] = np.concatenate(([cover.columns.size, cover.rows.size], cover.columns,
                                          np.diff(rows.indptr), rows.indices)).astype(np.int64)
            values_out[j] = np.ascontiguousarray(rows.data)
        sizes = np.zeros((groups, 2), dtype=np.int64)
        for j in ints_out:
            sizes[j] = (ints_out[j].size, values_out[j].size)
        all_sizes = self.col_comm.allgather_array(sizes)  # (G, G, 2): [sender i, owner j]
        received = self._setup_exchange(ints_out, values_out, all_sizes)
        parts: dict[int, tuple[np.ndarray, sp.csr_matrix]] = {}
        if me not in share:
            return parts
        for i in range(groups):
            if i == me or self.pair_counts[i, me] == 0:
                continue
            if i in received:
                ints, values = received[i]
                n_c, n_r = int(ints[0]), int(ints[1])
                columns = ints[2:2 + n_c]
                lengths = ints[2 + n_c:2 + n_c + n_r]
                indices = ints[2 + n_c + n_r:]
                indptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
                parts[i] = (columns, sp.csr_matrix((values, indices, indptr), shape=(n_r, self.n_rows)))
            elif symmetric[i, me]:  # A_ig = A_gi^T bitwise: its cover from A_gi's matching
                cover = matched[i].transposed_cover()
                parts[i] = (cover.columns, pre_aggregated_of_transpose(matrix.blocks[i], cover))
            else:  # its cover is every nonzero column: p2p's send list
                parts[i] = (matrix.send_ids[i].astype(np.int64), sp.csr_matrix((0, self.n_rows), dtype=matrix.dtype))
        return parts

    def _symmetric(self, matched: dict[int, MatchedBlock]) -> np.ndarray:
        """``symmetric[i, j]`` for every pair of the replica column: owner ``j`` holds ``A_ji = A_ij^T`` bitwise.
        Collective over the replica column: one allgather of checksums (nnz, the sum of value bits: a row-
        normalised ``A`` differs there), and one of full fingerprints only where some pair's checksums agree.
        Each block is hashed once, with the lower group's ids first: it serves as receiver and as owner."""
        me, blocks = self.group, self.matrix.blocks
        facts = np.full((self.groups, 2), -1, dtype=np.int64)
        for k in matched:
            facts[k] = block_checksum(blocks[k])
        candidates = self._symmetric_pairs(self.col_comm.allgather_array(facts))  # (G, G, 2): [group, block]
        if not candidates.any():  # the same answer on every rank of the column
            return candidates
        facts[:] = -1
        for k in matched:
            if candidates[me, k]:  # symmetric in (i, j), so it also says whether k asks about A_kg
                facts[k] = block_fingerprint(blocks[k], transposed=me > k)
        return candidates & self._symmetric_pairs(self.col_comm.allgather_array(facts))

    @staticmethod
    def _symmetric_pairs(facts: np.ndarray) -> np.ndarray:
        """``symmetric[i, j]``: owner ``j`` holds ``A_ji``, and it equals ``A_ij^T`` (``facts[i, j]``: nnz and
        an order-independent hash of ``A_ij``'s entries, lower group's ids first, and value bits)."""
        mirrored = facts.transpose(1, 0, 2)
        out = (facts[..., 0] >= 0) & (mirrored[..., 0] >= 0) & (facts == mirrored).all(axis=2)
        np.fill_diagonal(out, False)
        return out

    def _setup_exchange(self, ints_out: dict[int, np.ndarray], values_out: dict[int, np.ndarray],
                        all_sizes: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Receivers' covers and partial-sum entries to the owners that cannot compute them (phase ``other``;
        counted in :attr:`setup_bytes`). Collective over the replica column; skipped where no pair needs it."""
        groups, me = self.groups, self.group
        self.setup_bytes = (0, 0)
        if not all_sizes.any():
            return {}
        dtype = self.matrix.dtype
        itemsize = np.dtype(dtype).itemsize
        send_ints = [int(all_sizes[me, k, 0]) for k in range(groups)]
        send_values = [int(all_sizes[me, k, 1]) for k in range(groups)]
        recv_ints = [int(all_sizes[k, me, 0]) for k in range(groups)]
        recv_values = [int(all_sizes[k, me, 1]) for k in range(groups)]
        empty_i, empty_v = np.empty(0, np.int64), np.empty(0, dtype)
        ints = torch.from_numpy(np.concatenate([ints_out.get(k, empty_i) for k in range(groups)] + [empty_i]))
        values = torch.from_numpy(np.concatenate([values_out.get(k, empty_v) for k in range(groups)] + [empty_v]))
        got_ints = torch.empty(sum(recv_ints), dtype=torch.int64)
        got_values = torch.empty(sum(recv_values), dtype=values.dtype)
        self.col_comm.alltoallv(ints, send_ints, got_ints, recv_ints, phase="other")
        self.col_comm.alltoallv(values, send_values, got_values, recv_values, phase="other")
        self.setup_bytes = (8 * sum(send_ints) + itemsize * sum(send_values),
                            8 * sum(recv_ints) + itemsize * sum(recv_values))
        int_pieces = np.split(got_ints.numpy(), np.cumsum(recv_ints)[:-1])
        value_pieces = np.split(got_values.numpy(), np.cumsum(recv_values)[:-1])
        return {k: (int_pieces[k], value_pieces[k]) for k in range(groups) if recv_ints[k] > 0}

    def _build(self, owner_side: dict[int, tuple[np.ndarray, sp.csr_matrix]]) -> None:
        """The receive operand ``O`` (over the concatenated receive buffer, owner order), the send matrix ``S``
        (receiver order) and its transpose, as one :class:`_PairExchange` the p2p exchange posts."""
        matrix, groups, me, n = self.matrix, self.groups, self.group, self.n_rows
        dtype = matrix.dtype
        recv_rows = [self.covers[j].size if j in self.covers else 0 for j in range(groups)]
        operand = self._receive_operand(recv_rows)
        send_rows = [0] * groups
        blocks = []
        for i in range(groups):
            if i not in owner_side:
                continue
            columns, partial = owner_side[i]
            unit = sp.csr_matrix((np.ones(columns.size, dtype=dtype), columns, np.arange(columns.size + 1)),
                                 shape=(columns.size, n))
            blocks.append(sp.vstack([unit, partial.astype(dtype)], format="csr"))
            send_rows[i] = columns.size + partial.shape[0]
            if send_rows[i] != self.pair_counts[i, me]:
                raise RuntimeError(f"cover plan: owner {me} would send {send_rows[i]} rows to {i}, but the cover "
                                   f"there has {self.pair_counts[i, me]}")
        send = sp.vstack(blocks, format="csr") if blocks else sp.csr_matrix((0, n), dtype=dtype)
        send.sort_indices()
        self.send_matrix = self.csr(send)
        self.send_transposed = self.csr(sp.csr_matrix(send.T))
        share = matrix.column_share
        traffic = bool(sum(int(self.pair_counts[i, j]) for j in share for i in range(groups) if i != j) > 0)
        empty_index = torch.empty(0, dtype=torch.int64, device=self.device)
        self.exact_pairs = _PairExchange(empty_index, send_rows, recv_rows, self.csr(operand), operand, traffic)

    def _receive_operand(self, recv_rows: list[int]) -> sp.csr_matrix:
        """``O`` (``n x sum(recv_rows)``, canonical CSR): per row, owner by owner, the entries of ``B_gj`` in sent
        columns (at their places in ``C``) and then the row's unit column if it is pre-aggregated, written
        straight into place (from canonical blocks every row comes out sorted)."""
        n, dtype, blocks = self.n_rows, self.matrix.dtype, self.matrix.blocks
        starts = np.concatenate(([0], np.cumsum(recv_rows))).astype(np.int64)
        chunks = {}  # per owner: (its entries in sent columns, their count per row, each column's place in C)
        lengths = np.zeros(n, dtype=np.int64)
        for j in sorted(self.covers):
            cover, block = self.covers[j], blocks[j]
            place = np.full(block.shape[1], -1, dtype=np.int64)  # a column's place in C, -1: not sent
            place[cover.columns] = np.arange(cover.columns.size)
            in_c = np.flatnonzero(place[block.indices] >= 0)  # the entries of sent columns, row by row
            per_row = np.diff(np.searchsorted(in_c, block.indptr))
            chunks[j] = (in_c, per_row, place)
            lengths += per_row
            lengths[cover.rows] += 1
        indptr = np.concatenate(([0], np.cumsum(lengths)))
        total = int(indptr[-1])
        index = np.int32 if max(total, int(starts[-1])) < 2**31 else np.int64
        indices, data = np.empty(total, dtype=index), np.empty(total, dtype=dtype)
        filled = indptr[:-1].copy()  # where each row's next entry goes
        for j, (in_c, per_row, place) in chunks.items():
            cover, block = self.covers[j], blocks[j]
            first = np.repeat(filled - (np.cumsum(per_row) - per_row), per_row) + np.arange(in_c.size)
            indices[first] = starts[j] + place[block.indices[in_c]]
            data[first] = block.data[in_c]
            filled += per_row
            indices[filled[cover.rows]] = starts[j] + cover.columns.size + np.arange(cover.rows.size)
            data[filled[cover.rows]] = 1
            filled[cover.rows] += 1
        operand = sp.csr_matrix((data, indices, indptr.astype(index)), shape=(n, int(starts[-1])))
        operand.sort_indices()  # only a check where the blocks are canonical, as DistCSR keeps them
        return operand

    # --------------------------------------------------------- semantics
    @classmethod
    def run_refusal(cls, *, attention: bool = False, receiver_dropout: bool = False) -> str | None:
        if attention:
            return ("--plan cover sends partial sums, but attention (gat) weighs each edge by its source row "
                    "itself: use --plan p2p for gat")
        if receiver_dropout:
            return ("--plan cover sends partial sums, which the receiver cannot mask per row: use "
                    "--dropout-side owner (or --plan p2p)")
        return None

    # ------------------------------------------------------------ exchange
    def post_rows(self, h: torch.Tensor, phase: str, context: ExchangeContext | None,
                  strategy: ExchangeStrategy) -> Flight:
        pairs = self.exact_pairs
        return self._post_pairs(context, pairs, strategy, lambda: self.products.product(self.send_matrix, h),
                                h.shape[1], phase, backward=False)

    def _messages_of(self, strategy: ExchangeStrategy, epoch: int) -> list[Transfer]:
        return [Transfer(-1, self.exact_pairs)]

    def part_block(self, part: Transfer) -> sp.csr_matrix | None:
        """Refused: a gather (attention) needs the rows themselves, and a cover sends partial sums."""
        raise ValueError(self.run_refusal(attention=True))

    def gradient_operand(self, part: Transfer) -> torch.Tensor | None:
        return self.send_transposed

    def gradient_rows(self, part: Transfer) -> torch.Tensor | None:
        return None

    def send_matrix_bytes(self) -> int:
        """Bytes of the owner's send matrix ``S`` and its transpose (the memory the cover adds over ``p2p``'s
        send list; :meth:`transpose_bytes` counts the receiver's transposed blocks, as every plan's does)."""
        return csr_bytes(self.send_matrix) + csr_bytes(self.send_transposed)
