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

Construction is collective over the replica column: one alltoallv of row ids (phase
``other``) and one of feature rows (phase ``halo``).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.exchange import ExchangeContext
from sparse_dist.layout import RowLayout
from sparse_dist.plans import ExchangePlan, csr_bytes


def _column_part(rows: sp.csr_matrix, keep: np.ndarray, new_columns: np.ndarray, width: int) -> sp.csr_matrix:
    """The entries of ``rows`` where ``keep`` (per stored entry), with column ids ``new_columns`` (per entry)."""
    row_of_entry = np.repeat(np.arange(rows.shape[0]), np.diff(rows.indptr))
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
                 boundary_counts: np.ndarray) -> None:
        """Fetch the halo rows (collective over ``plan.col_comm``, the ``G`` ranks of one replica column).

        ``rows``: this rank's row group's rows of ``Â`` (global column ids, every column block, also on
        the 1.5D grid); ``own_values``: its rows of the input (``n_g x F``, the dtype and device the
        product uses); ``boundary_counts[i, j] = |B_ij|`` (every pair, the same on every rank, from
        :class:`~sparse_dist.dcsr.DistCSR`).
        """
        self.plan = plan
        group, device = plan.group, own_values.device
        lo, hi = layout.row_range(group)
        rows = sp.csr_matrix(rows)
        columns = np.unique(rows.indices).astype(np.int64)
        self.halo_ids = columns[(columns < lo) | (columns >= hi)]
        owners = layout.owner_of(self.halo_ids)
        groups = layout.parts
        others = np.arange(groups) != group
        recv_rows = np.bincount(owners, minlength=groups).astype(np.int64)
        counts = np.asarray(boundary_counts, dtype=np.int64)
        if not np.array_equal(recv_rows, np.where(others, counts[group], 0)):
            raise RuntimeError(f"row group {group}: its halo per owner {recv_rows.tolist()} differs from the "
                               f"boundary counts {counts[group].tolist()}")
        send_rows = np.where(others, counts[:, group], 0)
        offsets = np.asarray(layout.offsets, dtype=np.int64)
        asked = torch.empty(int(send_rows.sum()), dtype=torch.int64)
        plan.col_comm.alltoallv(torch.from_numpy(self.halo_ids - offsets[owners]), recv_rows.tolist(), asked,
                                send_rows.tolist(), phase="other")
        received = torch.empty(self.halo_ids.size, own_values.shape[1], dtype=own_values.dtype, device=device)
        plan.col_comm.alltoallv(own_values.index_select(0, asked.to(device)).contiguous(), send_rows.tolist(),
                                received, recv_rows.tolist(), phase="halo")
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
        if h.dim() != 2 or h.shape[0] != self.own_count + self.count:
            raise ValueError(f"a halo product needs {self.own_count + self.count} rows (own, then halo), "
                             f"got shape {tuple(h.shape)}")
        return _HaloProduct.apply(h.contiguous(), self)


class _HaloProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, h: torch.Tensor,  # type: ignore[override]
                halo: StaticHalo) -> torch.Tensor:
        ctx.halo = halo  # type: ignore[attr-defined]
        n = halo.own_count
        return halo.plan.local_product([(halo.own_block, h[:n]), (halo.halo_block, h[n:])], n, h.shape[1])

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx,  # type: ignore[override]
                 grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        halo: StaticHalo = ctx.halo  # type: ignore[attr-defined]
        grad = grad.contiguous()
        own = halo.plan.local_product([(halo._transpose("own"), grad)], halo.own_count, grad.shape[1])
        far = halo.plan.local_product([(halo._transpose("halo"), grad)], halo.count, grad.shape[1])
        return torch.cat([own, far]), None
