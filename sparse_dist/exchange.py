"""What an exchange carries (DESIGN section 4): the seam types, the strategy base and the policy protocols.

A plan (:mod:`sparse_dist.plans`) knows how bytes move (broadcasts, an
alltoallv). Its :class:`ExchangeStrategy` decides, for each training call,
what every owner's message carries:

* :class:`ExactStrategy` - every owner sends the plan's whole message.
* :class:`SampledStrategy` - a :class:`BoundarySampler` keeps some boundary
  rows per epoch; kept columns are scaled by ``1/p``. The answer is a pure
  function of ``(epoch, stream, global row id)``, so owner and receiver
  compute the same sample without talking (``stream`` is the receiver's
  group for receiver-side sampling, the owner's for owner-side sampling).
* :class:`~sparse_dist.cached.CachedStrategy` - a :class:`StalenessRule` marks owners ACTIVE
  (send; receivers refresh their cache) or STALE (skip; receivers reuse
  the cached block), around an exact or sampled strategy (SANCUS).
* :class:`~sparse_dist.pipelined.PipelinedStrategy` - flights consumed ``tau`` epochs after
  they were posted (PipeGCN).
* :class:`~sparse_dist.importance.ImportanceStrategy` - per-edge sampling (``psc``, ``dgs``).

Evaluation is always exact: a plan uses its strategy only while training
(``ExchangeContext.training``). A strategy declares what it needs from a
plan (``samples``, ``caches``); a plan declares what it can carry, and
refuses the rest in one sentence (:meth:`sparse_dist.plans.ExchangePlan.refusal`).
The seam types a plan and its strategy share (:class:`Message`, :class:`Transfer`,
:class:`Flight`, :class:`BroadcastView`, :class:`ExchangeContext`) live here, below both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Protocol

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.csr import keep_columns

if TYPE_CHECKING:  # annotations only: the byte model (sparse_dist.predict) loads without MPI
    from sparse_dist.comm import Communicator, Pending


class RowMasks(Protocol):
    """Dropout keep masks of one layer's input, decided per GLOBAL row, so any rank can make any row's.

    Receiver-side dropout: an exchange carries pre-dropout rows and every rank masks what it
    multiplies (its own rows and the rows it received) itself. The inverted-dropout scale is not
    applied here (the layers fold it into their weights).
    """

    def own(self, like: torch.Tensor) -> torch.Tensor:
        """Boolean keep mask of this rank's own rows, shaped like ``like`` (``n_g x F``)."""

    def of_rows(self, global_rows: np.ndarray | range, like: torch.Tensor) -> torch.Tensor:
        """Boolean keep mask of ``global_rows`` (``len(global_rows) x like.shape[1]``), on ``like``'s device."""


@dataclass(frozen=True)
class ExchangeContext:
    """Where an SpMM call sits in training, and what its input rows are.

    ``halo_rows``: the layer input holds, after this rank's own rows, this many halo rows (a static
    input's boundary rows kept by the receiver, :mod:`sparse_dist.halo`); its SpMM is then local.
    ``dropout``: the input is pre-dropout and the SpMM applies these masks to every row it
    multiplies (receiver-side dropout); None when the input arrives already masked (or in evaluation).
    ``bypass_policy``: a training-time forward that exchanges exactly whatever the policy (the audit's forward);
    the policy's state is not touched. ``unmasked``: under owner-side dropout, makes (on demand) what
    the exchanged rows would be without this epoch's dropout masks (``H W`` where ``dropout(H) W``
    travels, ``H`` where ``dropout(H)`` does); a staleness rule that compares values (``sancus-h``)
    compares these, which this layer's fresh masks do not move, where the masked rows never stay still.
    """

    epoch: int
    layer: int
    training: bool
    halo_rows: int = 0
    dropout: RowMasks | None = None
    bypass_policy: bool = False
    unmasked: Callable[[], torch.Tensor] | None = None

    def self_rows(self, h: torch.Tensor) -> torch.Tensor:
        """This rank's own rows of the layer input ``h`` as a self term uses them: halo rows cut off,
        receiver-side masks applied (autograd-aware)."""
        own = h if self.halo_rows == 0 else h[: h.shape[0] - self.halo_rows]
        return own if self.dropout is None else own * self.dropout.own(own)


@dataclass
class StalenessView:
    """What a staleness rule may look at, for one layer, on one rank.

    ``versions[j]``: epoch of owner ``j``'s last broadcast in this layer (-1: never),
    the same on every rank. ``cached_versions[j]``: version of this rank's
    cached block from ``j`` (-1: none cached). ``own_gap``: relative change
    ``||X - X_cached|| / ||X_cached||`` (Frobenius) of the rows this rank would
    broadcast as an owner, or None if it owns no broadcast in this column.
    """

    epoch: int
    layer: int
    owner: int
    owners: list[int]
    versions: np.ndarray
    cached_versions: np.ndarray
    own_gap: float | None


