"""A static input's boundary rows, fetched once and kept by the receiver (DESIGN section 4).

Layer 0 multiplies ``Â`` by ``dropout(X)``, and ``X`` never changes. Instead of exchanging
``dropout(X) W`` (or ``X``'s rows) every epoch and sending their gradients back, each rank
fetches the rows of ``X`` its own rows reference (its *halo*: ``∪_j B_gj``) once, keeps them
after its own rows, and from then on computes layer 0 alone: it draws the dropout masks of the
halo rows itself (they are decided per global row, so they equal the owner's), multiplies by
the replicated weights, and multiplies by ``Â_ext = [Â_gg | Â_g,halo]``. The weight gradient
of the halo rows is computed by the receiver too, so layer 0 has no backward exchange at all.
The price is memory: ``|halo| x F_0`` values per rank (:meth:`StaticHalo.memory`).

Why fetched at run time and not written into the shards at prepare time: a shard is one part
of the partition, and runs merge adjacent parts into row groups (any ``P`` that divides the
parts), so a halo depends on the run's ``P``; fetching costs one alltoallv of the same bytes.

On the 1.5D grid every replica of a row group fetches (in its replica column) and keeps the
whole halo of its row group, so layer 0 needs no replica allreduce either; its local work is
then repeated on the ``c`` replicas (it is the small product: ``F_0 x F_1`` per row).

Construction is collective over the replica column: one pull (:class:`~sparse_dist.pull.Pull`)
without a count exchange (the boundary counts are agreed already): one alltoallv of row ids (phase
``other``) and one of feature rows (phase ``halo``), in the narrowest dtype that holds them bitwise
(:mod:`sparse_dist.lossless_wire`, where the caller gives one).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.csr import csr_bytes, distinct_ids, entry_rows
from sparse_dist.exchange import ExchangeContext
from sparse_dist.layout import RowLayout
from sparse_dist.lossless_wire import WireRows
from sparse_dist.plans import ExchangePlan
from sparse_dist.pull import Pull


def _column_part(rows: sp.csr_matrix, keep: np.ndarray, new_columns: np.ndarray, width: int) -> sp.csr_matrix:
    """The entries of ``rows`` where ``keep`` (per stored entry), with column ids ``new_columns`` (per entry)."""
    row_of_entry = entry_rows(rows.indptr)
    indptr = np.concatenate(([0], np.cumsum(np.bincount(row_of_entry[keep], minlength=rows.shape[0]))))
    return sp.csr_matrix((rows.data[keep], new_columns[keep], indptr), shape=(rows.shape[0], width))


class StaticHalo:
    """This rank's rows of a static input followed by its halo rows, and ``Â_ext`` over both.

    ``values``: ``(n_g + count) x F``: this rank's own rows (row group ``group``), then the halo rows
    in ascending global id. ``halo_ids``: the halo rows' global ids. :meth:`multiply` is the local
    SpMM of layer 0 (autograd-aware, not collective): ``A_gg`` times the own rows (the plan's own
    block, shared, where the plan holds it) plus ``A_g,halo`` times the halo rows.
    """

    def __init__(self, plan: ExchangePlan, layout: RowLayout, rows: sp.csr_matrix, own_values: torch.Tensor,
                 boundary_counts: np.ndarray, wire: WireRows | None = None) -> None:
        """Fetch the halo rows (collective over ``plan.col_comm``, the ``G`` ranks of one replica column).

        ``rows``: this rank's row group's rows of ``Â`` (global column ids, every column block, also on
        the 1.5D grid); ``own_values``: its rows of the input (``n_g x F``, the dtype and device the
        product uses); ``boundary_counts[i, j] = |B_ij|`` (every pair, the same on every rank, from
        :class:`~sparse_dist.dcsr.DistCSR`); ``wire``: the own rows as they travel where a narrower dtype holds
        them bitwise (:mod:`sparse_dist.lossless_wire`), else ``own_values`` travel.
        """
        self.plan = plan
        group = plan.group
        lo, hi = layout.row_range(group)
        rows = sp.csr_matrix(rows)
        columns = distinct_ids(rows.indices, layout.n_rows).astype(np.int64)
        self.halo_ids = columns[(columns < lo) | (columns >= hi)]
        owners = layout.owner_of(self.halo_ids)
        groups = layout.parts
        others = np.arange(groups) != group
        recv_rows = np.bincount(owners, minlength=groups).astype(np.int64)
        counts = np.asarray(boundary_counts, dtype=np.int64)
        if not np.array_equal(recv_rows, np.where(others, counts[group], 0)):
            raise RuntimeError(f"row group {group}: its halo per owner {recv_rows.tolist()} differs from the "
                               f"boundary counts {counts[group].tolist()}")
        pull = Pull(plan.col_comm, layout, self.halo_ids, "halo", request_phase="other",
                    answered=np.where(others, counts[:, group], 0))  # counts agreed already
        received = pull.rows(own_values) if wire is None else wire.decode(pull.rows(wire.sent))
        self.own_count = hi - lo
        self.count = int(self.halo_ids.size)
        self.values = torch.cat([own_values, received]) if self.count else own_values
        is_own = (rows.indices >= lo) & (rows.indices < hi)
        halo_part = _column_part(rows, ~is_own, np.searchsorted(self.halo_ids, rows.indices), self.count)
        self._halo_scipy = halo_part
        self.halo_block = plan.csr(halo_part)
        if plan.local_block is not None:  # the plan's own block (1D, or the replica that multiplies it)
            self.own_block, self._own_shared = plan.local_block, True
        else:
            own_part = _column_part(rows, is_own, rows.indices.astype(np.int64) - lo, self.own_count)
            self._own_scipy = own_part
            self.own_block, self._own_shared = plan.csr(own_part), False
        self._transposed: dict[str, torch.Tensor] = {}
        self._aggregate: torch.Tensor | None = None

    @property
    def own_values(self) -> torch.Tensor:
        """This rank's own rows (a view of :attr:`values`)."""
        return self.values[: self.own_count]

    def memory(self) -> dict[str, int]:
        """What keeping the halo costs this rank: its rows and bytes, and the bytes of the matrices it adds."""
        row_bytes = self.values.shape[1] * self.values.element_size()
        added = [self.halo_block, *self._transposed.values()] + ([] if self._own_shared else [self.own_block])
        return {"halo_rows": self.count, "halo_bytes": self.count * row_bytes,
                "matrix_bytes": sum(csr_bytes(m) for m in added if m is not self.plan.local_block)}

    def _transpose(self, which: str) -> torch.Tensor:
        if which == "own" and self._own_shared:
            return self.plan.local_transpose()
        if which not in self._transposed:
            matrix = self._halo_scipy if which == "halo" else self._own_scipy
            self._transposed[which] = self.plan.csr(sp.csr_matrix(matrix.T))
        return self._transposed[which]

    def multiply(self, h: torch.Tensor, context: ExchangeContext | None = None) -> torch.Tensor:
        """``Â_ext h`` for ``h`` of shape ``(n_g + count) x F`` (own rows, then halo rows); local, no exchange."""
        return extended_product(h, self.plan, self.own_block, self.halo_block, self._transpose, self.count)

    def aggregate(self) -> torch.Tensor:
        """``Â_ext values`` (``n_g x F``, no gradient): the static input's product, made at the first call and
        kept (as many bytes as the own rows), so that an evaluation's layer 0 is one GEMM of these rows
        instead of a GEMM of own and halo rows and an SpMM (``(Â X) W = Â (X W)`` to rounding). Local."""
        if self._aggregate is None:
            with torch.no_grad():
                self._aggregate = self.multiply(self.values)
        return self._aggregate

    def product(self, h: torch.Tensor, context: ExchangeContext | None = None) -> torch.Tensor:
        """``Â_ext h`` as :meth:`multiply`, but the kept :meth:`aggregate` (no SpMM) where ``h`` is
        :attr:`values` itself, unmasked and without a gradient: the operator of a layer 0 whose input is the
        static input as it is (evaluation, or training without dropout). Local."""
        if h is self.values and not h.requires_grad:
            return self.aggregate()
        return self.multiply(h, context)


