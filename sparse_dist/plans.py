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

A plan knows only how bytes move. What each message carries while training
(exact, sampled, cached) is decided by the
:class:`~sparse_dist.exchange.ExchangeStrategy` it holds. Each plan class is
the one home of its semantics: which strategies it can carry
(``carries_samples``, ``carries_history``), its byte model
(:meth:`ExchangePlan.moved_rows`) and its alpha-beta cost
(:meth:`ExchangePlan.exchange_seconds`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, ClassVar, Iterator

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.accounting import ComputeTimer
from sparse_dist.compress import Codec
from sparse_dist.cost import Network, alltoallv_time, bcast_time
from sparse_dist.csr import csr_bytes, is_symmetric, keep_columns, remap_columns, torch_csr
from sparse_dist.dcsr import DistCSR
from sparse_dist.exchange import ExactStrategy, ExchangeContext, ExchangeStrategy, Flight, Message, Part
from sparse_dist.layout import Grid

if TYPE_CHECKING:  # annotations only: the byte model (sparse_dist.predict) loads without MPI
    from sparse_dist.comm import Pending


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


@dataclass
class Gathered:
    """One part of a :meth:`ExchangePlan.gather`: the rows that arrived (as this rank multiplies them) and
    ``block``, this rank's rows of ``A`` with those rows as columns (scipy CSR, ``n_g x rows``);
    ``global_rows``: the rows' global ids where this rank knows them (plans built with ``row_masks``)."""

    part: Part
    rows: torch.Tensor
    block: sp.csr_matrix
    global_rows: np.ndarray | range | None = None


class ExchangePlan(ABC):
    """One way of moving ``H`` rows between ranks; owns the blocks in the form it needs.

    ``strategy`` decides what each training exchange carries; evaluation always uses the exact one.
    ``row_masks``: training calls may carry receiver-side dropout masks (``ExchangeContext.dropout``),
    so every received message must know its rows' global ids (the sparse broadcast then shares each
    owner's ``B_j`` ids once at set-up, collective over the replica column).
    """

    name: ClassVar[str]
    carries_samples: ClassVar[bool] = True   # can send a sampled subset of the boundary rows
    carries_history: ClassVar[bool] = False  # every receiver gets the same block, so blocks can be cached
    carries_per_receiver: ClassVar[bool] = True  # each receiver can get its own subset of an owner's rows
    no_samples_reason: ClassVar[str] = ""
    no_history_reason: ClassVar[str] = ""
    no_per_receiver_reason: ClassVar[str] = ""

    def __init__(self, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer,
                 strategy: ExchangeStrategy | None = None, *, row_masks: bool = False) -> None:
        strategy = strategy if strategy is not None else ExactStrategy()
        problem = self.refusal(samples=strategy.samples, caches=strategy.caches, per_receiver=strategy.per_receiver)
        if problem:
            raise ValueError(problem)
        self.strategy = strategy
        self.exact = ExactStrategy()
        self.matrix = matrix
        self.dtype = dtype
        self.device = device
        self.timer = timer
        self.row_masks = row_masks
        self.col_comm = matrix.col_comm
        self.group = matrix.group
        self.groups = matrix.grid.groups
        self.n_rows = matrix.lshape[0]
        self._transposed: dict[object, torch.Tensor] = {}
        self.local_block = self.csr(matrix.blocks[self.group]) if self.group in matrix.blocks else None
        self.codec: Codec | None = None  # compresses training exchanges (set by DistSpMM; sparse_dist.compress)
        self.strategy.bind(self)
        self.exact.bind(self)

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
    @abstractmethod
    def moved_rows(cls, rows: np.ndarray, boundary_counts: np.ndarray, union_sizes: np.ndarray) -> np.ndarray:
        """``moved[i, j]``: rows of ``H_j`` that receiver group ``i`` gets in one exact forward (diagonal unused).

        ``rows[j] = n_j``, ``boundary_counts[i, j] = |B_ij|``, ``union_sizes[j] = |B_j|``; float inputs
        (a partition model's expectations) give expected rows.
        """

    @classmethod
    @abstractmethod
    def exchange_seconds(cls, rows: np.ndarray, boundary_counts: np.ndarray, union_sizes: np.ndarray, grid: Grid,
                         row_bytes: float, net: Network) -> float:
        """Alpha-beta time of one exchange over the replica columns (the slowest column), MPICH algorithms."""

    def _strategy_for(self, context: ExchangeContext | None) -> ExchangeStrategy:
        return self.strategy if context is not None and context.training and not context.exact else self.exact

    def _codec_for(self, context: ExchangeContext | None) -> Codec | None:
        """The compression of this call: training exchanges only (evaluation and the audit stay exact)."""
        return self.codec if context is not None and context.training and not context.exact else None

    @staticmethod
    def _coded(rows: torch.Tensor, codec: Codec | None, key: tuple[int, str, int], total: int,
               positions: np.ndarray | None, seed_key: tuple[int, ...]) -> torch.Tensor:
        """What a sender hands MPI for ``rows``: the rows, or their code (with feedback where asked)."""
        return rows if codec is None else codec.send(rows, key, total, positions, seed_key)

    def _receive_buffer(self, part: Part, count: int, width: int, codec: Codec | None) -> torch.Tensor:
        """A receive buffer for ``count`` rows; a coded one decodes into rows when the part completes."""
        if codec is None:
            return self._rows(count, width)
        part.decode = lambda payload: codec.decode(payload, width, self.dtype)
        return codec.empty(count, width, self.device)

    # ------------------------------------------------------------ blocks
    def csr(self, matrix: sp.csr_matrix) -> torch.Tensor:
        """``matrix`` as a CSR tensor of this plan's dtype on its device."""
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
                self._transposed[key] = self.csr(sp.csr_matrix(matrix.T))
        return self._transposed[key]

    def local_transpose(self) -> torch.Tensor:
        """``A_gg^T`` as CSR (built on first use; the forward block itself when ``A_gg`` is symmetric)."""
        return self._transpose_of("local", self.matrix.blocks[self.group])

    def local_product(self, parts: list[tuple[torch.Tensor, torch.Tensor]], rows: int, width: int) -> torch.Tensor:
        """``sum_k a_k @ x_k`` over ``parts`` (CSR ``rows x n_k`` times dense ``n_k x width``), booked as local SpMM."""
        out = self._output(rows, width)
        for a, x in parts:
            self._multiply_into(out, a, x)
        return out.tensor()

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

    def _rows(self, count: int, width: int) -> torch.Tensor:
        return torch.empty(count, width, dtype=self.dtype, device=self.device)

    def _local_input(self, h: torch.Tensor, context: ExchangeContext | None) -> torch.Tensor:
        """What this rank multiplies its own block by: ``h``, masked under receiver-side dropout."""
        if context is None or context.dropout is None:
            return h
        mask = context.dropout.own(h)
        with self.timer.measure("dropout", self.device):
            return h * mask

    def _received_input(self, rows: torch.Tensor, global_rows: np.ndarray | range | None,
                        context: ExchangeContext | None) -> torch.Tensor:
        """Received (or cached) rows as multiplied: masked by the receiver under receiver-side dropout.

        A new tensor: the receive buffer stays pre-dropout, so a cache that keeps it means something
        in the next epoch.
        """
        if context is None or context.dropout is None or rows.shape[0] == 0:
            return rows
        if global_rows is None:
            raise RuntimeError(f"the {self.name} plan was built without row_masks=True, so it cannot apply "
                               f"receiver-side dropout (it does not know the received rows' global ids)")
        mask = context.dropout.of_rows(global_rows, rows)
        with self.timer.measure("dropout", self.device):
            return rows * mask

    # ------------------------------------------------------------ exchange
    @abstractmethod
    def _exact_parts(self) -> list[Part]:
        """The exact exchange's messages as (unposted) parts: what an evaluation forward sends."""

    @abstractmethod
    def post_rows(self, h: torch.Tensor, phase: str, context: ExchangeContext | None,
                  strategy: ExchangeStrategy) -> Flight:
        """Post this call's forward exchange of ``h``'s rows (what ``strategy`` says travels) as a flight.

        Collective over ``col_comm`` (the parts are posted in the same order on every rank).
        """

    @abstractmethod
    def post_gradients(self, forward: Flight, piece_of: Callable[[Part], torch.Tensor], width: int, phase: str,
                       context: ExchangeContext | None, strategy: ExchangeStrategy) -> Flight:
        """Post the reverse exchange of the ``forward`` flight: each receiver's ``piece_of(part)`` (gradients of
        that part's rows, ``rows x width``) summed at the owner of the rows. Collective over ``col_comm``."""

    @abstractmethod
    def _multiply_part(self, out: "_Output", part: Part, rows: torch.Tensor | None,
                       context: ExchangeContext | None) -> None:
        """``out += A_part rows`` for an arrived forward part (nothing for the owner's own broadcast)."""

    @abstractmethod
    def _gradient_piece(self, part: Part, dt: torch.Tensor) -> torch.Tensor:
        """``A_part^T dT``: this rank's gradient of the rows a forward part brought."""

    @abstractmethod
    def _add_gradient(self, out: "_Output", part: Part, rows: torch.Tensor | None) -> None:
        """Add an arrived backward part's summed gradient into the owner's rows (nothing elsewhere)."""

    @abstractmethod
    def _part_block(self, part: Part) -> sp.csr_matrix | None:
        """This rank's block over a forward part's rows (None: it uses none of them, or it sent them)."""

    @abstractmethod
    def _part_global_rows(self, part: Part) -> np.ndarray | range | None:
        """Global ids of a forward part's rows, where this rank knows them."""

    @abstractmethod
    def _part_rows(self, part: Part) -> int:
        """Rows a forward part carries (the same on every rank of the column)."""

    def _flight(self, context: ExchangeContext | None, parts: list[Part], strategy: ExchangeStrategy,
                source_epoch: int | None = None) -> Flight:
        epoch, layer = (context.epoch, context.layer) if context is not None else (-1, -1)
        return Flight(epoch, layer, parts, strategy.posts_ahead, source_epoch)

    @abstractmethod
    def _messages_of(self, strategy: ExchangeStrategy, epoch: int) -> list[Part]:
        """The (unposted) forward parts a sampling or exact ``strategy`` sends in ``epoch`` (deterministic)."""

    def parts_of(self, strategy: ExchangeStrategy, epoch: int, *, backward: bool) -> list[Part]:
        """The parts of ``epoch``'s forward flight (``backward``: of the gradient flight reversing it), unposted,
        rebuilt from the epoch alone: how a pipelined strategy restores a checkpointed flight."""
        parts = self._messages_of(strategy, epoch)
        return self._gradient_parts(parts, strategy) if backward else parts

    def _gradient_parts(self, parts: list[Part], strategy: ExchangeStrategy) -> list[Part]:
        """The forward parts whose gradients travel back (all; the broadcast plans leave some out)."""
        return parts

    def _own_block(self, context: ExchangeContext | None, *, transposed: bool) -> torch.Tensor | None:
        """``A_gg`` (or its transpose) as this call multiplies it: the strategy's sampled block of the epoch
        where it samples inner entries too (``psc``), else the plan's own."""
        sampled = self._strategy_for(context).local_blocks(context) if context is not None else None
        if sampled is not None:
            return sampled[1] if transposed else sampled[0]
        if self.local_block is None:
            return None
        return self.local_transpose() if transposed else self.local_block

    def _arrived_rows(self, h: torch.Tensor, phase: str, context: ExchangeContext | None,
                      meanwhile: Callable[[], None]) -> Iterator[tuple[Part, torch.Tensor | None]]:
        """Post the forward exchange of ``h``, run ``meanwhile`` (local work), then yield each part of the flight
        the strategy says to use, with its rows as they arrive (exhaust it: the last step records the flight)."""
        strategy = self._strategy_for(context)
        if context is not None:
            strategy.progress()
            strategy.saw_own_rows(context, h)
        flight = self.post_rows(h, phase, context, strategy)
        used = strategy.rows_to_use(context, flight) if context is not None else flight
        meanwhile()
        for part in used.arrivals():
            yield part, strategy.on_rows(context, part) if context is not None else part.rows
        if context is not None:
            strategy.finish_forward(context, used)

    def _arrived_gradients(self, piece_of: Callable[[Part], torch.Tensor], width: int, phase: str,
                           context: ExchangeContext | None,
                           meanwhile: Callable[[], None]) -> Iterator[tuple[Part, torch.Tensor | None]]:
        """Post the reverse exchange of the forward parts of ``context`` (their pieces from ``piece_of``), run
        ``meanwhile``, then yield each part of the gradient flight to use, with the owner's summed gradient."""
        strategy = self._strategy_for(context)
        if context is not None:
            strategy.progress()
        forward = strategy.used(context) if context is not None else Flight(-1, -1, self._exact_parts(), None)
        back = self.post_gradients(forward, piece_of, width, phase, context, strategy)
        used = strategy.gradients_to_use(context, back) if context is not None else back
        meanwhile()
        for part in used.arrivals():
            yield part, strategy.on_gradients(context, part) if context is not None else part.rows

    def forward(self, h: torch.Tensor, phase: str, context: ExchangeContext | None = None) -> torch.Tensor:
        """This rank's partial ``sum_j A_gj H_j`` over its column share (``n_g x F``).

        Posts the exchange, multiplies the local block meanwhile, then each part as it arrives. With a
        pipelined strategy the parts multiplied are those of an earlier epoch's flight.
        Collective over ``col_comm``: every rank of the replica column calls it with the same context.
        """
        out = self._output(self.n_rows, h.shape[1])

        def local() -> None:
            block = self._own_block(context, transposed=False)
            if block is not None:
                self._multiply_into(out, block, self._local_input(h, context))

        for part, rows in self._arrived_rows(h, phase, context, local):
            self._multiply_part(out, part, rows, context)
        return out.tensor()

    def transpose(self, dt: torch.Tensor, phase: str, context: ExchangeContext | None = None) -> torch.Tensor:
        """This rank's ``dH_g`` summed over the row groups of its replica column (``n_g x F``).

        Collective over ``col_comm``; mirrors the forward of the same context (the same parts).
        """
        out = self._output(self.n_rows, dt.shape[1])

        def local() -> None:
            block = self._own_block(context, transposed=True)
            if block is not None:
                self._multiply_into(out, block, dt)

        for part, rows in self._arrived_gradients(lambda part: self._gradient_piece(part, dt), dt.shape[1], phase,
                                                  context, local):
            self._add_gradient(out, part, rows)
        return out.tensor()

    # ------------------------------------------------- rows without a product
    def gather(self, h: torch.Tensor, phase: str, context: ExchangeContext | None = None) -> list[Gathered]:
        """The forward exchange without the product: every part this rank uses, with its rows and block.

        For layers whose aggregation is not a fixed ``A H`` (attention): each :class:`Gathered` holds the
        rows that arrived (``rows x F``; a pipelined strategy's are an earlier epoch's, a cached one's
        may be cached rows; masked by this rank under receiver-side dropout) and ``block``, this rank's
        rows of ``A`` over those rows as columns (sampled and scaled where the strategy samples). The
        owner's own broadcast is left out. Collective over ``col_comm``, like :meth:`forward`; the
        transpose of the same context is :meth:`scatter`.
        """
        out = []
        for part, rows in self._arrived_rows(h, phase, context, lambda: None):
            block = self._part_block(part)
            if rows is not None and block is not None:
                ids = self._part_global_rows(part)
                out.append(Gathered(part, self._received_input(rows, ids, context), block, ids))
        return out

    def scatter(self, gathered: list[Gathered], gradients: list[torch.Tensor], width: int, phase: str,
                context: ExchangeContext | None = None) -> torch.Tensor:
        """The reverse of :meth:`gather`: ``gradients[k]`` (the gradient of ``gathered[k].rows``, ``width``
        columns, the same on every rank) goes back to its owner; returns the sum of what every other rank
        sent for this rank's own rows (``n_g x width``).

        Collective over ``col_comm``: call it once with the context of the gather.
        """
        by_owner = {item.part.owner: grad for item, grad in zip(gathered, gradients)}  # one part per owner

        def piece_of(part: Part) -> torch.Tensor:
            grad = by_owner.get(part.owner)
            count = self._part_rows(part)
            return grad.contiguous() if grad is not None else torch.zeros(count, width, dtype=self.dtype,
                                                                          device=self.device)

        out = self._output(self.n_rows, width)
        for part, rows in self._arrived_gradients(piece_of, width, phase, context, lambda: None):
            self._add_gradient(out, part, rows)
        return out.tensor()


class _BroadcastPlan(ExchangePlan):
    """Shared loop of the two broadcast plans; they differ in which owner rows travel.

    Owners of this replica column take turns (``owners``, in order): each broadcasts its message,
    receivers multiply it by their block ``A_gj`` (columns numbered as message rows). A STALE
    message (cached strategy) moves nothing; receivers multiply their cached rows instead. The
    transpose reduces the pieces ``A_gj^T dT_g`` to each owner, mirroring the forward's messages.
    """

    carries_history = True
    carries_per_receiver = False
    no_per_receiver_reason = ("per-receiver sampling (psc: each receiver's own edge probabilities) needs the p2p "
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
        # Owners take turns; a replica column handles the owners j with j % c == its replica.
        message_rows = cls.moved_rows(rows, boundary_counts, union_sizes).max(axis=0, initial=0)
        per_column = [0.0] * grid.replication
        for j in range(grid.groups):
            per_column[grid.replica_for_block(j)] += bcast_time(float(message_rows[j]) * row_bytes, grid.groups, net)
        return max(per_column)

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
    def _exact_parts(self) -> list[Part]:
        return [Part(j, self.exact_message(j)) for j in self.owners]

    def post_rows(self, h: torch.Tensor, phase: str, context: ExchangeContext | None,
                  strategy: ExchangeStrategy) -> Flight:
        messages = (strategy.forward_messages(self, context, h) if context is not None
                    else {j: self.exact_message(j) for j in self.owners})
        width = h.shape[1]

        codec = self._codec_for(context)
        epoch, layer = (context.epoch, context.layer) if context is not None else (-1, -1)

        def starter(part: Part) -> Callable[[], tuple[Pending | None, torch.Tensor | None]]:
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

        parts = [Part(j, m) for j, m in messages.items()]
        for part in parts:
            part.start = starter(part)
        return self._flight(context, parts, strategy)

    def _multiply_part(self, out: _Output, part: Part, rows: torch.Tensor | None,
                       context: ExchangeContext | None) -> None:
        message = part.message
        if part.owner != self.group and message.block_torch is not None and rows is not None:
            self._multiply_into(out, message.block_torch, self._received_input(rows, message.global_rows, context))

    def _part_block(self, part: Part) -> sp.csr_matrix | None:
        return part.message.block if part.owner != self.group else None

    def _part_global_rows(self, part: Part) -> np.ndarray | range | None:
        return part.message.global_rows

    def _part_rows(self, part: Part) -> int:
        return part.message.count

    def post_gradients(self, forward: Flight, piece_of: Callable[[Part], torch.Tensor], width: int, phase: str,
                       context: ExchangeContext | None, strategy: ExchangeStrategy) -> Flight:
        codec = self._codec_for(context)
        epoch, layer = (context.epoch, context.layer) if context is not None else (-1, -1)

        def starter(part: Part) -> Callable[[], tuple[Pending | None, torch.Tensor | None]]:
            j, count = part.owner, part.message.count

            def start() -> tuple[Pending | None, torch.Tensor | None]:
                if codec is not None:  # codes cannot be summed by MPI: gather them to the owner, who sums
                    if j == self.group:
                        gathered = codec.empty(self.col_comm.size * count, width, self.device)
                        part.decode = lambda payload: self._sum_pieces(payload, count, width, codec)
                        return self.col_comm.igather_(None, gathered, root=j, phase=phase), gathered
                    sent = codec.send(piece_of(part), (layer, "gradients", j), self._message_rows(j),
                                      part.message.positions, (epoch, layer, 1, self.group, j))
                    return self.col_comm.igather_(sent, None, root=j, phase=phase), None
                if j == self.group:  # the owner receives the sum in place into a zeroed message buffer
                    result = torch.zeros(count, width, dtype=self.dtype, device=self.device)
                    return self.col_comm.ireduce(None, result, root=j, phase=phase), result
                return self.col_comm.ireduce(piece_of(part), None, root=j, phase=phase), None
            return start

        sent = [Part(part.owner, part.message) for part in self._gradient_parts(forward.parts, strategy)]
        for part in sent:
            part.start = starter(part)
        return self._flight(context, sent, strategy, forward.source_epoch)

    def _sum_pieces(self, payload: torch.Tensor, count: int, width: int, codec: Codec) -> torch.Tensor:
        """The owner's sum of the other ranks' decoded pieces (its own slot of the gather is empty)."""
        pieces = payload.view(self.col_comm.size, count, -1)
        total = torch.zeros(count, width, dtype=self.dtype, device=self.device)
        for rank in range(self.col_comm.size):
            if rank != self.col_comm.rank:
                total += codec.decode(pieces[rank], width, self.dtype)
        return total

    def _gradient_parts(self, parts: list[Part], strategy: ExchangeStrategy) -> list[Part]:
        """Empty messages and skipped gradients (a cached strategy's ``skip_backward``) post nothing."""
        return [part for part in parts if part.message.count > 0 and strategy.sends_gradient(part.message)]

    def _messages_of(self, strategy: ExchangeStrategy, epoch: int) -> list[Part]:
        return [Part(j, strategy.fresh_message(self, epoch, j)) for j in self.owners]

    def _gradient_piece(self, part: Part, dt: torch.Tensor) -> torch.Tensor:
        message, j = part.message, part.owner
        if message.block is None:
            return torch.zeros(message.count, dt.shape[1], dtype=self.dtype, device=self.device)
        if message.block is self.remote_blocks.get(j):
            return self._product(self._transpose_of(j, message.block), dt)
        return self._product(self.csr(sp.csr_matrix(message.block.T)), dt)

    def _add_gradient(self, out: _Output, part: Part, rows: torch.Tensor | None) -> None:
        if rows is None:
            return
        owner_rows = part.message.owner_rows
        if owner_rows is None:
            out.tensor().add_(rows)
        else:
            out.tensor().index_add_(0, owner_rows, rows)


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
        strategy = self._strategy_for(context)
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

    def _exact_parts(self) -> list[Part]:
        return [Part(-1, self.exact_pairs)]

    def post_rows(self, h: torch.Tensor, phase: str, context: ExchangeContext | None,
                  strategy: ExchangeStrategy) -> Flight:
        pairs = self._pairs(context)
        codec = self._codec_for(context)
        epoch, layer = (context.epoch, context.layer) if context is not None else (-1, -1)
        part = Part(-1, pairs)

        def start() -> tuple[Pending | None, torch.Tensor | None]:
            if not pairs.traffic:
                return None, None
            recv = self._receive_buffer(part, sum(pairs.recv_rows), h.shape[1], codec)
            send = self._coded(h.index_select(0, pairs.send_index), codec, (layer, "rows", -1),
                               sum(self.exact_pairs.send_rows), pairs.send_positions, (epoch, layer, 0, self.group))
            return self.col_comm.ialltoallv(send, pairs.send_rows, recv, pairs.recv_rows, phase=phase), recv

        part.start = start
        return self._flight(context, [part], strategy)

    def _multiply_part(self, out: _Output, part: Part, rows: torch.Tensor | None,
                       context: ExchangeContext | None) -> None:
        if rows is not None:
            pairs = part.message
            self._multiply_into(out, pairs.remote_block, self._received_input(rows, pairs.recv_global, context))

    def post_gradients(self, forward: Flight, piece_of: Callable[[Part], torch.Tensor], width: int, phase: str,
                       context: ExchangeContext | None, strategy: ExchangeStrategy) -> Flight:
        (used,) = forward.parts
        pairs = used.message
        codec = self._codec_for(context)
        epoch, layer = (context.epoch, context.layer) if context is not None else (-1, -1)
        part = Part(-1, pairs)

        def start() -> tuple[Pending | None, torch.Tensor | None]:
            if not pairs.traffic:
                return None, None
            back = self._receive_buffer(part, sum(pairs.send_rows), width, codec)
            pieces = self._coded(piece_of(used), codec, (layer, "gradients", -1),
                                 sum(self.exact_pairs.recv_rows), pairs.recv_positions, (epoch, layer, 1, self.group))
            return self.col_comm.ialltoallv(pieces, pairs.recv_rows, back, pairs.send_rows, phase=phase), back

        part.start = start
        return self._flight(context, [part], strategy, forward.source_epoch)

    def _messages_of(self, strategy: ExchangeStrategy, epoch: int) -> list[Part]:
        return [Part(-1, self._sample(strategy, epoch) if strategy.samples else self.exact_pairs)]

    def _part_block(self, part: Part) -> sp.csr_matrix | None:
        return part.message.remote_matrix if part.message.traffic else None

    def _part_global_rows(self, part: Part) -> np.ndarray | range | None:
        return part.message.recv_global

    def _part_rows(self, part: Part) -> int:
        return sum(part.message.recv_rows)

    def _gradient_piece(self, part: Part, dt: torch.Tensor) -> torch.Tensor:
        pairs = part.message
        if pairs.transposed is None:
            pairs.transposed = self.csr(sp.csr_matrix(pairs.remote_matrix.T))
        return self._product(pairs.transposed, dt)

    def _add_gradient(self, out: _Output, part: Part, rows: torch.Tensor | None) -> None:
        if rows is not None:
            out.tensor().index_add_(0, part.message.send_index, rows)

    def transpose_bytes(self) -> int:
        pairs = [p.transposed for p in (self.exact_pairs, self._sampled) if p is not None and p.transposed is not None]
        return super().transpose_bytes() + sum(csr_bytes(t) for t in pairs)


PLANS: dict[str, type[ExchangePlan]] = {cls.name: cls for cls in (DenseBroadcastPlan, SparseBroadcastPlan,
                                                                  PointToPointPlan)}
PLAN_NAMES: tuple[str, ...] = tuple(PLANS)


def plan_class(name: str) -> type[ExchangePlan]:
    """The exchange plan class called ``name`` (one of :data:`PLAN_NAMES`)."""
    try:
        return PLANS[name]
    except KeyError:
        raise ValueError(f"unknown exchange plan {name!r}; expected one of {PLAN_NAMES}") from None
