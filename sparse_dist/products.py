"""Local block products: the timed sparse-times-dense kernels every rank runs on its own blocks.

A plan (:mod:`sparse_dist.plans`) owns its blocks (as scipy and as CSR tensors) and moves bytes;
:class:`BlockProducts` multiplies blocks by dense rows and books the time as ``local_spmm`` in the
operator's :class:`~sparse_dist.accounting.ComputeTimer` (with CUDA events: no device
synchronisation). Local only: nothing here is collective.
"""

from __future__ import annotations

import torch

from sparse_dist.accounting import ComputeTimer


class Output:
    """A product's output rows: the first sparse product writes them (``beta = 0``, no zero fill
    pass over the output), later ones accumulate; :meth:`tensor` zero-fills only if none wrote."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer
        self._written = False

    def add_product(self, a: torch.Tensor, x: torch.Tensor) -> None:
        self._buffer.addmm_(a, x, beta=1.0 if self._written else 0.0)
        self._written = True

    def tensor(self) -> torch.Tensor:
        if not self._written:
            self._buffer.zero_()
            self._written = True
        return self._buffer


class BlockProducts:
    """Timed products of CSR blocks (``rows x n``) by dense rows (``n x width``) in one dtype, on one device."""

    def __init__(self, dtype: torch.dtype, device: torch.device, timer: ComputeTimer) -> None:
        self.dtype, self.device, self.timer = dtype, device, timer

    def output(self, rows: int, width: int) -> Output:
        """Output rows that products then write or add to."""
        return Output(torch.empty(rows, width, dtype=self.dtype, device=self.device))

    def multiply_into(self, out: Output, a: torch.Tensor, x: torch.Tensor) -> None:
        """``out += a @ x`` timed as local SpMM (an empty block costs nothing)."""
        if a._nnz() == 0:
            return
        with self.timer.measure("local_spmm", self.device):
            out.add_product(a, x)

    def product(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``a @ x`` as a new tensor (zeros where ``a`` is empty)."""
        out = self.output(a.shape[0], x.shape[1])
        self.multiply_into(out, a, x)
        return out.tensor()

    def local_product(self, parts: list[tuple[torch.Tensor, torch.Tensor]], rows: int, width: int) -> torch.Tensor:
        """``sum_k a_k @ x_k`` over ``parts`` (CSR ``rows x n_k`` times dense ``n_k x width``)."""
        out = self.output(rows, width)
        for a, x in parts:
            self.multiply_into(out, a, x)
        return out.tensor()

    def zeros(self, rows: int, width: int) -> torch.Tensor:
        return torch.zeros(rows, width, dtype=self.dtype, device=self.device)