def extended_product(h: torch.Tensor, plan: ExchangePlan, own_block: torch.Tensor, far_block: torch.Tensor,
                     transpose: Callable[[str], torch.Tensor], far_rows: int) -> torch.Tensor:
    """``[A_own | A_far] h`` for ``h`` = this rank's own rows then ``far_rows`` rows kept or fetched locally:
    autograd-aware, local (its backward multiplies by ``transpose("own")`` and ``transpose("halo")``)."""
    own_rows = own_block.shape[0]
    if h.dim() != 2 or h.shape[0] != own_rows + far_rows:
        raise ValueError(f"a halo product needs {own_rows + far_rows} rows (own, then halo), "
                         f"got shape {tuple(h.shape)}")
    return _ExtendedProduct.apply(h.contiguous(), plan, own_block, far_block, transpose)


class _ExtendedProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: torch.Tensor, plan: ExchangePlan,  # type: ignore[override]
                own_block: torch.Tensor, far_block: torch.Tensor,
                transpose: Callable[[str], torch.Tensor]) -> torch.Tensor:
        n = own_block.shape[0]
        ctx.plan, ctx.transpose, ctx.own_rows = plan, transpose, n  # type: ignore[attr-defined]
        return plan.products.local_product([(own_block, h[:n]), (far_block, h[n:])], n, h.shape[1])

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,  # type: ignore[override]
                 grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        plan, transpose = ctx.plan, ctx.transpose  # type: ignore[attr-defined]
        grad = grad.contiguous()
        far = transpose("halo")
        products, own_rows = plan.products, ctx.own_rows  # type: ignore[attr-defined]
        own = products.local_product([(transpose("own"), grad)], own_rows, grad.shape[1])
        return torch.cat([own, products.local_product([(far, grad)], far.shape[0], grad.shape[1])]), None, None, None, None


