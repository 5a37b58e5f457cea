"""How a grid layer's allreduces travel: exact, in pieces, or compressed (``train --grid ... --compress F``).

Every collective of the grid's layers (:mod:`sparse_dist.grid_gcn`, :mod:`sparse_dist.grid_sage`) is an allreduce
along one axis. A layer asks its :class:`GridLinks` for each one by name (:data:`MESSAGES`), so the layer does not
know whether it travels exact or coded.

**Exact** (:func:`allreduce_pieces`): MPI's allreduce, in pieces of :data:`ALLREDUCE_PIECE_BYTES`.

**Coded** (:func:`coded_allreduce`, where the run has a codec, :mod:`sparse_dist.compress`): MPI cannot sum codes,
so a coded allreduce of ``r x w`` rows over ``s`` ranks is a reduce-scatter and an all-gather of coded rows, each
an alltoallv of plain bytes. The rows are cut into ``s`` chunks (``numpy.array_split``'s); the rank at index ``k``
owns chunk ``k``:

1. *reduce-scatter*: it codes every other chunk of its rows once and sends chunk ``j`` to rank ``j``; it sums its
   own chunk (exact: it does not travel) and the ``s - 1`` chunks it receives, decoded, in rank order;
2. *all-gather*: it codes that sum once and sends it to every other rank; every rank, the owner included, then
   holds the decoded sums, so the replicas along the axis stay equal (the grid relies on it).

A rank sends ``(r - r_k) + (s - 1) r_k`` coded rows (``r_k`` its chunk's rows) and receives as many: the ring
allreduce's ``2 (r - r_k)`` rows where the chunks are equal, at the codec's ``row_bytes(w)`` a row instead of
``w`` values (:func:`coded_allreduce_bytes`). With error feedback each sender keeps, per layer, message and stage,
the error of what it coded (the other chunks' rows, and its sum), and adds it to the next step's (the 1D rule of
:mod:`sparse_dist.compress`). An axis of one rank sends nothing and codes nothing.

Coded: the layers' forward aggregation and combination (direction ``rows``) and backward aggregation gradient
and input gradient (``gradients``): the 1D plans' compressed messages are the same rows. Exact: the weights'
gradient allreduce (as the 1D plans' gradient allreduce), the loss's, layer 0's aggregation computed once a run,
and every evaluation (an evaluation is exact).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from sparse_dist.accounting import ring_allreduce_bytes
from sparse_dist.comm import Communicator
from sparse_dist.compress import Codec
from sparse_dist.grid import ProcessGrid, block_range

ALLREDUCE_PIECE_BYTES = 16 << 20
"""The grid's exact allreduces run in pieces of at most this many bytes: MPICH's allreduce of a large buffer
allocates a temporary as large as the buffer, so in pieces the temporary is one piece (R-MAT SCALE 20, 2x2x2, GCN
3 x 128: the largest rank's peak 1.33 against 1.39 GiB and 1.29 against 1.42 GiB, two pairs of runs under load)."""

MESSAGES: dict[str, str | None] = {
    "aggregation": "rows",            # forward: T[d, i] over o
    "combination": "rows",            # forward: H'[d, o] over i
    "aggregation_gradient": "gradients",  # backward: dT[d, i] over o
    "input_gradient": "gradients",    # backward: dH[o, i] over d
    "weight_gradient": None,          # the weights' and bias's gradient over d: exact
    "loss": None,                     # the loss's row maxima, sums and picked logits over o, its total over d
}
"""Each allreduce a grid layer asks for, and the codec's direction where a codec compresses it (None: exact)."""


def allreduce_pieces(comm: Communicator, tensor: torch.Tensor, phase: str, op: str = "sum") -> None:
    """In-place allreduce of a contiguous ``tensor`` over ``comm``, in pieces of :data:`ALLREDUCE_PIECE_BYTES`
    (collective; every rank of ``comm`` holds a tensor of the same size, so the pieces agree)."""
    flat = tensor.view(-1)
    step = max(1, ALLREDUCE_PIECE_BYTES // tensor.element_size())
    if flat.numel() <= step:
        comm.allreduce_(tensor, phase, op=op)
        return
    for lo in range(0, flat.numel(), step):
        comm.allreduce_(flat[lo:lo + step], phase, op=op)


def pieces_bytes(numel: int, group_size: int, index: int, itemsize: int) -> int:
    """Bytes one rank sends in :func:`allreduce_pieces` of ``numel`` elements: each piece's ring allreduce
    (:func:`sparse_dist.accounting.ring_allreduce_bytes`)."""
    step = max(1, ALLREDUCE_PIECE_BYTES // itemsize)
    return sum(ring_allreduce_bytes(min(step, numel - lo), group_size, index, itemsize)
               for lo in range(0, max(numel, 1), step))


def coded_allreduce_bytes(rows: int, group_size: int, index: int, row_bytes: int) -> int:
    """Bytes the rank at ``index`` sends (and receives) in :func:`coded_allreduce` of ``rows`` rows of
    ``row_bytes`` coded bytes each over ``group_size`` ranks."""
    if group_size <= 1:
        return 0
    lo, hi = block_range(rows, group_size, index)
    return ((rows - (hi - lo)) + (group_size - 1) * (hi - lo)) * row_bytes


def coded_allreduce(comm: Communicator, tensor: torch.Tensor, codec: Codec, key: tuple[object, ...], phase: str,
                    seed_key: tuple[int, ...]) -> None:
    """In-place sum of ``tensor`` (``r x w``, the same shape on every rank of ``comm``) over ``comm``, its
    messages coded by ``codec`` (module docstring): afterwards every rank holds the same decoded sums.
    ``key``: the message's feedback residuals (with the stage appended); ``seed_key``: its stochastic rounding's
    stream (with the stage appended; integers). Collective over ``comm``: two alltoallvs in ``phase``."""
    size, me = comm.size, comm.rank
    if size == 1:
        return
    rows, width = tensor.shape
    spans = [block_range(rows, size, j) for j in range(size)]
    lo, hi = spans[me]
    own = hi - lo
    others = np.r_[0:lo, hi:rows].astype(np.int64)
    foreign = tensor[others] if own else tensor
    # 1. reduce-scatter: each other chunk coded once, to its owner; the owner sums in rank order
    payload = codec.send(foreign, (*key, "scatter"), rows, others if own else None, (*seed_key, 0))
    counts = [hi_j - lo_j if j != me else 0 for j, (lo_j, hi_j) in enumerate(spans)]
    received = codec.empty(own * (size - 1), width, tensor.device)
    comm.alltoallv(payload, counts, received, [own if j != me else 0 for j in range(size)], phase)
    chunk = tensor[lo:hi]
    if own:
        chunk.add_(codec.decode(received, width, tensor.dtype).view(size - 1, own, width).sum(dim=0))
    # 2. all-gather: the sum coded once, to every other rank; every rank decodes the same bytes
    summed = codec.send(chunk, (*key, "gather"), own, None, (*seed_key, 1))
    gathered = codec.empty(rows - own, width, tensor.device)
    comm.alltoallv(summed.repeat(size - 1, 1), [own if j != me else 0 for j in range(size)], gathered, counts,
                   phase)
    chunk.copy_(codec.decode(summed, width, tensor.dtype))
    if own:
        tensor[others] = codec.decode(gathered, width, tensor.dtype)
    else:
        tensor.copy_(codec.decode(gathered, width, tensor.dtype))


@dataclass(frozen=True)
class GridLinks:
    """How one layer's allreduces travel on this rank (module docstring): exact where ``codec`` is None (every
    evaluation, layer 0's aggregation once a run), else the :data:`MESSAGES` that have a direction coded.
    ``epoch`` and the rank's place seed stochastic rounding, so that a run is reproducible."""

    grid: ProcessGrid
    layer: int
    codec: Codec | None = None
    epoch: int = 0

    def allreduce(self, tensor: torch.Tensor, axis: str, phase: str, message: str) -> None:
        """Sum the 2-D ``tensor`` in place over the ``axis`` communicator (collective over it)."""
        direction = MESSAGES[message]
        comm = self.grid.axis_comm[axis]
        if self.codec is None or direction is None or comm.size == 1:
            allreduce_pieces(comm, tensor, phase)
            return
        index = tuple(MESSAGES).index(message)
        coded_allreduce(comm, tensor, self.codec.at(self.layer, direction), (self.layer, direction, message),
                        phase, (self.epoch, self.layer, index, self.grid.comm.rank))

    def message_bytes(self, message: str, axis: str, rows: int, width: int, itemsize: int) -> int:
        """Bytes this rank sends in :meth:`allreduce` of ``rows x width`` values of ``itemsize`` bytes."""
        return allreduce_message_bytes(self.codec, message, self.grid.shape.of(axis), self.grid.coords[axis],
                                       rows, width, itemsize)


def allreduce_message_bytes(codec: Codec | None, message: str, group_size: int, index: int, rows: int, width: int,
                            itemsize: int) -> int:
    """Bytes the rank at ``index`` of an axis of ``group_size`` sends in :meth:`GridLinks.allreduce` of ``message``
    (``rows x width`` values of ``itemsize`` bytes), exact or coded by ``codec``: the byte model's rule."""
    if codec is None or MESSAGES[message] is None:
        return pieces_bytes(rows * width, group_size, index, itemsize)
    return coded_allreduce_bytes(rows, group_size, index, codec.row_bytes(width))


__all__ = ["ALLREDUCE_PIECE_BYTES", "GridLinks", "MESSAGES", "allreduce_message_bytes", "allreduce_pieces",
           "coded_allreduce", "coded_allreduce_bytes", "pieces_bytes"]
