"""What an exchange carries (DESIGN section 4): the strategy object a plan holds, and the policy protocols.

A plan (:mod:`sparse_dist.plans`) knows how bytes move (broadcasts, an
alltoallv). Its :class:`ExchangeStrategy` decides, for each training call,
what every owner's message carries:

* :class:`ExactStrategy` - every owner sends the plan's whole message.
* :class:`SampledStrategy` - a :class:`BoundarySampler` keeps some boundary
  rows per epoch; kept columns are scaled by ``1/p``. The answer is a pure
  function of ``(epoch, stream, global row id)``, so owner and receiver
  compute the same sample without talking (``stream`` is the receiver's
  group for receiver-side sampling, the owner's for owner-side sampling).
* :class:`CachedStrategy` - a :class:`StalenessRule` marks owners ACTIVE
  (send; receivers refresh their cache) or STALE (skip; receivers reuse
  the cached block), around an exact or sampled strategy. Its state
  (versions, cached blocks, the decisions log, checkpoints) lives in a
  :class:`HistoryCache`.

Evaluation is always exact: a plan uses its strategy only while training
(``ExchangeContext.training``). A strategy declares what it needs from a
plan (``samples``, ``caches``); a plan declares what it can carry, and
refuses the rest in one sentence (:meth:`sparse_dist.plans.ExchangePlan.refusal`).
Later strategies (pipelined, compressed) plug in through the same methods.
"""

from __future__ import annotations

from collections import deque
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
    ``exact``: a training-time forward that exchanges exactly whatever the policy (the audit's forward);
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
    exact: bool = False
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
class Part:
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
    part, or all). Collective: every rank of the replica column posts the same parts in the same
    order, so several flights may be outstanding on one communicator.
    """

    def __init__(self, epoch: int, layer: int, parts: list[Part], ahead: int | None = 1,
                 source_epoch: int | None = None) -> None:
        """``source_epoch``: the epoch of the forward messages the parts carry (a backward flight reverses a
        forward flight, which a pipelined strategy took from an earlier epoch); ``epoch`` by default."""
        self.epoch, self.layer, self.parts, self.ahead = epoch, layer, parts, ahead
        self.source_epoch = epoch if source_epoch is None else source_epoch
        self._posted = 0
        self._post_until(len(parts) if ahead is None else 1)

    def _post_until(self, count: int) -> None:
        while self._posted < min(count, len(self.parts)):
            self.parts[self._posted].post()
            self._posted += 1

    def arrivals(self) -> Iterator[Part]:
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


class BroadcastView(Protocol):
    """What a strategy may ask a broadcast plan (see :class:`sparse_dist.plans._BroadcastPlan`)."""

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

    Per training call the plan asks it, in this order: forward: :meth:`forward_messages` (broadcast
    plans), :meth:`rows_to_use` with the flight it posted, :meth:`on_rows` per arrived part,
    :meth:`finish_forward`; transpose: :meth:`used`, :meth:`gradients_to_use` with the flight of
    gradients it posted, :meth:`on_gradients` per arrived part. A pipelined strategy answers
    :meth:`rows_to_use` and :meth:`gradients_to_use` with a flight of an earlier epoch.
    """

    samples: ClassVar[bool] = False  # needs a plan that can send a sampled subset of rows
    caches: ClassVar[bool] = False   # needs a plan whose receivers all get the same block (broadcasts)
    per_receiver: ClassVar[bool] = False  # needs a plan that sends each receiver its own subset (p2p)
    posts_ahead: ClassVar[int | None] = 1  # parts posted beyond the one consumed (None: all at once)
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

    def on_rows(self, context: ExchangeContext, part: Part) -> torch.Tensor | None:
        """The rows of an arrived ``part`` as this forward multiplies them (a hook: caches keep them)."""
        return part.rows

    def finish_forward(self, context: ExchangeContext, flight: Flight) -> None:
        """Remember the flight this layer's forward used, for its transpose."""
        self._used[context.layer] = flight

    def used(self, context: ExchangeContext) -> Flight:
        return self._used[context.layer]

    def gradients_to_use(self, context: ExchangeContext, flight: Flight) -> Flight:
        """The flight of gradients this transpose adds, given the one it just posted (here: that one)."""
        return flight

    def on_gradients(self, context: ExchangeContext, part: Part) -> torch.Tensor | None:
        """The owner's summed gradient of an arrived ``part`` as this transpose adds it."""
        return part.rows

    def progress(self) -> None:
        """Drive outstanding exchanges kept across calls (none here); local, never blocks."""

    def outstanding(self) -> int:
        """Flights kept for later calls (none here)."""
        return 0

    def complete_outstanding(self) -> None:
        """Complete every flight kept for later calls (none here). Collective over the plan's column: call it
        at the same point on every rank, e.g. when a run ends, so no receive is still pending when its buffers
        are freed or MPI is finalised."""

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


