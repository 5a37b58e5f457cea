"""What every policy answers, and the one protocol through which a policy does per-epoch work in training.

A policy (a sampler of ``--sample`` or a rule of ``--stale``) is a typed object built once from its text
(:mod:`algorithms.policies.spec`). Beyond the exchange protocols of :mod:`sparse_dist.exchange` it answers:

* :meth:`PolicyBase.refusal`: why it cannot run in a given run (plan, replication, layer kind, dropout side,
  layer-0 input, the other axis), one sentence, or None. One method per policy, called once per run from the
  flags alone, before MPI does any collective work (:meth:`algorithms.policies.spec.PolicySpec.refusal`).
* what it needs of a plan (``samples``, ``per_receiver``, ``caches``), so that the plan's own capabilities can
  be checked without building a strategy;
* :meth:`PolicyBase.epoch_work`: an :class:`EpochWork` when it needs work in the training loop (``dgs``
  explains every ``every`` epochs, ``psc`` with a feature cache feeds layer 0), else None. The trainer calls
  the work's hooks and never names a policy;
* :meth:`PolicyBase.state_size`: what it keeps on each rank between epochs, for the memory and disk estimates;
* :meth:`PolicyBase.resume_drops`: what of its per-rank state a resume at another layout drops;
* :meth:`PolicyBase.tightened`: its text one step toward exact, for the accuracy guard
  (:mod:`algorithms.training.guard`), or None where the next step is exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch


@dataclass(frozen=True)
class RunShape:
    """What a policy checks itself against, all known from the command line.

    ``samples``: whether the run's sampling axis sends a sampled subset (a staleness rule may refuse it).
    """

    plan: str = "p2p"
    replication: int = 1
    model: str = "gcn"
    dropout_side: str = "auto"
    input_exchange: str = "auto"
    samples: bool = False


class TrainingParts(Protocol):
    """The trainer as a policy's :class:`EpochWork` sees it (named by shape: policies import no trainer)."""

    spmm: Any                  # sparse_dist.spmm.DistSpMM: .plan, .lifecycle (its sampling), .timer
    model: Any                 # algorithms.model.GraphModel
    halo: Any                  # sparse_dist.halo.StaticHalo or None
    col_comm: Any           # the G ranks holding distinct rows
    device: torch.device
    first_row: int
    epoch: int

    @property
    def layer_input(self) -> torch.Tensor:
        """Layer 0's input: own rows, then halo rows where there is a halo."""


