"""Host staging buffers for exchanges MPI cannot take from device memory (see "Devices" in
:mod:`sparse_dist.comm`)."""

from __future__ import annotations

import threading
from typing import Any

import torch

from sparse_dist.log import get_logger

_log = get_logger(__name__)

FORCE_HOST_STAGING_ENV = "SPARSE_DIST_FORCE_HOST_STAGING"
STAGING_IDLE_LIMIT_BYTES = 1 << 30
"""Idle host staging memory a pool keeps; beyond it the least recently returned buffers are dropped."""


class _Loan:
    """One host staging buffer and the CUDA event of the last copy that reads it (if any)."""

    __slots__ = ("tensor", "key", "copy_done")

    def __init__(self, tensor: torch.Tensor, key: tuple[int, torch.dtype, bool]) -> None:
        self.tensor = tensor
        self.key = key
        self.copy_done: Any = None

    def settle(self) -> None:
        """Wait for a host-to-device copy still reading this buffer."""
        if self.copy_done is not None:
            self.copy_done.synchronize()
            self.copy_done = None


class StagingPool:
    """Host staging buffers allocated once per ``(numel, dtype, pinned)`` and reused.

    A buffer is lent to one exchange at a time (:meth:`acquire`) and comes
    back when that exchange completes (:meth:`release`), so outstanding
    requests never share one. Idle buffers beyond ``idle_limit_bytes`` are
    dropped, least recently returned first, so shapes that change every
    epoch (sampled exchanges) cannot grow the pool without bound.
    ``allocations`` counts buffers ever allocated (for tests and logs).
    """

    def __init__(self, idle_limit_bytes: int = STAGING_IDLE_LIMIT_BYTES) -> None:
        self.idle_limit_bytes = idle_limit_bytes
        self.allocations = 0
        self._idle: list[_Loan] = []
        self._idle_bytes = 0
        self._lock = threading.Lock()

    def acquire(self, numel: int, dtype: torch.dtype, pinned: bool) -> _Loan:
        """A host buffer of ``numel`` elements, exclusively the caller's until :meth:`release`."""
        key = (numel, dtype, pinned)
        loan = None
        with self._lock:
            for index in range(len(self._idle) - 1, -1, -1):
                if self._idle[index].key == key:
                    loan = self._idle.pop(index)
                    self._idle_bytes -= loan.tensor.nbytes
                    break
        if loan is None:
            loan = _Loan(torch.empty(numel, dtype=dtype, pin_memory=pinned), key)
            with self._lock:
                self.allocations += 1
            _log.debug("staging pool: new %s buffer of %d elements (%s)", dtype, numel,
                       "pinned" if pinned else "pageable")
        loan.settle()
        return loan

    def release(self, loan: _Loan) -> None:
        """Return a buffer; drop the oldest idle ones while idle memory exceeds the limit."""
        dropped = []
        with self._lock:
            self._idle.append(loan)
            self._idle_bytes += loan.tensor.nbytes
            while self._idle_bytes > self.idle_limit_bytes and len(self._idle) > 1:
                old = self._idle.pop(0)
                self._idle_bytes -= old.tensor.nbytes
                dropped.append(old)
        for old in dropped:
            old.settle()

    @property
    def idle_buffers(self) -> int:
        return len(self._idle)
