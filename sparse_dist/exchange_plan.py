"""The base of the exchange plans: how ``H`` rows (and, reversed, their gradients) move between ranks.

A plan posts the non-blocking exchanges of one call as a :class:`~sparse_dist.exchange.Flight` of
parts and describes each part (its rows, the block over them, where its gradient lands); it owns its
blocks in the forms it needs (scipy, CSR tensors, transposes built on first use). It multiplies
nothing: :class:`sparse_dist.partial.PartialSpMM` posts a plan's flights and overlaps them with the
block products (:class:`sparse_dist.products.BlockProducts`). The concrete plans are in
:mod:`sparse_dist.broadcast_plans` and :mod:`sparse_dist.p2p_plan`; :mod:`sparse_dist.plans` names them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.accounting import ComputeTimer
from sparse_dist.compress import Codec
from sparse_dist.cost import Network
from sparse_dist.csr import csr_bytes, is_symmetric, torch_csr
from sparse_dist.dcsr import DistCSR
from sparse_dist.exchange import ExactStrategy, ExchangeContext, ExchangeStrategy, Flight, Transfer
from sparse_dist.layout import Grid
from sparse_dist.products import BlockProducts


@dataclass
class Gathered:
    """One part of a gather (:meth:`sparse_dist.partial.PartialSpMM.gather`): the rows that arrived (as this rank
    multiplies them) and ``block``, this rank's rows of ``A`` with those rows as columns (scipy CSR,
    ``n_g x rows``); ``global_rows``: the rows' global ids where this rank knows them (plans built with
    ``row_masks``)."""

    part: Transfer
    rows: torch.Tensor
    block: sp.csr_matrix
    global_rows: np.ndarray | range | None = None


class ExchangePlan(ABC):
    """One way of moving ``H`` rows between ranks; owns the blocks in the form it needs.

    ``strategy`` decides what each training exchange carries; evaluation always uses the exact one.
    ``row_masks``: training calls may carry receiver-side dropout masks (``ExchangeContext.dropout``),
    so every received message must know its rows' global ids (the sparse broadcast then shares each
    owner's ``B_j`` ids once at set-up, collective over the replica column). ``products``: the timed
    local products of the operator that holds the plan (booked in ``timer``).
    """

    name: ClassVar[str]
    carries_samples: ClassVar[bool] = True   # can send a sampled subset of the boundary rows
    carries_history: ClassVar[bool] = False  # every receiver gets the same block, so blocks can be cached
    carries_per_receiver: ClassVar[bool] = True  # each receiver can get its own subset of an owner's rows
    no_samples_reason: ClassVar[str] = ""
    no_history_reason: ClassVar[str] = ""
    no_per_receiver_reason: ClassVar[str] = ""
    # performance model: whether an exchange posted beside other work travels during that work (measured: p2p's
    # messages do; a broadcast plan's collectives, rounds that each need the poster's MPI calls, wait for it)
    progresses_unattended: ClassVar[bool] = False
    # byte model: whether the rows moved per pair are the plan's own (``pair_counts``, e.g. a cover's), not a
    # function of the boundary sets alone
    pair_counted: ClassVar[bool] = False
    sends_union: ClassVar[bool] = False  # its bytes depend on |B_j|, the union of what every group needs of j
    pair_counts: np.ndarray | None = None  # rows per pair ``[receiver, owner]`` of one exact forward, where pair_counted
    setup_seconds: float | None = None  # this rank's time building the plan, where set-up does work of its own (cover)

    def __init__(self, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer,
                 strategy: ExchangeStrategy | None = None, *, row_masks: bool = False) -> None:
        strategy = strategy if strategy is not None else ExactStrategy()
        problem = self.refusal(samples=strategy.samples, caches=strategy.caches, per_receiver=strategy.per_receiver)
        if problem:
            raise ValueError(problem)
        self.strategy, self.exact_strategy = strategy, ExactStrategy()
        self.matrix, self.dtype, self.device, self.timer = matrix, dtype, device, timer
        self.products = BlockProducts(dtype, device, timer)
        self.row_masks = row_masks
        self.col_comm, self.group, self.groups = matrix.col_comm, matrix.group, matrix.grid.groups
        self.n_rows = matrix.lshape[0]
        self._transposed: dict[object, torch.Tensor] = {}
        self.local_block = self.csr(matrix.blocks[self.group]) if self.group in matrix.blocks else None
        self.codec: Codec | None = None  # compresses training exchanges (set by DistSpMM; sparse_dist.compress)
        self.strategy.bind(self)
        self.exact_strategy.bind(self)

    # --------------------------------------------------------- semantics
    @classmethod
    def refusal(cls, *, samples: bool, caches: bool, per_receiver: bool = False) -> str | None:
        """Why this plan cannot carry a strategy that samples, caches and/or sends each receiver its own
        subset, or None when it can."""
        if samples and not cls.carries_samples:
            return cls.no_samples_reason
        if caches and not cls.carries_history:
            return cls.no_history_reason
        if per_receiver and not cls.carries_per_receiver:
            return cls.no_per_receiver_reason
        return None

    @classmethod
    def run_refusal(cls, *, attention: bool = False, receiver_dropout: bool = False) -> str | None:
        """Why this plan cannot serve a run whose layers gather the received rows themselves (``attention``) or
        whose exchanges carry pre-dropout rows (``receiver_dropout``), one sentence; None: it can."""
        return None

    @classmethod
    @abstractmethod
    def moved_rows(cls, rows: np.ndarray, boundary_counts: np.ndarray, union_sizes: np.ndarray) -> np.ndarray:
        """``moved[i, j]``: rows of ``H_j`` that receiver group ``i`` gets in one exact forward (diagonal unused).

        ``rows[j] = n_j``, ``boundary_counts[i, j] = |B_ij|`` (for a ``pair_counted`` plan its own
        ``pair_counts``), ``union_sizes[j] = |B_j|``; float inputs (a partition model's expectations) give
        expected rows.
        """

    @classmethod
    @abstractmethod
    def exchange_seconds(cls, rows: np.ndarray, boundary_counts: np.ndarray, union_sizes: np.ndarray, grid: Grid,
                         row_bytes: float, net: Network) -> float:
        """Alpha-beta time of one exchange over the replica columns (the slowest column), MPICH algorithms."""

    def strategy_for(self, context: ExchangeContext | None) -> ExchangeStrategy:
        """The strategy of a call: the plan's while training, else (evaluation, the audit) the exact one."""
        return self.strategy if context is not None and context.training and not context.bypass_policy else self.exact_strategy

    def _codec_for(self, context: ExchangeContext | None, direction: str) -> Codec | None:
        """The compression of this call's messages in ``direction`` (``rows`` or ``gradients``) at its layer:
        training exchanges only (evaluation and the audit stay exact). Taken when the messages are posted, so a
        flight decodes at the width it was coded with (:meth:`sparse_dist.compress.Codec.at`)."""
        if self.codec is None or context is None or not context.training or context.bypass_policy:
            return None
        return self.codec.at(context.layer, direction)

    @staticmethod
    def _coded(rows: torch.Tensor, codec: Codec | None, key: tuple[int, str, int], total: int,
               positions: np.ndarray | None, seed_key: tuple[int, ...]) -> torch.Tensor:
        """What a sender hands MPI for ``rows``: the rows, or their code (with feedback where asked)."""
        return rows if codec is None else codec.send(rows, key, total, positions, seed_key)

    @contextmanager
    def posting_on(self, comm: Any) -> Iterator[None]:
        """Post this plan's exchanges on ``comm`` meanwhile: a duplicate of the replica column (the same ranks,
        in the same order). An evaluation run in turns beside a step posts on its own duplicate, so that MPICH
        with several VCIs (``MPIR_CVAR_CH4_NUM_VCIS``) gives its transfers their own connections and the step's
        rows need not queue behind them. Local; requests posted meanwhile keep their communicator."""
        saved, self.col_comm = self.col_comm, comm
        try:
            yield
        finally:
            self.col_comm = saved

    def _receive_buffer(self, part: Transfer, count: int, width: int, codec: Codec | None) -> torch.Tensor:
        """A receive buffer for ``count`` rows; a coded one decodes into rows when the part completes."""
        if codec is None:
            return torch.empty(count, width, dtype=self.dtype, device=self.device)
        part.decode = lambda payload: codec.decode(payload, width, self.dtype)
        return codec.empty(count, width, self.device)

    # ------------------------------------------------------------ blocks
    def csr(self, matrix: sp.csr_matrix) -> torch.Tensor:
        """``matrix`` as a CSR tensor of this plan's dtype on its device."""
        return torch_csr(matrix, self.dtype, self.device)

    def _transpose_of(self, key: object, matrix: sp.csr_matrix) -> torch.Tensor:
        """The (cached) CSR of ``matrix.T``, built locally on first use. The local block of a symmetric
        matrix (GCN on an undirected graph) is its own transpose: no second copy of the largest block."""
        if key not in self._transposed:
            if key == "local" and self.local_block is not None and is_symmetric(matrix):
                self._transposed[key] = self.local_block
            else:
                self._transposed[key] = self.csr(sp.csr_matrix(matrix.T))
        return self._transposed[key]

    def local_transpose(self) -> torch.Tensor:
        """``A_gg^T`` as CSR (built on first use; the forward block itself when ``A_gg`` is symmetric)."""
        return self._transpose_of("local", self.matrix.blocks[self.group])

    def transpose_bytes(self) -> int:
        """Bytes of the transposed blocks this rank stores (a symmetric local block reuses its forward CSR)."""
        return sum(csr_bytes(t) for t in self._transposed.values() if t is not self.local_block)

    # ------------------------------------------------------------ exchange
    @abstractmethod
    def exact_parts(self) -> list[Transfer]:
        """The exact exchange's messages as (unposted) parts: what an evaluation forward sends."""

    @abstractmethod
    def post_rows(self, h: torch.Tensor, phase: str, context: ExchangeContext | None,
                  strategy: ExchangeStrategy) -> Flight:
        """Post this call's forward exchange of ``h``'s rows (what ``strategy`` says travels) as a flight.
        Collective over ``col_comm`` (the parts are posted in the same order on every rank)."""

    @abstractmethod
    def post_gradients(self, forward: Flight, piece_of: Callable[[Transfer], torch.Tensor], width: int, phase: str,
                       context: ExchangeContext | None, strategy: ExchangeStrategy) -> Flight:
        """Post the reverse exchange of the ``forward`` flight: each receiver's ``piece_of(part)`` (gradients of
        that part's rows, ``rows x width``) summed at the owner of the rows. Collective over ``col_comm``."""

    def _flight(self, context: ExchangeContext | None, parts: list[Transfer], strategy: ExchangeStrategy,
                source_epoch: int | None = None, gradients: bool = False) -> Flight:
        """A flight of ``parts``; a training call's gradient flight is held (posted when told) where the strategy
        holds them (:attr:`ExchangeStrategy.holds_gradients`)."""
        epoch, layer = (context.epoch, context.layer) if context is not None else (-1, -1)
        held = gradients and context is not None and strategy.holds_gradients
        return Flight(epoch, layer, parts, strategy.posts_ahead, source_epoch, held)

    @abstractmethod
    def _messages_of(self, strategy: ExchangeStrategy, epoch: int) -> list[Transfer]:
        """The (unposted) forward parts a sampling or exact ``strategy`` sends in ``epoch`` (deterministic)."""

    def parts_of(self, strategy: ExchangeStrategy, epoch: int, *, backward: bool) -> list[Transfer]:
        """The parts of ``epoch``'s forward flight (``backward``: of the gradient flight reversing it), unposted,
        rebuilt from the epoch alone: how a pipelined strategy restores a checkpointed flight."""
        parts = self._messages_of(strategy, epoch)
        return self._gradient_parts(parts, strategy) if backward else parts

    def _gradient_parts(self, parts: list[Transfer], strategy: ExchangeStrategy) -> list[Transfer]:
        """The forward parts whose gradients travel back (all; the broadcast plans leave some out)."""
        return parts

    # ------------------------------------------------- what each part is
    @abstractmethod
    def part_operand(self, part: Transfer) -> torch.Tensor | None:
        """The CSR this rank multiplies an arrived forward part's rows by (None: it uses none of them)."""

    @abstractmethod
    def part_transposed(self, part: Transfer) -> torch.Tensor | None:
        """The CSR of that block's transpose (``A_part^T``, for this rank's gradient piece; None: zeros)."""

    @abstractmethod
    def gradient_rows(self, part: Transfer) -> torch.Tensor | None:
        """This owner's rows that an arrived gradient part adds into (None: all of them, in order)."""

    def gradient_operand(self, part: Transfer) -> torch.Tensor | None:
        """A CSR (``n_g x rows``) the owner multiplies an arrived gradient part by to add it into its rows, where
        they are not simply :meth:`gradient_rows` (the cover plan's partial sums); None: they are."""
        return None

    @abstractmethod
    def part_block(self, part: Transfer) -> sp.csr_matrix | None:
        """This rank's block over a forward part's rows (None: it uses none of them, or it sent them)."""

    @abstractmethod
    def part_global_rows(self, part: Transfer) -> np.ndarray | range | None:
        """Global ids of a forward part's rows, where this rank knows them."""

    @abstractmethod
    def part_rows(self, part: Transfer) -> int:
        """Rows a forward part carries (the same on every rank of the column)."""
