"""Rows of a row-distributed matrix by global id: the one pull (DESIGN sections 3 and 10; DGL's ``DistTensor[ids]``).

A row-distributed matrix has its rows owned in the layout's contiguous ranges: rank ``q`` of ``comm`` owns
rows ``[off[q], off[q+1])``. A pull asks, on every rank at once, for rows by global id and gets them from their
owners. Everything that reads rows it does not own goes through it: GCN normalisation (the degrees of the
columns a rank touches, :mod:`algorithms.normalize`), a static input's halo (:mod:`sparse_dist.halo`),
mini-batch feature rows (:mod:`sparse_dist.fetch`) and sampling's answers (:mod:`sparse_dist.sampling`), so it
is counted and predicted here, once.

One pull (:class:`Pull`):

1. **counts** -- how many ids each rank asks of each other, one alltoallv of int64 (``K`` per pair where the
   ids come in ``K`` segments, e.g. the batches of one sampling round), unless the caller holds them agreed
   already (``answered``: the halo's boundary counts, agreed by :class:`~sparse_dist.dcsr.DistCSR`);
2. **ids** -- the global ids, each segment sorted (stably) by owner, one alltoallv of int64;
3. **answers** -- one alltoallv back: the owners' rows of a tensor (:meth:`Pull.rows`, ``row_bytes`` per id),
   or int64 answers an owner computes for the ids it was asked (:meth:`Pull.answers`, any length; their
   lengths go first, in one alltoallv of one int64 per peer).

Ids may be this rank's own: they travel through the alltoallv's own slot, which counts nothing. On one rank
every exchange is that slot alone, so :func:`_exchange` hands the send buffer back as the received one (no
copy of the ids, the rows or the answers; the call is still booked, with 0 bytes).

Bytes on one rank (the :class:`~sparse_dist.accounting.CommStats` convention; :func:`predict_pull_bytes`),
over the other ranks ``q``: sent = ``8 K`` (counts, where exchanged) + ``8`` per id asked of ``q`` + ``8``
(answer length, ragged answers only) + the answer bytes sent to ``q``; received alike with the roles swapped.
The requests are booked under ``request_phase`` (by default ``phase``), the answers under ``phase``.

Collective over ``comm``: construction of a :class:`Pull` and each of its answers, every rank in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sparse_dist.comm import Communicator
from sparse_dist.layout import RowLayout

__all__ = ["ID_BYTES", "Pull", "PullTraffic", "predict_pull_bytes"]

ID_BYTES = 8  # ids, counts and answer lengths travel as int64


@dataclass(frozen=True)
class PullTraffic:
    """One rank's side of one pull, per rank ``q``: ``asked[q]`` ids asked of ``q`` and ``bytes_in[q]`` answer
    bytes received from it; ``answered[q]`` ids ``q`` asked of this rank and ``bytes_out[q]`` answer bytes sent
    to it. ``segments``: counts per pair exchanged (0 where the caller gave them); ``ragged``: answer lengths
    exchanged (one int64 per pair)."""

    asked: Sequence[int]
    answered: Sequence[int]
    bytes_in: Sequence[int]
    bytes_out: Sequence[int]
    segments: int = 1
    ragged: bool = False

    @classmethod
    def dense(cls, asked: Sequence[int], answered: Sequence[int], row_bytes: int, segments: int = 1) -> "PullTraffic":
        """A pull of rows of ``row_bytes`` each (:meth:`Pull.rows`)."""
        return cls(asked, answered, [row_bytes * a for a in asked], [row_bytes * a for a in answered], segments)

    def request_bytes(self, rank: int) -> dict[str, int]:
        """What the counts and ids move on ``rank`` (the own slot counts nothing)."""
        others = [q for q in range(len(self.asked)) if q != rank]
        fixed = ID_BYTES * self.segments * len(others)
        return {"sent": fixed + ID_BYTES * sum(self.asked[q] for q in others),
                "recv": fixed + ID_BYTES * sum(self.answered[q] for q in others)}

    def answer_bytes(self, rank: int) -> dict[str, int]:
        """What the answers (and their lengths, when ragged) move on ``rank``."""
        others = [q for q in range(len(self.asked)) if q != rank]
        fixed = ID_BYTES * len(others) if self.ragged else 0
        return {"sent": fixed + sum(self.bytes_out[q] for q in others),
                "recv": fixed + sum(self.bytes_in[q] for q in others)}


def predict_pull_bytes(traffic: PullTraffic, rank: int) -> dict[str, int]:
    """Bytes one pull sends and receives on ``rank``, requests and answers together (module docstring)."""
    request, answer = traffic.request_bytes(rank), traffic.answer_bytes(rank)
    return {side: request[side] + answer[side] for side in ("sent", "recv")}


def _split(flat: np.ndarray, lengths: np.ndarray, size: int, segments: int) -> list[list[np.ndarray]]:
    """``flat`` cut into ``lengths`` (peer-major, ``segments`` per peer): per peer, its segments."""
    bounds = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    return [[flat[bounds[q * segments + b]:bounds[q * segments + b + 1]] for b in range(segments)]
            for q in range(size)]


def _exchange(comm: Communicator, send: torch.Tensor, send_rows: Sequence[int], recv_rows: Sequence[int],
              phase: str) -> torch.Tensor:
    """One alltoallv of ``send``'s rows (``send_rows[q]`` to rank ``q``, ``recv_rows[q]`` from it), received
    into a new tensor; on one rank the send tensor is the answer, booked as a call of 0 bytes without a copy.
    Collective."""
    if comm.size == 1:
        comm.stats.add_bytes(phase, 0, 0)
        return send
    recv = send.new_empty((int(sum(recv_rows)), *send.shape[1:]))
    comm.alltoallv(send, list(send_rows), recv, list(recv_rows), phase)
    return recv


def _exchange_int64(comm: Communicator, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int],
                    phase: str) -> np.ndarray:
    """:func:`_exchange` of an int64 array."""
    send_tensor = torch.from_numpy(np.ascontiguousarray(send, dtype=np.int64))
    return _exchange(comm, send_tensor, send_counts, recv_counts, phase).numpy()


class Pull:
    """One pull's requests, agreed with the owners (construction is collective: counts, then ids).

    ``wanted``: this rank's global ids (one array), or ``K`` segments of them (the same ``K`` on every rank);
    any owners, own rows included, possibly none. After construction: ``asked[q][b]`` the ids of segment ``b``
    asked of rank ``q`` (in the segment's order), ``incoming[q][b]`` those rank ``q`` asked of this one.
    ``orders[b]``: the positions of segment ``b``'s ids in the order they travel (by owner, stable).
    ``answered``: the ids each rank asks of this one, where already agreed (one segment only): then no counts
    travel.
    """

    def __init__(self, comm: Communicator, layout: RowLayout, wanted: np.ndarray | Sequence[np.ndarray], phase: str,
                 *, request_phase: str | None = None, answered: Sequence[int] | None = None) -> None:
        if layout.parts != comm.size:
            raise ValueError(f"a pull needs one layout part per rank: {layout.parts} parts for {comm.size} ranks")
        segments = ([np.asarray(wanted, dtype=np.int64)] if isinstance(wanted, np.ndarray)
                    else [np.asarray(ids, dtype=np.int64) for ids in wanted])
        if not segments or (answered is not None and len(segments) != 1):
            raise ValueError(f"a pull takes one or more segments of ids, agreed counts with one only; got "
                             f"{len(segments)} segment(s)")
        self.comm, self.layout, self.phase = comm, layout, phase
        self.request_phase = request_phase or phase
        self._agreed = answered is not None
        self.first_row = int(layout.offsets[comm.rank])
        size, count = comm.size, len(segments)
        self.sizes = [ids.size for ids in segments]
        self._where: list[list[np.ndarray]] = [[] for _ in range(size)]  # [q][b]: positions in the concatenation
        self.asked: list[list[np.ndarray]] = [[] for _ in range(size)]
        self.orders: list[np.ndarray] = []  # per segment: its ids' positions in the order they travel (by owner)
        start = 0
        for ids in segments:
            owners = layout.owner_of(ids) if ids.size else np.zeros(0, dtype=np.int64)
            order = np.argsort(owners, kind="stable")
            self.orders.append(order)
            bounds = np.searchsorted(owners[order], np.arange(size + 1))
            for q in range(size):
                picked = order[bounds[q]:bounds[q + 1]]
                self.asked[q].append(ids[picked])
                self._where[q].append(picked + start)
            start += ids.size
        lengths = np.array([part.size for q in range(size) for part in self.asked[q]], dtype=np.int64)
        if answered is None:
            incoming = torch.empty(size * count, dtype=torch.int64)
            comm.alltoallv(torch.from_numpy(lengths), [count] * size, incoming, [count] * size, self.request_phase)
            incoming_lengths = incoming.numpy()
        else:
            incoming_lengths = np.asarray(answered, dtype=np.int64)
        self.asked_counts = lengths.reshape(size, count).sum(axis=1).tolist()
        self.answered_counts = incoming_lengths.reshape(size, count).sum(axis=1).tolist()
        send = np.concatenate([part for q in range(size) for part in self.asked[q]] + [np.zeros(0, np.int64)])
        recv = _exchange_int64(comm, send, self.asked_counts, self.answered_counts, self.request_phase)
        self.incoming = _split(recv, incoming_lengths, size, count)

    @property
    def requests(self) -> list[np.ndarray]:
        """The ids asked of each rank, segments one after another."""
        return [np.concatenate(parts) for parts in self.asked]

    def rows(self, owned: torch.Tensor) -> torch.Tensor:
        """The wanted rows of the matrix whose own rows are ``owned`` (``n_own x ...``, this rank's range), in
        ``wanted``'s order (segments one after another); on ``owned``'s device and dtype. Collective."""
        device = owned.device
        local = np.concatenate([ids for parts in self.incoming for ids in parts] + [np.zeros(0, np.int64)])
        send = owned.index_select(0, torch.from_numpy(local - self.first_row).to(device)).contiguous()
        recv = _exchange(self.comm, send, self.answered_counts, self.asked_counts, self.phase)
        where = np.concatenate([w for parts in self._where for w in parts] + [np.zeros(0, np.int64)])
        if np.array_equal(where, np.arange(where.size)):  # asked in owner order already (a halo): no copy
            return recv
        out = torch.empty_like(recv)
        out[torch.from_numpy(where).to(device)] = recv
        return out

    def answers(self, replies: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Send ``replies[q]`` (int64, any length: this rank's answer to ``incoming[q]``) to each rank ``q``;
        returns, per rank, its answer to this one. Two alltoallvs: the lengths, then the answers. Collective."""
        send = np.concatenate([np.asarray(reply, dtype=np.int64) for reply in replies] + [np.zeros(0, np.int64)])
        return self.packed_answers(send, [len(reply) for reply in replies])

    def packed_answers(self, send: np.ndarray, lengths: Sequence[int]) -> list[np.ndarray]:
        """:meth:`answers` for replies already laid out one after another in ``send`` (int64; ``lengths[q]``
        of them for rank ``q``), so that no copy gathers them. Collective."""
        size = self.comm.size
        sent = torch.tensor(list(lengths), dtype=torch.int64)
        incoming = torch.empty(size, dtype=torch.int64)
        self.comm.alltoallv(sent, [1] * size, incoming, [1] * size, self.phase)
        recv = _exchange_int64(self.comm, send, sent.tolist(), incoming.tolist(), self.phase)
        return [parts[0] for parts in _split(recv, incoming.numpy(), size, 1)]

    def traffic(self, row_bytes: int) -> PullTraffic:
        """This pull's :class:`PullTraffic` when answered with rows of ``row_bytes`` (:meth:`rows`)."""
        segments = 0 if self._agreed else len(self.sizes)
        return PullTraffic.dense(self.asked_counts, self.answered_counts, row_bytes, segments)