class BoundarySampler(Protocol):
    name: str
    p: float
    side: str  # "receiver" or "owner"

    def keep(self, epoch: int, stream: int, global_rows: np.ndarray) -> np.ndarray:
        """Boolean mask over ``global_rows``: kept in this epoch's sample."""


class StalenessRule(Protocol):
    name: str
    needs_gap: bool
    skip_backward: bool
    pipelined: bool  # True: a PipelinedStrategy rule (tau, gamma); False: a CachedStrategy rule (decide)
    overlaps: bool   # its flights travel while layers compute (a pipelined rule from tau = 1 on)

    def decide(self, view: StalenessView, comm: Communicator) -> np.ndarray:
        """Boolean ACTIVE mask over all ``G`` owners (collective over ``comm``)."""


@dataclass
class Message:
    """One owner's part of one layer's forward on this rank; the layer's transpose mirrors it exactly.

    ``count`` rows travel (the same on every rank of the column). On a receiver ``block`` is
    ``A_gj`` with columns numbered as message rows (already scaled), ``block_torch`` its CSR, and
    ``global_rows`` the message rows' global ids (known where receivers mask rows themselves); on
    the owner ``owner_rows`` are its local row ids in the message (None: all rows). A STALE
    message moves nothing: ``values`` are the receiver's cached (pre-dropout, under receiver-side
    dropout) rows.
    """

    count: int
    fresh: bool = True
    block: sp.csr_matrix | None = None
    block_torch: torch.Tensor | None = None
    owner_rows: torch.Tensor | None = None
    values: torch.Tensor | None = None
    global_rows: np.ndarray | range | None = None
    positions: np.ndarray | None = None  # a sampled message's rows as rows of the exact message (None: all)


@dataclass
class Transfer:
    """One message of a posted exchange (a :class:`Flight`).

    ``owner``: the row group whose rows travel (-1: every owner's rows in one alltoallv). ``message``:
    what the plan sends (a :class:`Message` for the broadcast plans, the pairs of an alltoallv for
    ``p2p``). ``start`` posts it and returns its request and its buffer: forward, the receive buffer
    (the owner's send rows on the owner, a STALE message's cached rows); backward, the owner's summed
    gradient of its message rows (None on the other ranks, whose pieces only leave). ``rows`` is that
    buffer, complete once :meth:`wait` returned.
    """

    owner: int
    message: Any
    start: Callable[[], tuple[Pending | None, torch.Tensor | None]] | None = None
    rows: torch.Tensor | None = None
    pending: Pending | None = None
    decode: Callable[[torch.Tensor], torch.Tensor] | None = None  # a compressed buffer's rows, once complete

    def post(self) -> None:
        if self.start is not None:
            self.pending, self.rows = self.start()
            self.start = None  # drop the closure (and the tensors it holds)

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.wait()
        if self.decode is not None and self.rows is not None:
            self.rows, self.decode = self.decode(self.rows), None

    def test(self) -> bool:
        """Drive the exchange on (never blocks); True once it has completed."""
        return self.pending is None or self.pending.test()


class Flight:
    """One layer's exchange of one epoch: its parts, posted in order, completed when consumed.

    ``ahead``: how many parts are posted beyond the one being consumed (1: prefetch depth 1, so at
    most two receive buffers exist at once); None posts every part at once (a pipelined strategy
    keeps the flight and consumes it epochs later). Posting starts with the construction (the first
    part, or all), unless ``held``: a held flight posts nothing until it is told, by :meth:`release` or its
    first consumption. Collective: every rank of the replica column posts the same parts in the same order,
    so several flights may be outstanding on one communicator.
    """

    def __init__(self, epoch: int, layer: int, parts: list[Transfer], ahead: int | None = 1,
                 source_epoch: int | None = None, held: bool = False) -> None:
        """``source_epoch``: the epoch of the forward messages the parts carry (a backward flight reverses a
        forward flight, which a pipelined strategy took from an earlier epoch); ``epoch`` by default."""
        self.epoch, self.layer, self.parts, self.ahead = epoch, layer, parts, ahead
        self.source_epoch = epoch if source_epoch is None else source_epoch
        self._posted = 0
        if not held:
            self._post_until(len(parts) if ahead is None else 1)

    def release(self) -> None:
        """Post every part not posted yet (a held flight; collective, like posting)."""
        self._post_until(len(self.parts))

    def _post_until(self, count: int) -> None:
        while self._posted < min(count, len(self.parts)):
            self.parts[self._posted].post()
            self._posted += 1

    def arrivals(self) -> Iterator[Transfer]:
        """Each part in order once it has arrived (posting the next ``ahead`` first)."""
        for k, part in enumerate(self.parts):
            self._post_until(len(self.parts) if self.ahead is None else k + 1 + self.ahead)
            part.wait()
            yield part

    def progress(self) -> bool:
        """Test every posted part (drives MPI's progress; never blocks); True when all have completed."""
        return all([part.test() for part in self.parts[: self._posted]]) and self._posted == len(self.parts)

    def complete(self) -> None:
        """Post what is left and wait for every part (collective, like posting)."""
        self._post_until(len(self.parts))
        for part in self.parts:
            part.wait()

    def forget_rows(self) -> None:
        """Drop the parts' buffers once their rows were multiplied: a transpose reverses a flight from its
        messages alone, and a receive buffer kept to the backward pass is a halo's worth of rows (a third of a
        rank's peak on a power-law graph at P = 4). Local; call it on a consumed (complete) flight only."""
        for part in self.parts:
            part.rows = None