@dataclass
class CachedBlock:
    """A receiver's historical block from one owner in one layer (never aliased to a receive buffer)."""

    block: sp.csr_matrix
    block_torch: torch.Tensor
    values: torch.Tensor
    version: int
    global_rows: np.ndarray | range | None = None


def _rows_state(rows: np.ndarray | range | None) -> Any:
    """Global row ids as checkpoint data: a tensor, a ``[start, stop]`` list for a range, or None."""
    if rows is None or isinstance(rows, range):
        return None if rows is None else [rows.start, rows.stop]
    return torch.from_numpy(np.array(rows, dtype=np.int64, copy=True))


def _rows_from_state(state: Any) -> np.ndarray | range | None:
    if state is None or isinstance(state, torch.Tensor):
        return None if state is None else state.numpy().copy()
    return range(int(state[0]), int(state[1]))


class HistoryCache:
    """SANCUS state on one rank: versions, cached blocks, what it last sent, and the decisions log.

    ``versions[layer][j]``: epoch of owner ``j``'s last broadcast (-1: never), the same on every
    rank. The decisions log keeps the latest ``log_limit`` layer decisions (bounded; read through
    :meth:`decisions`).
    """

    def __init__(self, log_limit: int = 64) -> None:
        self.versions: dict[int, np.ndarray] = {}
        self.message_counts: dict[tuple[int, int], int] = {}
        self.blocks: dict[tuple[int, int], CachedBlock] = {}
        self.sent_rows: dict[int, torch.Tensor | None] = {}
        self.sent_reference: dict[int, torch.Tensor] = {}
        self._log: deque[dict[str, Any]] = deque(maxlen=log_limit)

    def versions_of(self, layer: int, groups: int) -> np.ndarray:
        return self.versions.setdefault(layer, np.full(groups, -1, dtype=np.int64))

    def cached_versions(self, layer: int, owners: list[int], groups: int) -> np.ndarray:
        cached = np.full(groups, -1, dtype=np.int64)
        for j in owners:
            entry = self.blocks.get((layer, j))
            if entry is not None:
                cached[j] = entry.version
        return cached

    def gap(self, layer: int, current: torch.Tensor) -> float:
        """Relative Frobenius change ``||H_j - H~_j||_F / ||H~_j||_F`` of this owner's compared rows (the
        exchanged rows, unmasked under owner-side dropout) since its last broadcast (inf: never sent)."""
        reference = self.sent_reference.get(layer)
        if reference is None:
            return float("inf")
        return float(torch.linalg.norm(current - reference) / max(float(torch.linalg.norm(reference)), 1e-30))

    def stale_message(self, layer: int, owner: int, is_owner: bool) -> Message:
        entry = self.blocks.get((layer, owner))
        return Message(self.message_counts[(layer, owner)], False,
                       entry.block if entry else None, entry.block_torch if entry else None,
                       self.sent_rows.get(layer) if is_owner else None, entry.values if entry else None,
                       entry.global_rows if entry else None)

    def sent(self, layer: int, owner: int, epoch: int, count: int) -> None:
        self.versions[layer][owner] = epoch
        self.message_counts[(layer, owner)] = count

    def store(self, layer: int, owner: int, message: Message, values: torch.Tensor, epoch: int) -> None:
        """Keep a fresh block (``values`` is a fresh receive buffer, so it never aliases a later one)."""
        assert message.block is not None and message.block_torch is not None
        self.blocks[(layer, owner)] = CachedBlock(message.block, message.block_torch, values.detach(), epoch,
                                                  message.global_rows)

    def log(self, epoch: int, layer: int, owners: list[int], active: np.ndarray) -> None:
        self._log.append({"epoch": epoch, "layer": layer, "owners": len(owners),
                          "active": [int(j) for j in owners if active[j]]})

    def decisions(self, epoch: int) -> list[dict[str, Any]]:
        return [{k: v for k, v in d.items() if k != "epoch"} for d in self._log if d["epoch"] == epoch]

    def nbytes(self) -> int:
        total = sum(e.values.numel() * e.values.element_size() + e.block.data.nbytes + e.block.indices.nbytes
                    + e.block.indptr.nbytes for e in self.blocks.values())
        return int(total + sum(r.numel() * r.element_size() for r in self.sent_reference.values()))

    def state_dict(self) -> dict[str, Any]:
        def tensor(array: np.ndarray) -> torch.Tensor:  # checkpoints hold tensors, never pickled arrays
            return torch.from_numpy(np.array(array, copy=True))

        return {
            "versions": {layer: tensor(v) for layer, v in self.versions.items()},
            "message_counts": dict(self.message_counts),
            "cache": {key: {"indptr": tensor(e.block.indptr), "indices": tensor(e.block.indices),
                            "data": tensor(e.block.data), "shape": list(e.block.shape), "values": e.values.cpu(),
                            "version": e.version, "global_rows": _rows_state(e.global_rows)}
                      for key, e in self.blocks.items()},
            "sent_rows": {layer: None if rows is None else rows.cpu() for layer, rows in self.sent_rows.items()},
            "sent_reference": {layer: ref.cpu() for layer, ref in self.sent_reference.items()},
        }

    def load_state_dict(self, state: dict[str, Any], plan: BroadcastView) -> None:
        device = plan.device
        self.versions = {int(k): v.numpy().copy() for k, v in state["versions"].items()}
        self.message_counts = {tuple(k): int(v) for k, v in state["message_counts"].items()}
        self.blocks = {}
        for key, e in state["cache"].items():
            block = sp.csr_matrix((e["data"].numpy(), e["indices"].numpy(), e["indptr"].numpy()),
                                  shape=tuple(e["shape"]))
            self.blocks[tuple(key)] = CachedBlock(block, plan.csr(block), e["values"].to(device), int(e["version"]),
                                                  _rows_from_state(e.get("global_rows")))
        self.sent_rows = {int(k): None if v is None else v.to(device) for k, v in state["sent_rows"].items()}
        self.sent_reference = {int(k): v.to(device) for k, v in state["sent_reference"].items()}


