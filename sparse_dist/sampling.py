"""Distributed neighbour sampling as sampled sparse matrix algebra (DESIGN section 10; DistDGL, GraphSAGE).

A mini-batch's layer-``l`` frontier is a row selection of ``Â``. Sampling one hop is a per-row column
selection with a per-edge scale that keeps the estimator of ``Â H`` unbiased: a row of degree ``d`` (stored
entries, self loop included) with fanout ``k < d`` keeps ``k`` entries drawn uniformly without replacement,
each multiplied by ``d / k`` (each entry is kept with probability ``k / d``); with ``k >= d`` or fanout
``None`` ("all") every entry stays with scale 1, so the sampled product is exact.

Who samples: the OWNER of a row. A hop is one pull (:class:`sparse_dist.pull.Pull`, phase ``sample``) whose
answers the owners compute: the requester sends each owner the global ids of the frontier rows it owns (an
alltoallv of per-peer counts, then one alltoallv of the ids); each owner samples its own rows and answers
with, per row, the number of entries kept, then their global column ids and values (float64), packed into
one int64 buffer per peer (an alltoallv of per-peer answer lengths, then one alltoallv of the answers). The requester builds a small
local CSR (:class:`SampledBlock`): rows = the hop's destination nodes, columns = its source nodes, which are
the destination nodes first (so a self term reads the first rows, as SAGE does) and then the new nodes in
increasing global id.

Randomness: row ``i`` keeps the entries at ``k`` positions of its stored order drawn by Floyd's algorithm
(:func:`floyd_positions`) from counter-based hashes of (seed, epoch, step, layer, ``i``, draw): ``k`` draws a
row, not one hash per entry. So a node's sample depends neither on ``P`` nor on which rank asks; it depends
on the order the row's entries are stored in, which is the shards' (each row's columns ascending, as
``prepare`` writes them) at every ``P``. (Ranking every entry by a hash of its column and keeping the ``k``
smallest, the earlier rule, did not depend on the storage order but hashed all ``d`` entries of every row: on
the 200k synthetic, degree 29, fanouts 15, 10, 5, most rows hashed six times the entries they kept.)

Two kernels draw the same rows, bitwise (tested over many keys, fanouts and degrees): ``numba``
(:mod:`sparse_dist.sampling_compiled`, Floyd's draw per row, rows in parallel on the process's thread count,
and the requester's block assembly in linear passes; what a run uses by default) and ``numpy``
(:func:`sample_rows`, the reference: the draws of every sampled row of the hop vectorised over rows;
single-threaded and slower on large hops). ``auto`` (the default) is ``numba`` where numba imports, else ``numpy``, said once
in the log (:func:`resolve_sampler`); numba is a dependency of the package, so a user gets the compiled
kernel unless its import fails.

Bulk sampling (:meth:`DistributedSampler.sample_many`; DistDGL's and ByteGNN's k-batch step): ``K`` batches
share each hop's round. The requests to a peer are the batches' frontier rows one batch after another, with
one count per batch and peer (so the owner knows which key each row's draws use); the answers to a peer are
the batches' answers one after another, one length per peer. Each batch's blocks are bitwise those of
sampling it alone, with ``K`` times fewer collective rounds.

Bytes (what :func:`predict_hop_bytes` says and :class:`CommStats` counts; the own rank's slots of every
alltoallv count nothing), per hop round of ``K`` batches: sent = ``8 K (P - 1)`` (request counts) + ``8`` per
id requested from another rank + ``8 (P - 1)`` (answer lengths) + ``8 (1 + 2 c)`` per row answered to another
rank (``c`` its kept entries); received alike with the roles swapped. ``K = 1`` is one batch alone.

Collective: :meth:`DistributedSampler.sample` and :meth:`DistributedSampler.sample_many` (every rank, the
same number of hops and batches, in the same order).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.comm import Communicator
from sparse_dist.csr import torch_csr
from sparse_dist.layout import RowLayout
from sparse_dist.log import get_logger
from sparse_dist.owned_rows import kept_per_row, owned_local_rows
from sparse_dist.pull import ID_BYTES, Pull, PullTraffic, predict_pull_bytes
from sparse_dist.splitmix import splitmix64 as _mix, unit_floats

__all__ = ["SAMPLERS", "DistributedSampler", "HopTraffic", "SampledBlock", "predict_hop_bytes", "resolve_sampler",
           "sample_rows", "sampling_key"]
SAMPLERS = ("auto", "numba", "numpy")  # the kernels a run may ask for (module docstring)

_log = get_logger(__name__)
_fallback_said: list[str] = []


def compiled_sampler_problem() -> str | None:
    """Why the compiled (numba) kernel cannot run here, or None (imports it: about a second the first time)."""
    try:
        importlib.import_module("sparse_dist.sampling_compiled")
    except ImportError as exc:  # numba missing, or built for another numpy
        return f"numba is not importable ({exc})"
    return None


def resolve_sampler(name: str) -> str:
    """The kernel ``name`` (one of :data:`SAMPLERS`) runs: ``numba`` or ``numpy``. ``auto`` is ``numba`` where
    it imports, else ``numpy`` (logged once as a warning); ``numba`` where it does not import is a
    ``ValueError`` naming why."""
    if name not in SAMPLERS:
        raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {name!r}")
    if name == "numpy":
        return name
    problem = compiled_sampler_problem()
    if problem is None:
        return "numba"
    if name == "numba":
        raise ValueError(f"--sampler numba: {problem}; install numba or use --sampler numpy")
    if not _fallback_said:
        _fallback_said.append(problem)
        _log.warning("sampling with the numpy reference kernel (%s): correct, but much slower", problem)
    return "numpy"

def sampling_key(seed: int, epoch: int, step: int, layer: int) -> np.ndarray:
    """The 64-bit key (a one-element uint64 array) of one hop's draws."""
    key = np.zeros(1, dtype=np.uint64)
    for part in (seed, epoch, step, layer):
        key = _mix(key ^ np.array([part], dtype=np.uint64))
    return key