class BroadcastView(Protocol):
    """What a strategy may ask a broadcast plan (see :class:`sparse_dist.broadcast_plans._BroadcastPlan`)."""

    group: int
    groups: int
    owners: list[int]
    col_comm: Any
    device: torch.device

    def exact_message(self, owner: int) -> Message: ...
    def sampled_message(self, owner: int, kept: np.ndarray, scale: float) -> Message: ...
    def boundary_rows(self, owner: int) -> np.ndarray: ...
    def broadcastable(self, h: torch.Tensor) -> torch.Tensor: ...
    def csr(self, matrix: sp.csr_matrix) -> torch.Tensor: ...


class ExchangeStrategy:
    """Exact exchange: every owner sends the plan's whole message. The base of the other strategies.

    Per training call it is asked, in this order (by the plan that posts, and by the
    :class:`~sparse_dist.partial.PartialSpMM` that drives the flights): forward: :meth:`forward_messages`
    (broadcast plans), :meth:`rows_to_use` with the flight just posted, :meth:`on_rows` per arrived part,
    :meth:`finish_forward`; transpose: :meth:`used`, :meth:`gradients_to_use` with the flight of
    gradients just posted, :meth:`on_gradients` per arrived part. A pipelined strategy answers
    :meth:`rows_to_use` and :meth:`gradients_to_use` with a flight of an earlier epoch.
    """

    samples: ClassVar[bool] = False  # needs a plan that can send a sampled subset of rows
    caches: ClassVar[bool] = False   # needs a plan whose receivers all get the same block (broadcasts)
    per_receiver: ClassVar[bool] = False  # needs a plan that sends each receiver its own subset (p2p)
    posts_ahead: ClassVar[int | None] = 1  # parts posted beyond the one consumed (None: all at once)
    tests_progress: bool = True  # progress() tests kept flights (False: the MPI library or a thread drives them)
    skip_backward: bool = False

    def __init__(self) -> None:
        self._used: dict[int, dict[int, Message]] = {}
        self.plan: Any = None

    def bind(self, plan: Any) -> None:
        """Called once by the plan that holds this strategy (a strategy serves one plan)."""
        self.plan = plan

    # ----------------------------------------------------------- sampling
    def keep(self, epoch: int, stream: int, global_rows: np.ndarray) -> np.ndarray | None:
        """Which of ``global_rows`` travel in ``epoch`` (None: all of them, unscaled)."""
        return None

    @property
    def scale(self) -> float:
        """Factor of kept columns (``1/p``)."""
        return 1.0

    def prepare(self, epoch: int) -> None:
        """Called by the plan before it samples ``epoch`` (on every rank of the column, the same epochs in the
        same order, so a strategy may agree on something here, collectively)."""

    def sampled_block(self, epoch: int, block: sp.csr_matrix, kept_columns: np.ndarray) -> sp.csr_matrix:
        """``block`` (rows of ``A`` over the exact receive buffer's rows) restricted to the kept columns,
        renumbered, kept entries scaled: here every kept column's entries by ``1/p``."""
        return keep_columns(block, kept_columns, self.scale)

    def local_blocks(self, context: ExchangeContext) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(A_gg, A_gg^T)`` sampled for this call where inner entries are sampled too; None: the plan's own."""
        return None

    def saw_own_rows(self, context: ExchangeContext, h: torch.Tensor) -> None:
        """Hook: a training call multiplies this rank's own rows ``h`` (``n_g x F``)."""

    @property
    def side(self) -> str:
        """Whose group is the sampling stream of a pair: ``"receiver"`` or ``"owner"``."""
        return "owner"

    # ------------------------------------------------- broadcast messages
    def fresh_message(self, plan: BroadcastView, epoch: int, owner: int) -> Message:
        """What ``owner`` sends when it sends."""
        return plan.exact_message(owner)

    def forward_messages(self, plan: BroadcastView, context: ExchangeContext, h: torch.Tensor) -> dict[int, Message]:
        """Every exchanged owner's message of this forward (collective where a rule must agree)."""
        return {j: self.fresh_message(plan, context.epoch, j) for j in plan.owners}

    # -------------------------------------------------- flights, all plans
    def rows_to_use(self, context: ExchangeContext, flight: Flight) -> Flight:
        """The flight whose rows this forward multiplies, given the one it just posted (here: that one)."""
        return flight

    def on_rows(self, context: ExchangeContext, part: Transfer) -> torch.Tensor | None:
        """The rows of an arrived ``part`` as this forward multiplies them (a hook: caches keep them)."""
        return part.rows

    def finish_forward(self, context: ExchangeContext, flight: Flight) -> None:
        """Remember the flight this layer's forward used, for its transpose, without the rows it brought (the
        transpose needs its messages only) unless this strategy uses the flight again (:meth:`keeps`)."""
        if not self.keeps(flight):
            flight.forget_rows()
        self._used[context.layer] = flight

    def keeps(self, flight: Flight) -> bool:
        """Whether ``flight``'s rows are used again by a later call (a pipelined strategy's kept flights)."""
        return False

    def used(self, context: ExchangeContext) -> Flight:
        return self._used[context.layer]

    def gradients_to_use(self, context: ExchangeContext, flight: Flight) -> Flight:
        """The flight of gradients this transpose adds, given the one it just posted (here: that one)."""
        return flight

    def on_gradients(self, context: ExchangeContext, part: Transfer) -> torch.Tensor | None:
        """The owner's summed gradient of an arrived ``part`` as this transpose adds it."""
        return part.rows

    holds_gradients: ClassVar[bool] = False  # a training call's gradient flight is held until release_held

    def release_held(self) -> None:
        """Post the held gradient flights (none here). Collective over the plan's column."""

    def progress(self) -> None:
        """Drive outstanding exchanges kept across calls (none here); local, never blocks."""

    def outstanding(self) -> int:
        """Flights kept for later calls (none here)."""
        return 0

    def complete_outstanding(self) -> None:
        """Complete every flight kept for later calls (none here). Collective over the plan's column: call it
        at the same point on every rank, e.g. when a run ends, so no receive is still pending when its buffers
        are freed or MPI is finalised."""

    @property
    def sampling(self) -> "ExchangeStrategy":
        """The strategy that decides which rows travel: this one; a staleness wrapper answers with the one it
        wraps (what ``psc``'s feature cache and ``dgs``' explainer read)."""
        return self

    def sends_gradient(self, message: Message) -> bool:
        """Whether the gradient of ``message``'s rows goes back to its owner."""
        return True

    # -------------------------------------------------------------- state
    @property
    def keeps_state(self) -> bool:
        """Whether it keeps per-rank state across epochs that a checkpoint must save (the same on every rank)."""
        return False

    def decisions(self, epoch: int) -> list[dict[str, Any]]:
        """Which owners sent, per layer, in ``epoch`` (empty where every owner always sends)."""
        return []

    def cache_bytes(self) -> int:
        """Bytes of historical blocks held on this rank."""
        return 0

    def state_dict(self) -> dict[str, Any]:
        """Per-rank state to checkpoint (empty for stateless strategies)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"the {type(self).__name__} keeps no state, but the checkpoint has some")


class ExactStrategy(ExchangeStrategy):
    """Every owner sends everything its plan sends."""


class SampledStrategy(ExchangeStrategy):
    """BNS-GCN boundary sampling: the sampler's kept rows travel, their columns scaled by ``1/p``."""

    samples = True

    def __init__(self, sampler: BoundarySampler) -> None:
        super().__init__()
        self.sampler = sampler
        self._epoch: int | None = None
        self._kept: dict[int, np.ndarray] = {}

    def keep(self, epoch: int, stream: int, global_rows: np.ndarray) -> np.ndarray:
        return np.asarray(self.sampler.keep(epoch, stream, global_rows), dtype=bool)

    @property
    def scale(self) -> float:
        return 1.0 / self.sampler.p if self.sampler.p > 0 else 0.0  # p = 0 keeps none: never used

    @property
    def side(self) -> str:
        return self.sampler.side

    def fresh_message(self, plan: BroadcastView, epoch: int, owner: int) -> Message:
        """Owner-side sample of ``B_owner`` (stream = owner), the same on every rank of the column."""
        if self._epoch != epoch:
            self._epoch, self._kept = epoch, {}
        if owner not in self._kept:
            self._kept[owner] = self.keep(epoch, owner, plan.boundary_rows(owner))
        return plan.sampled_message(owner, self._kept[owner], self.scale)
