"""Pulling rows of ``X`` for a mini-batch from their owners, with a per-rank cache (DESIGN section 10).

A batch's input rows are its layer-0 source nodes. Own rows are read in place; remote rows held in the
cache are read from it; the others are pulled from their owners (:class:`sparse_dist.pull.Pull`, phase
``fetch``): an alltoallv of per-peer counts, one of the global ids, then one of the rows (``F`` columns of the
features' dtype, or of the narrower dtype that holds every rank's loaded rows bitwise where the caller gives
one: :mod:`sparse_dist.lossless_wire`). Bytes on one rank (the own slot of every alltoallv counts nothing):
sent = ``8 (P - 1)`` + ``8`` per id asked of another rank + ``F * itemsize`` per row answered to another
rank; received alike with the roles swapped (:func:`predict_fetch_bytes`, the pull's own prediction).

The cache (``--feature-cache SIZE`` rows per rank; psc's inclusion-aware idea, :mod:`sparse_dist.importance`,
and SALIENT++'s): the remote rows with the highest estimated probability of being an input row of one of
this rank's batches (:func:`inclusion_estimate`), fetched once when the fetcher is built (phase ``fetch``,
before training) and never refreshed (``X`` does not change).

Collective: construction (with a cache) and :meth:`FeatureFetcher.fetch`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.comm import Communicator
from sparse_dist.layout import RowLayout
from sparse_dist.lossless_wire import WireRows
from sparse_dist.pull import Pull, PullTraffic, predict_pull_bytes

__all__ = ["FeatureFetcher", "inclusion_estimate", "predict_fetch_bytes"]


def inclusion_estimate(rows: sp.csr_matrix, first_row: int, seed_probability: np.ndarray,
                       fanouts: Sequence[int | None]) -> tuple[np.ndarray, np.ndarray]:
    """Estimated probability that each node is an input (layer-0 source) row of one of this rank's batches.

    ``seed_probability``: per own row, the probability that it is a seed of a batch (0 for non-training
    rows). Hop by hop, a node is a source if it is a destination, or if some destination row ``i`` keeps an
    edge to it (probability ``p_i min(1, k / d_i)``, rows independent). Only this rank's rows can be
    expanded, so paths through remote rows are left out: an estimate, exact for the first hop. Returns
    (global ids with a positive estimate, sorted; their probabilities).
    """
    own = rows.shape[0]
    ids_own = np.arange(first_row, first_row + own, dtype=np.int64)
    ids = ids_own
    probability = np.asarray(seed_probability, dtype=np.float64)
    degrees = np.diff(rows.indptr)
    for fanout in fanouts:
        own_p = np.zeros(own)
        inside = (ids >= first_row) & (ids < first_row + own)
        own_p[ids[inside] - first_row] = probability[inside]
        keep = np.ones(own) if fanout is None else np.minimum(1.0, fanout / np.maximum(degrees, 1))
        edge_p = np.repeat(own_p * keep, degrees)
        edge_p[rows.indices == np.repeat(ids_own, degrees)] = 0.0  # a self loop adds nothing to being a destination
        columns = np.concatenate([rows.indices.astype(np.int64), ids])
        log_miss = np.concatenate([np.log1p(-np.minimum(edge_p, 1.0 - 1e-12)),
                                   np.log1p(-np.minimum(probability, 1.0 - 1e-12))])
        ids, where = np.unique(columns, return_inverse=True)
        probability = -np.expm1(np.bincount(where, weights=log_miss, minlength=ids.size))
        positive = probability > 0
        ids, probability = ids[positive], probability[positive]
    return ids, probability


def predict_fetch_bytes(asked: Sequence[int], answered: Sequence[int], rank: int, row_bytes: int) -> dict[str, int]:
    """Bytes one fetch sends and receives on ``rank``: ``asked[q]`` ids to rank ``q``, ``answered[q]`` rows to it."""
    return predict_pull_bytes(PullTraffic.dense(asked, answered, row_bytes), rank)


class FeatureFetcher:
    """This rank's rows of ``X`` (``own``, ``n_g x F``) and the way to the others' (module docstring).

    ``cache_ids``: the remote global ids to keep (chosen by the caller, e.g. from :func:`inclusion_estimate`),
    pulled once here; or ``held``: remote ids (ascending, distinct) and their rows the caller holds already (a
    static input's halo), kept as the cache without a pull (given on every rank or on none: the pull is
    collective). ``phase``: where the rows' bytes are booked, ``request_phase`` the ids' (``phase`` by default).
    ``wire``: ``own``'s rows as they travel and the way back to ``own``'s kind of rows, where
    a narrower dtype holds them bitwise (else ``own`` travels). After each :meth:`fetch`: ``last_requests``
    (the ids asked of each rank), ``last_asked``, ``last_answered`` (rows per peer), ``last_needed`` (remote
    rows the batch needed) and ``last_hits`` (of them, found in the cache).
    """

    def __init__(self, comm: Communicator, layout: RowLayout, group: int, own: torch.Tensor,
                 cache_ids: np.ndarray | None = None, phase: str = "fetch", wire: WireRows | None = None, *,
                 held: tuple[np.ndarray, torch.Tensor] | None = None, request_phase: str | None = None) -> None:
        self.comm, self.layout, self.own, self.phase, self.wire = comm, layout, own, phase, wire
        self.request_phase = request_phase or phase
        self.first_row = int(layout.offsets[group])
        self.last_asked: list[int] = [0] * comm.size
        self.last_answered: list[int] = [0] * comm.size
        self.last_needed = self.last_hits = 0
        self.last_requests: list[np.ndarray] = []
        if held is not None:
            self.cache_ids, self.cache_values = np.asarray(held[0], dtype=np.int64), held[1]
            return
        ids = np.unique(np.asarray(cache_ids if cache_ids is not None else [], dtype=np.int64))
        self.cache_ids = ids
        self.cache_values = self._pull(ids)  # collective even when empty: every rank enters it

    @property
    def width(self) -> int:
        return int(self.own.shape[1])

    def row_bytes(self) -> int:
        """Bytes of one row as it travels."""
        return self.width * (self.wire.sent if self.wire is not None else self.own).element_size()

    def _pull(self, ids: np.ndarray) -> torch.Tensor:
        """Rows ``ids`` (remote) pulled from their owners, in ``ids``' order (collective)."""
        pull = Pull(self.comm, self.layout, ids, self.phase, request_phase=self.request_phase)
        rows = pull.rows(self.own) if self.wire is None else self.wire.decode(pull.rows(self.wire.sent))
        self.last_requests = pull.requests
        self.last_asked, self.last_answered = pull.asked_counts, pull.answered_counts
        return rows

    def fetch(self, src: np.ndarray) -> torch.Tensor:
        """Rows of ``X`` for the global ids ``src`` (any owners, unique), in ``src``'s order (collective)."""
        src = np.asarray(src, dtype=np.int64)
        out = torch.empty(src.size, self.width, dtype=self.own.dtype, device=self.own.device)
        last = self.first_row + self.own.shape[0]
        mine = (src >= self.first_row) & (src < last)
        device = self.own.device
        out[torch.from_numpy(np.flatnonzero(mine)).to(device)] = self.own.index_select(
            0, torch.from_numpy(src[mine] - self.first_row).to(device))
        remote = np.flatnonzero(~mine)
        slots = np.zeros(remote.size, dtype=np.int64)
        cached = np.zeros(remote.size, dtype=bool)
        if self.cache_ids.size:
            slots = np.minimum(np.searchsorted(self.cache_ids, src[remote]), self.cache_ids.size - 1)
            cached = self.cache_ids[slots] == src[remote]
        out[torch.from_numpy(remote[cached]).to(device)] = self.cache_values.index_select(
            0, torch.from_numpy(slots[cached]).to(device))
        missing = remote[~cached]
        out[torch.from_numpy(missing).to(device)] = self._pull(src[missing])
        self.last_needed, self.last_hits = int(remote.size), int(cached.sum())
        return out