def sample_rows(rows: sp.csr_matrix, first_row: int, wanted: np.ndarray, fanout: int | None,
                key: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample the owned rows ``wanted`` (global ids) of ``rows`` (this rank's rows, global column ids).

    Returns per wanted row the number of kept entries, then the kept entries' global column ids and their
    scaled values (float64), rows one after another in ``wanted``'s order. Pure (no communication).

    The numpy reference kernel: :func:`floyd_positions` for every sampled row of the hop at once.
    :func:`sparse_dist.sampling_compiled.sample_rows_compiled` returns the same arrays bitwise, compiled and
    per row; runs use it unless ``--sampler numpy`` (or numba is missing).
    """
    local = owned_local_rows(rows, first_row, wanted)
    starts, ends = rows.indptr[local].astype(np.int64), rows.indptr[local + 1].astype(np.int64)
    degrees = ends - starts
    total = int(degrees.sum())
    owner_of_entry = np.repeat(np.arange(local.size, dtype=np.int64), degrees)
    rank_in_row = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(degrees) - degrees, degrees)
    entry = rank_in_row + np.repeat(starts, degrees)
    columns = rows.indices[entry].astype(np.int64)
    values = rows.data[entry].astype(np.float64)
    if fanout is None or total == 0 or int(degrees.max(initial=0)) <= fanout:
        return degrees, columns, values
    sampled = np.flatnonzero(degrees > fanout)
    positions = floyd_positions(_mix(np.asarray(wanted, dtype=np.int64)[sampled].astype(np.uint64) ^ key),
                                degrees[sampled], fanout)
    keep = np.repeat(degrees <= fanout, degrees)  # rows within the fanout keep every entry
    keep[((np.cumsum(degrees) - degrees)[sampled][:, None] + positions).ravel()] = True
    chosen = np.flatnonzero(keep)  # storage order inside each row
    kept = np.minimum(degrees, fanout)
    scale = np.where(degrees > fanout, degrees / np.maximum(kept, 1), 1.0)
    return kept, columns[chosen], values[chosen] * scale[owner_of_entry[chosen]]


def floyd_positions(node_hash: np.ndarray, degrees: np.ndarray, fanout: int) -> np.ndarray:
    """``fanout`` distinct positions in ``[0, d)`` per row (``d > fanout`` its degree; ``node_hash`` its
    hashed id and key), increasing: Floyd's draw, for ``j = d - k .. d - 1`` a uniform ``t`` in ``[0, j]``
    (``floor(u (j + 1))``, ``u`` the top 53 bits of ``splitmix64(node_hash ^ j)``), or ``j`` itself where
    ``t`` was drawn before: every ``k``-subset equally likely (up to the 2^-53 grain of ``u``), so each entry is
    kept with probability ``k / d``. :mod:`sparse_dist.sampling_compiled` draws the same positions, bitwise."""
    chosen = np.empty((degrees.size, fanout), dtype=np.int64)
    for s in range(fanout):
        j = degrees.astype(np.int64) - fanout + s
        u = unit_floats(_mix(node_hash ^ j.astype(np.uint64)))
        t = np.minimum((u * (j + 1).astype(np.float64)).astype(np.int64), j)
        seen = (chosen[:, :s] == t[:, None]).any(axis=1)
        chosen[:, s] = np.where(seen, j, t)
    chosen.sort(axis=1)
    return chosen


@dataclass
class HopTraffic:
    """One rank's side of one hop: rows it asked each rank for, and entries each answer carried.

    ``asked[q]`` / ``kept_asked[q]``: rows requested from rank ``q`` and the kept entries of each;
    ``answered[q]`` / ``kept_answered[q]``: rows rank ``q`` requested of this rank and their kept entries;
    ``batches``: how many batches the round sampled together (one request count per batch and peer).
    """

    asked: list[int]
    kept_asked: list[int]
    answered: list[int]
    kept_answered: list[int]
    batches: int = 1


def predict_hop_bytes(traffic: HopTraffic, rank: int) -> dict[str, int]:
    """Bytes one hop sends and receives on ``rank`` (the module docstring's rule; the own slot counts nothing):
    a pull of ``batches`` segments whose answers are ``1 + 2 c`` int64 per row."""
    words = [ID_BYTES * (rows + 2 * kept) for rows, kept in zip(traffic.asked, traffic.kept_asked)]
    words_out = [ID_BYTES * (rows + 2 * kept) for rows, kept in zip(traffic.answered, traffic.kept_answered)]
    return predict_pull_bytes(PullTraffic(traffic.asked, traffic.answered, words, words_out, traffic.batches,
                                          ragged=True), rank)


class _BlockProduct(torch.autograd.Function):
    """``A h`` with a sampled block; the backward multiplies by the stored transpose."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx,  # type: ignore[override]
                h: torch.Tensor, matrix: torch.Tensor, transpose: torch.Tensor) -> torch.Tensor:
        ctx.transpose = transpose  # type: ignore[attr-defined]
        return matrix @ h

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,  # type: ignore[override]
                 grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.transpose @ grad.contiguous(), None, None  # type: ignore[attr-defined]


@dataclass
class SampledBlock:
    """One sampled layer on the requesting rank: ``n_dst x n_src`` CSR over global ids ``dst`` / ``src``.

    ``src[:len(dst)] == dst`` (destination nodes first). ``matrix`` holds float64 values with local
    column positions into ``src``.
    """

    dst: np.ndarray
    src: np.ndarray
    matrix: sp.csr_matrix

    def operator(self, dtype: torch.dtype, device: torch.device) -> "BlockOperator":
        return BlockOperator(torch_csr(self.matrix, dtype, device), torch_csr(self.matrix.T.tocsr(), dtype, device))


@dataclass
class BlockOperator:
    """A block's torch CSR and its transpose: ``operator(h) = A h`` (autograd-aware)."""

    matrix: torch.Tensor
    transpose: torch.Tensor

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return _BlockProduct.apply(h.contiguous(), self.matrix, self.transpose)


def assemble_block(dst: np.ndarray, kept: np.ndarray, columns: np.ndarray, values: np.ndarray,
                   block_columns: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None,
                   ) -> SampledBlock:
    """The block whose row ``i`` (global id ``dst[i]``, distinct) holds ``kept[i]`` of the entries
    ``columns``/``values``. ``block_columns(dst, columns)``, where given, computes ``(src, positions)`` (the
    compiled sampler's :class:`sparse_dist.sampling_compiled.BlockColumns`, bitwise the numpy lines
    here)."""
    if block_columns is not None:
        src, positions = block_columns(dst, columns)
    else:
        new = np.setdiff1d(columns, dst)  # sorted, unique
        src = np.concatenate([dst, new]).astype(np.int64)
        sorter = np.argsort(src, kind="stable")
        positions = sorter[np.searchsorted(src, columns, sorter=sorter)]
    indptr = np.concatenate(([0], np.cumsum(kept))).astype(np.int64)
    matrix = sp.csr_matrix((values, positions, indptr), shape=(dst.size, src.size))
    return SampledBlock(np.asarray(dst, dtype=np.int64), src, matrix)


class DistributedSampler:
    """Samples the L hops of a mini-batch over row-owned adjacency (see the module docstring).

    ``rows``: this rank's rows of the normalised adjacency (global column ids); ``fanouts[h]``: hop ``h``
    from the seeds (``fanouts[0]`` builds the LAST layer's block, as PyG's ``NeighborLoader`` and DistDGL
    count), None for "all". ``last_traffic`` keeps the last call's :class:`HopTraffic` per hop and
    ``last_requests`` the ids it asked each rank for per hop (both in layer order).

    ``kernel``: one of :data:`SAMPLERS` (:func:`resolve_sampler`; ``self.kernel`` says which runs); the
    compiled one is compiled (or loaded from numba's cache) here, so no JIT lands in a timed epoch, and runs
    on ``threads`` threads (default: torch's thread count when the sampler is built). Both draw the same
    blocks, bitwise.
    """

    def __init__(self, comm: Communicator, layout: RowLayout, group: int, rows: sp.csr_matrix,
                 fanouts: Sequence[int | None], seed: int, phase: str = "sample", kernel: str = "auto",
                 threads: int | None = None) -> None:
        self.comm, self.layout, self.rows = comm, layout, sp.csr_matrix(rows)
        self.first_row = int(layout.offsets[group])
        owned = int(layout.offsets[group + 1]) - self.first_row
        columns = self.rows.indices
        if self.rows.shape[0] != owned or (columns.size and (int(columns.min()) < 0
                                                             or int(columns.max()) >= layout.n_rows)):
            raise ValueError(f"a sampler's rows must be the {owned} rows its rank owns with column ids in "
                             f"[0, {layout.n_rows}), got {self.rows.shape[0]} rows of {self.rows.shape[1]} columns")
        self.fanouts, self.seed, self.phase = list(fanouts), seed, phase
        self.last_traffic: list[HopTraffic] = []
        self.last_requests: list[list[np.ndarray]] = []
        self.kernel = resolve_sampler(kernel)
        self.threads = threads or torch.get_num_threads()
        self._compiled = self._block_columns = None
        self._reorder_rows = reorder_rows
        if self.kernel == "numba":
            from sparse_dist import sampling_compiled

            sampling_compiled.warm_up(self.rows)
            self._compiled = sampling_compiled.sample_rows_into
            self._block_columns = sampling_compiled.BlockColumns(layout.n_rows)
            self._reorder_rows = sampling_compiled.reorder_rows_compiled

    def sample_rows(self, wanted: np.ndarray, fanout: int | None, key: np.ndarray) -> tuple[
            np.ndarray, np.ndarray, np.ndarray]:
        """:func:`sample_rows` of this rank's rows with this sampler's kernel (pure)."""
        kept = kept_per_row(self.rows, self.first_row, wanted, fanout)
        total = int(kept.sum())
        columns, values = np.empty(total, dtype=np.int64), np.empty(total, dtype=np.float64)
        self._sample_into(wanted, fanout, key, kept, columns, values)
        return kept, columns, values

    def _sample_into(self, wanted: np.ndarray, fanout: int | None, key: np.ndarray, kept: np.ndarray,
                     columns: np.ndarray, values: np.ndarray) -> None:
        """Sample ``wanted`` into ``columns``/``values`` (``kept``: :func:`kept_per_row` of them)."""
        if self._compiled is not None:
            self._compiled(self.rows, self.first_row, wanted, fanout, key, self.threads, kept, columns, values)
            return
        _, columns[:], values[:] = sample_rows(self.rows, self.first_row, wanted, fanout, key)

    def sample(self, seeds: np.ndarray, epoch: int, step: int) -> list[SampledBlock]:
        """Blocks of layers ``0 .. L-1`` for this rank's ``seeds`` (global ids it owns; may be empty). Collective."""
        return self.sample_many([seeds], epoch, [step])[0]

    def sample_many(self, seeds: Sequence[np.ndarray], epoch: int, steps: Sequence[int]) -> list[list[SampledBlock]]:
        """The blocks of ``K = len(steps)`` batches (``seeds[b]`` of step ``steps[b]``) sampled together: ONE
        request round per hop for all of them (DistDGL's and ByteGNN's bulk sampling), so ``K`` times fewer
        collective rounds. Each batch's blocks are bitwise those :meth:`sample` makes alone (a row's draws are
        keyed by its batch's step). ``K`` must be the same on every rank. Collective."""
        frontiers = [np.asarray(s, dtype=np.int64) for s in seeds]
        blocks: list[list[SampledBlock]] = [[] for _ in frontiers]
        traffic: list[HopTraffic] = []
        requests: list[list[np.ndarray]] = []
        layers = len(self.fanouts)
        for hop, fanout in enumerate(self.fanouts):
            keys = [sampling_key(self.seed, epoch, step, layers - 1 - hop) for step in steps]
            hop_blocks, hop_traffic, asked = self._hop(frontiers, fanout, keys)
            for batch, block in zip(blocks, hop_blocks):
                batch.append(block)
            traffic.append(hop_traffic)
            requests.append(asked)
            frontiers = [block.src for block in hop_blocks]
        self.last_traffic, self.last_requests = traffic[::-1], requests[::-1]
        return [batch[::-1] for batch in blocks]

    def _hop(self, frontiers: list[np.ndarray], fanout: int | None,
             keys: list[np.ndarray]) -> tuple[list[SampledBlock], HopTraffic, list[np.ndarray]]:
        """One hop of every batch: one pull whose segments are the batches' frontier rows and whose answers the
        owners sample; returns the blocks, the round's traffic and the ids asked of each rank (concatenated)."""
        pull = Pull(self.comm, self.layout, frontiers, self.phase)
        kept_of = [[kept_per_row(self.rows, self.first_row, rows, fanout) for rows in wanted]
                   for wanted in pull.incoming]  # per peer and batch
        kept_answered = [sum(int(kept.sum()) for kept in per_peer) for per_peer in kept_of]
        lengths = [sum(kept.size for kept in per_peer) + 2 * total for per_peer, total in zip(kept_of, kept_answered)]
        send = np.empty(sum(lengths), dtype=np.int64)  # every answer, written in place: no copy gathers them
        offset = 0
        for wanted, per_peer in zip(pull.incoming, kept_of):  # per peer: its batches' rows, each with its key
            for rows, key, kept in zip(wanted, keys, per_peer):
                n, entries = kept.size, int(kept.sum())
                send[offset:offset + n] = kept
                self._sample_into(rows, fanout, key, kept, send[offset + n:offset + n + entries],
                                  send[offset + n + entries:offset + n + 2 * entries].view(np.float64))
                offset += n + 2 * entries
        replies = pull.packed_answers(send, lengths)
        rows_of: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in frontiers]  # per batch, peer
        kept_asked = []
        for reply, asked in zip(replies, pull.asked):
            offset, kept_total = 0, 0
            for batch, mine in enumerate(asked):
                n = mine.size
                kept = reply[offset:offset + n]
                entries = int(kept.sum())
                columns = reply[offset + n:offset + n + entries]
                values = reply[offset + n + entries:offset + n + 2 * entries].view(np.float64)
                rows_of[batch].append((kept, columns, values))
                offset += n + 2 * entries
                kept_total += entries
            kept_asked.append(kept_total)
        blocks = []
        for batch, (dst, parts) in enumerate(zip(frontiers, rows_of)):
            grouped = parts[0] if len(parts) == 1 else tuple(np.concatenate([part[i] for part in parts])
                                                             for i in range(3))
            order = pull.orders[batch]
            if not np.array_equal(order, np.arange(order.size)):  # rows came grouped by owner: back to dst's order
                inverse = np.empty_like(order)
                inverse[order] = np.arange(order.size)
                grouped = self._reorder_rows(grouped, inverse)
            blocks.append(assemble_block(dst, *grouped, block_columns=self._block_columns))
        traffic = HopTraffic(pull.asked_counts, kept_asked, pull.answered_counts, kept_answered, len(frontiers))
        return blocks, traffic, pull.requests


def reorder_rows(rows: tuple[np.ndarray, np.ndarray, np.ndarray], new_order: np.ndarray) -> tuple[
        np.ndarray, np.ndarray, np.ndarray]:
    """Rows (counts, columns, values) permuted so that row ``new_order[i]`` of the input comes ``i``-th."""
    kept, columns, values = rows
    indptr = np.concatenate(([0], np.cumsum(kept)))
    matrix = sp.csr_matrix((values, columns, indptr), shape=(kept.size, int(columns.max(initial=0)) + 1))
    picked = matrix[new_order]
    # scipy row indexing keeps entry order within rows; it may drop nothing (explicit zeros are kept)
    return np.diff(picked.indptr).astype(np.int64), picked.indices.astype(np.int64), picked.data.astype(np.float64)