class EpochWork:
    """Per-epoch work a policy adds to training; every hook does nothing by default.

    The trainer calls, per training epoch: :meth:`before_epoch` (after the epoch's timers start; may be
    collective, the same on every rank), :meth:`layer_input` in each forward that runs the policy (not in
    evaluation nor the audit's exact forward), :meth:`end_of_step`, :meth:`after_epoch`. Checkpoints carry :meth:`state` (the same
    on every rank: kept across a resume at any ``P``) and :meth:`rank_state` (per rank). The keys they return
    are the record's and the checkpoint's: each work chooses keys no other uses.
    """

    booked: ClassVar[tuple[str, ...]] = ()  # timer parts it books in the epoch's time breakdown

    def before_epoch(self, epoch: int) -> dict[str, Any]:
        """Work at the start of a training epoch; entries for the epoch's record."""
        return {}

    def input_exchange(self, choice: Any, spec: str, requested: str) -> Any:
        """How layer 0 gets its input (:class:`algorithms.static_input.InputExchange`), given the byte model's
        ``choice``, the policy's text and the ``--input-exchange`` asked for."""
        return choice

    def layer_input(self, epoch: int, halo: Any, values: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """Layer 0's halo and input rows for this epoch's training forward."""
        return halo, values

    def end_of_step(self) -> dict[str, Any]:
        """Work once the step's messages are all sent, before its record's figures are taken (collective where
        a work says so: its bytes are the step's); entries for the epoch's record."""
        return {}

    def after_epoch(self) -> dict[str, Any]:
        """Entries for the epoch's record once the step is done."""
        return {}

    def memory(self) -> dict[str, int] | None:
        """What it keeps for layer 0 (``halo_rows``, ``halo_bytes``, ``matrix_bytes``), or None."""
        return None

    def state(self) -> dict[str, Any]:
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        pass

    def rank_state(self) -> dict[str, Any]:
        return {}

    def load_rank_state(self, state: dict[str, Any], device: torch.device) -> None:
        pass


@dataclass(frozen=True)
class StateSize:
    """What a policy keeps on each rank between epochs, per exchanging layer, in units an estimator prices
    (the memory and disk estimates of ``train``, its per-rank checkpoint files).

    ``row_copies``: arrays of (rows the layer exchanges) x (its exchanged width); ``block_structure``: also the
    structure of the blocks it received (column ids, values, row pointers: cached blocks).
    """

    row_copies: int = 0
    block_structure: bool = False


class PolicyBase:
    """Defaults of the policy protocol (see the module docstring): no refusal, no per-epoch work, no per-rank
    state, and every attribute a strategy or an estimator reads of a policy, so a policy declares only what
    it changes. A sampler declares ``p`` and ``side`` itself (no default: they define it); a pipelined rule
    ``tau`` and ``gamma``."""

    samples: ClassVar[bool] = False       # needs a plan that can send a sampled subset of rows
    per_receiver: ClassVar[bool] = False  # needs a plan that sends each receiver its own subset (p2p)
    caches: ClassVar[bool] = False        # needs a plan whose receivers can cache whole blocks
    feeds_layer0: ClassVar[bool] = False  # gives layer 0 its input itself (its work's layer_input)
    # a sampler's (sparse_dist.exchange.BoundarySampler, sparse_dist.importance)
    per_edge: ClassVar[bool] = False      # samples each receiver's own edges (an ImportanceStrategy)
    keeps_rows: ClassVar[bool] = False    # the strategy keeps the latest received rows (an explainer reads them)
    # a staleness rule's (sparse_dist.exchange.StalenessRule; the performance model)
    needs_gap: ClassVar[bool] = False     # decides from the variation gap of the rows
    skip_backward: ClassVar[bool] = False  # a stale block's gradients are dropped too
    pipelined: ClassVar[bool] = False     # a PipelinedStrategy rule (tau, gamma), else a CachedStrategy one
    overlaps: ClassVar[bool] = False      # its flights travel while layers compute
    agreement: ClassVar[bool] = False     # deciding costs one allgather of flags per layer

    def scheduled_share(self) -> float | None:
        """The share of forward blocks a rule sends, where a fixed schedule says; None where it depends on the
        data (``sparse-dist cost predict`` then asks for ``--active``)."""
        return None

    def state_size(self) -> StateSize:
        """What it keeps on each rank between epochs (checkpointed in the rank's policy file). The default is what
        the strategy its declarations choose keeps: a cached-block rule (``caches``, not ``pipelined``) one
        received block per layer with its structure; anything else nothing."""
        return StateSize(1, True) if self.caches and not self.pipelined else StateSize()

    def refusal(self, run: RunShape) -> str | None:
        """Why this policy cannot run in ``run`` (one sentence, naming what to change), or None."""
        return None

    def epoch_work(self, parts: TrainingParts) -> EpochWork | None:
        """Its per-epoch work in a trainer (built once per trainer, collective where it says so), or None."""
        return None

    def resume_drops(self) -> str | None:
        """What of its per-rank state a resume at another world size, replication or plan drops, or None."""
        return None

    def tightened(self, run: RunShape) -> str | None:
        """Its text one step closer to exact in ``run`` (parsed again by the one parser of policy text), or
        None where the next step is exact itself. The default: straight to exact."""
        return None


def doubled_share(value: float) -> float | None:
    """A kept share one step toward exact: doubled, or None where doubling reaches 1 (everything kept)."""
    return None if 2.0 * value >= 1.0 else 2.0 * value


def per_edge_refusal(run: RunShape) -> str | None:
    """The shared check of the samplers that sample each receiver's own edges (``psc``, ``dgs``)."""
    if run.replication != 1:
        return "samples each receiver's own edges: it needs --replication 1 (1D)"
    return None