class CachedInput:
    """Layer 0's input under a feature cache (``psc:...,cache=C``): a share of the boundary rows of ``X`` kept,
    the rest fetched in the epochs that sample them (PSC-GCN's inclusion-aware caching, section V).

    The strategy (:class:`~sparse_dist.importance.ImportanceStrategy`) decides, with its probabilities, which
    receive rows this rank keeps: the ``C`` share with the highest inclusion probability ``q`` (a row travels
    in an epoch iff ``u < q``), agreed with their owners at each recomputation; this object holds their
    values and, when the set changes, fetches the rows that enter it (phase ``halo``). In a training epoch
    (:meth:`load`, collective over the column): the rows of ``X`` the epoch's sample needs are the kept ones
    (a hit) and the others, fetched from their owners in one alltoallv (phase ``forward``); layer 0 then
    multiplies, locally, the epoch's sampled ``A_gg`` and remote block (the same sample as every other layer)
    by ``[own rows; needed rows]``, each masked by the receiver with its global row's dropout mask. Cached rows
    are ``X`` itself, which never changes: a hit is never stale. Evaluation and the audit read layer 0
    through the plan, exactly. After :meth:`load`, ``values``, ``halo_ids`` and ``count`` describe the
    epoch's input as :class:`StaticHalo`'s do.
    """

    def __init__(self, plan: ExchangePlan, strategy: Any, own_values: torch.Tensor) -> None:
        self.plan, self.strategy = plan, strategy
        self.own_values, self.own_count = own_values, own_values.shape[0]
        self.recv_global, self.recv_rows, self.send_global, self.send_rows = strategy.receive_rows()
        self._send_local = {i: ids - int(plan.matrix.layout.offsets[plan.group]) for i, ids in self.send_global.items()}
        self.cached = np.zeros(self.recv_global.size, dtype=bool)   # receive rows whose X rows are held
        self.cached_send = {i: np.zeros(ids.size, dtype=bool) for i, ids in self.send_global.items()}
        self.cached_values = own_values.new_empty(0, own_values.shape[1])
        self.version_start: int | None = None
        self.values, self.halo_ids, self.count = own_values, np.empty(0, np.int64), 0
        self.hits = self.needed = 0
        self._epoch: int | None = None
        self._kept = np.zeros(self.recv_global.size, dtype=bool)

    def _alltoallv_rows(self, send: dict[int, np.ndarray], receive: np.ndarray, phase: str) -> torch.Tensor:
        """Send this owner's rows ``send[i]`` (local ids) to each receiver ``i``; returns the rows of the receive
        layout where ``receive``, in layout order (collective over the column)."""
        groups = self.plan.groups
        send_rows = [int(send[i].size) if i in send else 0 for i in range(groups)]
        index = np.concatenate([send[i] for i in range(groups) if i in send] + [np.empty(0, np.int64)])
        starts = np.concatenate(([0], np.cumsum(self.recv_rows)))
        recv_rows = [int(receive[starts[j]:starts[j + 1]].sum()) for j in range(groups)]
        out = self.own_values.new_empty(int(receive.sum()), self.own_values.shape[1])
        rows = self.own_values.index_select(0, torch.from_numpy(index).to(self.own_values.device)).contiguous()
        self.plan.col_comm.alltoallv(rows, send_rows, out, recv_rows, phase=phase)
        return out

    def _refill(self, version: Any) -> None:
        """Make the held rows the agreed cache set of ``version`` (fetching the entering rows; collective)."""
        wanted, wanted_send = version.cached_recv, version.cached_send
        entering = wanted & ~self.cached
        fetched = self._alltoallv_rows({i: self._send_local[i][wanted_send[i] & ~self.cached_send[i]]
                                        for i in self.send_global}, entering, phase="halo")
        values = self.own_values.new_empty(int(wanted.sum()), self.own_values.shape[1])
        position = np.cumsum(wanted) - 1  # receive row -> slot in the new cache
        stay = wanted & self.cached
        old_position = np.cumsum(self.cached) - 1
        values[torch.from_numpy(position[stay])] = self.cached_values[torch.from_numpy(old_position[stay])]
        values[torch.from_numpy(position[entering])] = fetched
        self.cached, self.cached_send, self.cached_values = wanted.copy(), dict(wanted_send), values
        self.version_start = version.start

    def load(self, epoch: int) -> None:
        """Gather the rows of ``X`` that ``epoch``'s sample needs (collective over the column; once per epoch)."""
        strategy = self.strategy
        strategy.prepare(epoch)
        version = strategy.in_force(epoch)
        if self.version_start != version.start:
            self._refill(version)
        me = self.plan.group
        kept = strategy.keep(epoch, me, self.recv_global)
        send = {i: self._send_local[i][strategy.keep(epoch, i, ids) & ~self.cached_send[i]]
                for i, ids in self.send_global.items()}
        fetch = kept & ~self.cached
        fetched = self._alltoallv_rows(send, fetch, phase="forward")
        needed = self.own_values.new_empty(int(kept.sum()), self.own_values.shape[1])
        slot = np.cumsum(kept) - 1
        hit = kept & self.cached
        needed[torch.from_numpy(slot[fetch])] = fetched
        needed[torch.from_numpy(slot[hit])] = self.cached_values[torch.from_numpy((np.cumsum(self.cached) - 1)[hit])]
        self.values = torch.cat([self.own_values, needed])
        self.halo_ids, self.count = self.recv_global[kept], int(kept.sum())
        self.hits, self.needed = int(hit.sum()), int(kept.sum())
        self._epoch, self._kept = epoch, kept

    def multiply(self, h: torch.Tensor, context: ExchangeContext) -> torch.Tensor:
        """Layer 0's sampled ``[A_gg | A_g,needed] h`` for the epoch :meth:`load` prepared (local)."""
        if context.epoch != self._epoch:
            raise RuntimeError(f"the cached input was loaded for epoch {self._epoch}, not {context.epoch}")
        sampled = self.strategy.local_blocks(context)
        own, own_transposed = sampled if sampled is not None else (self.plan.local_block, self.plan.local_transpose())
        far = sp.csr_matrix(self.strategy.sampled_block(context.epoch, self.plan.exact_pairs.remote_matrix,
                                                        self._kept))
        blocks = {"own": own_transposed}

        def transpose(which: str) -> torch.Tensor:
            if which not in blocks:
                blocks[which] = self.plan.csr(sp.csr_matrix(far.T))
            return blocks[which]

        return extended_product(h, self.plan, own, self.plan.csr(far), transpose, self.count)

    def memory(self) -> dict[str, int]:
        """The rows this rank holds for layer 0 besides its own, and their bytes."""
        row_bytes = self.own_values.shape[1] * self.own_values.element_size()
        return {"halo_rows": int(self.cached.sum()), "halo_bytes": int(self.cached.sum()) * row_bytes,
                "matrix_bytes": 0}
