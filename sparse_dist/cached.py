"""Cached historical blocks with staleness-aware skip-broadcast (SANCUS; DESIGN section 4).

:class:`CachedStrategy` wraps an exact or sampled strategy: before each exchange a
:class:`~sparse_dist.exchange.StalenessRule` marks every owner ACTIVE (sends; receivers refresh their
cache) or STALE (skips; receivers reuse the cached block). Its per-rank state (versions, cached blocks,
what this owner last sent, the decisions log, checkpoints) is a :class:`HistoryCache`. Only the
broadcast plans carry it (every receiver gets the same block, so a block can be cached).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist import state_checks as checks
from sparse_dist.exchange import (BroadcastView, ExchangeContext, ExchangeStrategy, Message, Transfer, StalenessRule,
                                  StalenessView)

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


class HistoryCache:
    """SANCUS state on one rank: versions, cached blocks, what it last sent, and the decisions log.

    ``versions[layer][j]``: epoch of owner ``j``'s last broadcast (-1: never), the same on every
    rank. The decisions log keeps the latest ``log_limit`` layer decisions (bounded; read through
    :meth:`decisions`).
    """

    def __init__(self, log_limit: int = 64) -> None:
        self.versions: dict[int, np.ndarray] = {}
        self.message_counts: dict[tuple[int, int], int] = {}
        # a sampled message's rows as rows of the exact message, per (layer, owner) (absent: all rows): a STALE
        # message's gradients go back as those rows, and error feedback indexes its residual by them
        self.message_positions: dict[tuple[int, int], np.ndarray] = {}
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
                       entry.global_rows if entry else None, self.message_positions.get((layer, owner)))

    def sent(self, layer: int, owner: int, epoch: int, count: int, positions: np.ndarray | None = None) -> None:
        self.versions[layer][owner] = epoch
        self.message_counts[(layer, owner)] = count
        if positions is None:
            self.message_positions.pop((layer, owner), None)
        else:
            self.message_positions[(layer, owner)] = positions

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
            "message_positions": {key: tensor(p) for key, p in self.message_positions.items()},
            "cache": {key: {"indptr": tensor(e.block.indptr), "indices": tensor(e.block.indices),
                            "data": tensor(e.block.data), "shape": list(e.block.shape), "values": e.values.cpu(),
                            "version": e.version, "global_rows": _rows_state(e.global_rows)}
                      for key, e in self.blocks.items()},
            "sent_rows": {layer: None if rows is None else rows.cpu() for layer, rows in self.sent_rows.items()},
            "sent_reference": {layer: ref.cpu() for layer, ref in self.sent_reference.items()},
        }

    def load_state_dict(self, state: dict[str, Any], plan: BroadcastView) -> None:
        """Restore what :meth:`state_dict` gave, every field checked against ``plan`` first (a rank file is
        data: a forged one must not reach the CSR product; :mod:`sparse_dist.state_checks`)."""
        device, groups = plan.device, plan.groups

        def owner_key(key: Any, what: str) -> tuple[int, int]:
            if not isinstance(key, tuple) or len(key) != 2:
                raise checks.StateError(f"{what} key {key!r} is not (layer, owner)")
            layer, owner = checks.count(key[0], f"{what}'s layer"), checks.count(key[1], f"{what}'s owner")
            if owner >= groups:
                raise checks.StateError(f"{what} names owner {owner} of {groups}")
            return layer, owner

        versions = {}
        for layer, saved in state["versions"].items():
            found = checks.ids(saved, f"the versions of layer {layer}", 1 << 62, low=-1)
            if found.numel() != groups:
                raise checks.StateError(f"the versions of layer {layer} name {found.numel()} owners of {groups}")
            versions[checks.count(layer, "a versioned layer")] = found.numpy().copy()
        counts = {owner_key(k, "a message count"): checks.count(v, f"the message count {k}")
                  for k, v in state["message_counts"].items()}
        positions = {}
        for key, saved in state.get("message_positions", {}).items():
            layer, owner = owner_key(key, "a message's positions")
            bound = plan.exact_message(owner).count
            positions[(layer, owner)] = checks.ids(saved, f"message {key}'s positions", bound).numpy().copy()
        blocks = {}
        for key, e in state["cache"].items():
            layer, owner = owner_key(key, "a cached block")
            exact = plan.exact_message(owner).block
            if exact is None:
                raise checks.StateError(f"cached block {key}: this rank receives no block from owner {owner}")
            indptr, indices, data, shape = checks.csr(e, f"cached block {key}", exact.shape[0], exact.shape[1])
            values = checks.rows(e.get("values"), f"cached block {key}'s rows", n_rows=shape[1])
            block = sp.csr_matrix((data.numpy(), indices.numpy(), indptr.numpy()), shape=shape)
            blocks[(layer, owner)] = CachedBlock(block, plan.csr(block), values.to(device),
                                                 checks.count(e.get("version"), f"cached block {key}'s version", -1),
                                                 _checked_rows(e.get("global_rows"), key, shape[1]))
        sent_rows = {checks.count(k, "a sent layer"): None if v is None else
                     checks.ids(v, f"the rows sent in layer {k}", 1 << 62).to(device)
                     for k, v in state["sent_rows"].items()}
        reference = {checks.count(k, "a reference layer"): checks.rows(v, f"the reference rows of layer {k}").to(device)
                     for k, v in state["sent_reference"].items()}
        self.versions, self.message_counts, self.message_positions = versions, counts, positions
        self.blocks, self.sent_rows, self.sent_reference = blocks, sent_rows, reference


def _checked_rows(saved: Any, key: Any, columns: int) -> np.ndarray | range | None:
    """A cached block's global row ids from its state, one per column, non-negative."""
    if saved is None:
        return None
    if isinstance(saved, torch.Tensor):
        found = checks.ids(saved, f"cached block {key}'s global rows", 1 << 62)
        if found.numel() != columns:
            raise checks.StateError(f"cached block {key} has {found.numel()} global rows for {columns} columns")
        return found.numpy().copy()
    if not isinstance(saved, (list, tuple)) or len(saved) != 2:
        raise checks.StateError(f"cached block {key}'s global rows {saved!r} are not a [start, stop] range")
    start, stop = checks.count(saved[0], "a global row range's start"), checks.count(saved[1], "its stop")
    if stop - start != columns:
        raise checks.StateError(f"cached block {key}'s global rows {start}..{stop} do not fit its {columns} columns")
    return range(start, stop)


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

    @property
    def sampling(self) -> ExchangeStrategy:
        return self.inner.sampling

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
                history.sent(layer, j, epoch, messages[j].count, messages[j].positions)
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

    def on_rows(self, context: ExchangeContext, part: Transfer) -> torch.Tensor | None:
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