class CachedStrategy(ExchangeStrategy):
    """SANCUS skip-broadcast around an exact or sampled strategy: STALE owners send nothing.

    Collective: :meth:`forward_messages` may allgather one flag vector per layer (rules a and h);
    every rank of the replica column calls it for every layer, in the same order.
    """

    caches = True

    def __init__(self, rule: StalenessRule, inner: ExchangeStrategy) -> None:
        super().__init__()
        self.rule = rule
        self.inner = inner
        self.samples = inner.samples  # type: ignore[misc]
        self.skip_backward = bool(rule.skip_backward)
        self.history = HistoryCache()

    def keep(self, epoch: int, stream: int, global_rows: np.ndarray) -> np.ndarray | None:
        return self.inner.keep(epoch, stream, global_rows)

    @property
    def scale(self) -> float:
        return self.inner.scale

    @staticmethod
    def _compared_rows(plan: BroadcastView, context: ExchangeContext, h: torch.Tensor) -> torch.Tensor:
        """The owner's rows the variation gap compares: the exchanged rows ``h``, or, under owner-side dropout,
        their unmasked values (``context.unmasked``), which this layer's fresh masks do not move (still only
        where the weights and earlier layers' masks are: those reach a layer's input through the aggregation)."""
        with torch.no_grad():
            source = context.unmasked() if context.unmasked is not None else h
            return plan.broadcastable(source.detach())

    def _active(self, plan: BroadcastView, context: ExchangeContext,
                h: torch.Tensor) -> tuple[np.ndarray, torch.Tensor | None]:
        """ACTIVE owners of this layer, and the rows the gap compared (None where no gap was taken)."""
        history, owners = self.history, plan.owners
        versions = history.versions_of(context.layer, plan.groups)
        gap, compared = None, None
        if self.rule.needs_gap and plan.group in owners:
            compared = self._compared_rows(plan, context, h)
            gap = history.gap(context.layer, compared)
        view = StalenessView(context.epoch, context.layer, plan.group, owners, versions.copy(),
                             history.cached_versions(context.layer, owners, plan.groups), gap)
        active = np.asarray(self.rule.decide(view, plan.col_comm), dtype=bool).copy()
        return active | (versions < 0), compared  # nothing cached yet: the owner must send

    def forward_messages(self, plan: BroadcastView, context: ExchangeContext, h: torch.Tensor) -> dict[int, Message]:
        layer, epoch, history = context.layer, context.epoch, self.history
        active, compared = self._active(plan, context, h)
        messages: dict[int, Message] = {}
        for j in plan.owners:
            if active[j]:
                messages[j] = self.inner.fresh_message(plan, epoch, j)
                history.sent(layer, j, epoch, messages[j].count)
            else:
                messages[j] = history.stale_message(layer, j, is_owner=j == plan.group)
        own = messages.get(plan.group)
        if own is not None and own.fresh:
            history.sent_rows[layer] = own.owner_rows
            if self.rule.needs_gap:
                rows = compared if compared is not None else self._compared_rows(plan, context, h)
                history.sent_reference[layer] = rows.clone()
        history.log(epoch, layer, plan.owners, active)
        return messages

    def on_rows(self, context: ExchangeContext, part: Part) -> torch.Tensor | None:
        message = part.message
        if part.owner != self.plan.group and message.fresh and message.block is not None:
            self.history.store(context.layer, part.owner, message, part.rows, context.epoch)
        return part.rows

    def sends_gradient(self, message: Message) -> bool:
        return message.fresh or not self.skip_backward

    keeps_state = True  # type: ignore[assignment]

    def decisions(self, epoch: int) -> list[dict[str, Any]]:
        return self.history.decisions(epoch)

    def cache_bytes(self) -> int:
        return self.history.nbytes()

    def state_dict(self) -> dict[str, Any]:
        return self.history.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history.load_state_dict(state, self.plan)


