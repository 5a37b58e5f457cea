"""Posted non-blocking exchanges (:class:`Pending`) and the process-wide FIFO of deferred starts (see
"Deferred starts" in :mod:`sparse_dist.comm`)."""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

from sparse_dist.accounting import CommStats
from sparse_dist.comm.staging import StagingPool, _Loan
from sparse_dist.comm.startup import MPI

_deferred: collections.deque["Pending"] = collections.deque()
_deferred_lock = threading.RLock()


def _start_deferred() -> None:
    """Start every deferred exchange of this process, oldest first (post order, the same on every rank)."""
    with _deferred_lock:
        while _deferred:
            _deferred.popleft()._start()


class Pending:
    """A posted non-blocking exchange; :meth:`wait` (or a true :meth:`test`) completes it and books its time.

    A staged exchange may not be started in MPI yet (see "Deferred starts"
    in :mod:`sparse_dist.comm`); ``wait`` and ``test`` first start it and every
    exchange posted before it. Its herald (:mod:`sparse_dist.comm.heralds`), where it has one, starts right
    before it; :meth:`wait` waits for the herald first and books that part as waiting for late partners.
    """

    def __init__(self, stats: CommStats, phase: str) -> None:
        self._stats = stats
        self._phase = phase
        self._starts: list[Callable[[], Any]] = []
        self._requests: list[Any] = []
        self._ready: list[Any] = []       # CUDA events MPI must wait for before it starts
        self._finishers: list[Callable[[], None]] = []
        self._keep_alive: list[Any] = []
        self._loans: list[tuple[StagingPool, _Loan]] = []
        self._herald_start: Callable[[], Any] | None = None  # kept (it holds the herald's buffers) until complete
        self._herald: Any = None                             # the herald's request while it is outstanding
        self._staged = False
        self._started = False
        self._done = False
        self._seconds = 0.0
        self._waited = 0.0

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        begin = time.perf_counter()
        for event in self._ready:
            event.synchronize()
        self._ready.clear()
        if self._herald_start is not None:  # after the device copies: posted means ready to send
            self._herald = self._herald_start()
        self._requests = [start() for start in self._starts]
        self._starts.clear()
        self._seconds += time.perf_counter() - begin

    def test(self) -> bool:
        """True (and completed) if the exchange has finished; never blocks on it."""
        if self._done:
            return True
        _start_deferred()
        begin = time.perf_counter()
        if self._herald is not None and self._herald.Test():
            self._herald = None  # the partners posted while this rank was busy: no wait
        finished = self._herald is None and bool(MPI.Request.Testall(self._requests))
        self._seconds += time.perf_counter() - begin
        if finished:
            self._complete()
        return finished

    def wait(self) -> None:
        """Block until the exchange has finished; received data is then in the caller's tensors."""
        if self._done:
            return
        _start_deferred()
        begin = time.perf_counter()
        if self._herald is not None:
            self._herald.Wait()  # MPI moves the exchange on meanwhile, from the partners that have posted
            self._herald = None
            self._waited += time.perf_counter() - begin
        MPI.Request.Waitall(self._requests)
        self._seconds += time.perf_counter() - begin
        self._complete()

    def _complete(self) -> None:
        begin = time.perf_counter()
        for finish in self._finishers:
            finish()
        for pool, loan in self._loans:
            pool.release(loan)
        self._stats.add_seconds(self._phase, self._seconds + time.perf_counter() - begin, self._waited)
        self._done = True
        self._herald_start = None
        self._finishers.clear()
        self._loans.clear()
        self._keep_alive.clear()