class _Average:
    """Exponential moving average of one message's rows (one layer, one owner): ``s <- g s + (1 - g) m``,
    started with the first message."""

    def __init__(self, gamma: float) -> None:
        self.gamma = gamma
        self.values: torch.Tensor | None = None

    def update(self, rows: torch.Tensor) -> torch.Tensor:
        if self.values is None or self.values.shape != rows.shape:
            self.values = rows.detach().clone()
        else:
            self.values.mul_(self.gamma).add_(rows.detach(), alpha=1.0 - self.gamma)
        return self.values


class PipelinedStrategy(ExchangeStrategy):
    """Pipelined stale exchange (PipeGCN, PSC-GCN) around an exact or sampled strategy.

    Every training call posts its whole exchange at once (all parts, ``posts_ahead = None``) as soon as its
    rows exist, and consumes the flight it posted ``tau`` epochs earlier: forward, receivers multiply the
    rows owners sent in epoch ``t - tau`` (their own rows are current); backward, owners add the gradients
    receivers sent in epoch ``t - tau`` (computed against the rows those receivers used then). The first
    ``tau`` epochs are exact: they wait for their own flight, which is kept and used again ``tau`` epochs
    later. ``gamma > 0`` smooths what arrives, per layer and owner (:class:`_Average`), for rows and for
    gradients alike, from the first stale use on.

    Collective discipline: the flights are posted and waited at the same (epoch, layer, direction) on every
    rank, several stay outstanding per communicator, and :meth:`progress` only tests (local, never blocks).
    State across epochs: up to ``tau`` flights per layer and direction; a checkpoint completes them and keeps
    their received rows (:meth:`state_dict`).
    """

    posts_ahead = None
    tests_progress = True  # False: leave progress to the MPI library (or a progress thread)

    def __init__(self, rule: StalenessRule, inner: ExchangeStrategy) -> None:
        super().__init__()
        tau, gamma = int(getattr(rule, "tau")), float(getattr(rule, "gamma"))
        if gamma > 0 and inner.samples:
            raise ValueError(f"{rule.name}: gamma smooths each boundary row over consecutive messages; with a "
                             f"sampling policy rows arrive in some epochs only, so combine gamma=0 with sampling")
        self.rule, self.inner, self.tau, self.gamma = rule, inner, tau, gamma
        self.samples = inner.samples  # type: ignore[misc]
        self.per_receiver = inner.per_receiver  # type: ignore[misc]
        self._rows: dict[int, deque[Flight]] = {}
        self._gradients: dict[int, deque[Flight]] = {}
        self._row_average: dict[tuple[int, int], _Average] = {}
        self._gradient_average: dict[tuple[int, int], _Average] = {}

    def bind(self, plan: Any) -> None:
        super().bind(plan)
        self.inner.bind(plan)

    # the inner strategy decides what travels
    def keep(self, epoch: int, stream: int, global_rows: np.ndarray) -> np.ndarray | None:
        return self.inner.keep(epoch, stream, global_rows)

    @property
    def scale(self) -> float:
        return self.inner.scale

    @property
    def side(self) -> str:
        return self.inner.side

    def fresh_message(self, plan: BroadcastView, epoch: int, owner: int) -> Message:
        return self.inner.fresh_message(plan, epoch, owner)

    def prepare(self, epoch: int) -> None:
        self.inner.prepare(epoch)

    def sampled_block(self, epoch: int, block: sp.csr_matrix, kept_columns: np.ndarray) -> sp.csr_matrix:
        return self.inner.sampled_block(epoch, block, kept_columns)

    def local_blocks(self, context: ExchangeContext) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.inner.local_blocks(context)

    def saw_own_rows(self, context: ExchangeContext, h: torch.Tensor) -> None:
        self.inner.saw_own_rows(context, h)

    # the pipeline
    def _swap(self, queues: dict[int, deque[Flight]], context: ExchangeContext, flight: Flight) -> Flight:
        if self.tau == 0:
            return flight
        queue = queues.setdefault(context.layer, deque())
        queue.append(flight)
        if context.epoch < self.tau or queue[0].epoch > context.epoch - self.tau:
            return flight  # warm-up (the first tau epochs, or after a resume that dropped the flights): exact now
        used = queue.popleft()
        if used.epoch != context.epoch - self.tau:
            raise RuntimeError(f"pipe: layer {context.layer} in epoch {context.epoch} found the flight of epoch "
                               f"{used.epoch}, expected {context.epoch - self.tau} (a call was skipped)")
        return used

    def rows_to_use(self, context: ExchangeContext, flight: Flight) -> Flight:
        return self._swap(self._rows, context, flight)

    def gradients_to_use(self, context: ExchangeContext, flight: Flight) -> Flight:
        return self._swap(self._gradients, context, flight)

    def _smoothed(self, averages: dict[tuple[int, int], _Average], context: ExchangeContext,
                  part: Part) -> torch.Tensor | None:
        if self.gamma == 0 or context.epoch < self.tau or part.rows is None:
            return part.rows
        return averages.setdefault((context.layer, part.owner), _Average(self.gamma)).update(part.rows)

    def on_rows(self, context: ExchangeContext, part: Part) -> torch.Tensor | None:
        self.inner.on_rows(context, part)
        if part.owner == self.plan.group:
            return part.rows  # the owner's own broadcast: nothing arrives
        return self._smoothed(self._row_average, context, part)

    def on_gradients(self, context: ExchangeContext, part: Part) -> torch.Tensor | None:
        return self._smoothed(self._gradient_average, context, part)

    def kept_flights(self) -> list[tuple[bool, Flight]]:
        """Every flight kept for a later epoch with its direction (``backward``): rows, then gradients, layers in
        order, oldest first; the same order on every rank (the order of :meth:`state_dict`). Safe to call from a
        progress thread: the tables are copied before they are walked (the main thread adds a layer's queue on
        its first call)."""
        return [(backward, flight) for backward, queues in ((False, self._rows), (True, self._gradients))
                for _, queue in sorted(list(queues.items())) for flight in list(queue)]

    def progress(self) -> None:
        """Test every kept flight (``tests_progress``; each layer's forward and transpose call it on entry)."""
        if self.tests_progress:
            for _, flight in self.kept_flights():
                flight.progress()

    def outstanding(self) -> int:
        """Flights kept for later epochs (forward and backward, all layers)."""
        return len(self.kept_flights())

    def complete_outstanding(self) -> None:
        """Wait for every kept flight in :meth:`kept_flights`' order. They stay kept, completed, so training may
        go on afterwards unchanged."""
        for _, flight in self.kept_flights():
            flight.complete()

    # state
    @property
    def keeps_state(self) -> bool:
        return self.tau > 0 or self.inner.keeps_state

    def _received(self, flight: Flight, backward: bool) -> list[Part]:
        """The parts of a kept flight that hold what arrived (forward: not the owner's own send rows)."""
        return [part for part in flight.parts
                if part.rows is not None and (backward or part.owner != self.plan.group)]

    def cache_bytes(self) -> int:
        """Bytes of the flights kept for later epochs and of the averages (received rows and gradients)."""
        held = [part.rows for backward, flight in self.kept_flights() for part in self._received(flight, backward)]
        held += [a.values for a in (*self._row_average.values(), *self._gradient_average.values())
                 if a.values is not None]
        return int(sum(t.numel() * t.element_size() for t in held))

    def _flight_state(self, flight: Flight, backward: bool) -> dict[str, Any]:
        flight.complete()  # collective: every rank checkpoints the same flights in the same order
        return {"epoch": flight.epoch, "source_epoch": flight.source_epoch,
                "rows": {part.owner: part.rows.cpu() for part in self._received(flight, backward)}}

    def state_dict(self) -> dict[str, Any]:
        """The kept flights (completed first; collective over the plan's column), and the averages."""
        def averages(table: dict[tuple[int, int], _Average]) -> dict[tuple[int, int], torch.Tensor]:
            return {key: a.values.cpu() for key, a in table.items() if a.values is not None}

        return {"tau": self.tau, "gamma": self.gamma, "inner": self.inner.state_dict(),
                "rows": {layer: [self._flight_state(f, False) for f in q] for layer, q in sorted(self._rows.items())},
                "gradients": {layer: [self._flight_state(f, True) for f in q]
                              for layer, q in sorted(self._gradients.items())},
                "row_average": averages(self._row_average), "gradient_average": averages(self._gradient_average)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state.get("tau"), state.get("gamma")) != (self.tau, self.gamma):
            raise ValueError(f"the checkpoint's pipeline has tau={state.get('tau')}, gamma={state.get('gamma')}; "
                             f"this run has tau={self.tau}, gamma={self.gamma}")
        self.inner.load_state_dict(state["inner"])  # first: a sampled flight is rebuilt from its epoch's probabilities
        plan, device = self.plan, self.plan.device

        def restore(saved: dict[str, Any], layer: int, backward: bool) -> Flight:
            parts = plan.parts_of(self, int(saved["source_epoch"]), backward=backward)
            for part in parts:
                rows = saved["rows"].get(part.owner)
                part.rows = rows.to(device) if rows is not None else None
            return Flight(int(saved["epoch"]), layer, parts, None, int(saved["source_epoch"]))

        self._rows = {int(layer): deque(restore(f, int(layer), False) for f in flights)
                      for layer, flights in state["rows"].items()}
        self._gradients = {int(layer): deque(restore(f, int(layer), True) for f in flights)
                           for layer, flights in state["gradients"].items()}
        for table, saved in ((self._row_average, state["row_average"]),
                             (self._gradient_average, state["gradient_average"])):
            table.clear()
            for key, values in saved.items():
                table[tuple(key)] = average = _Average(self.gamma)
                average.values = values.to(device)
