"""Byte and time counters per communication phase.

These counters are the ground truth for every communication claim: each
exchange in :mod:`sparse_dist.comm` adds the bytes this rank sent and
received and the seconds it spent blocked in MPI, under one phase name.

Of those seconds, ``wait_seconds`` are the part spent before every partner this rank's part of a non-blocking
exchange depends on had posted it (the partner's lateness, as this rank felt it: load imbalance), measured with
the exchange's herald (see "Waits" in :mod:`sparse_dist.comm`); the rest, ``seconds - wait_seconds``, is the
rank's own exchange time (posting, its device copies, the transfer itself). Blocking metadata gathers
(``allgather_array``, ``allgather_object``) do not split: their wait counts as their own.

Phases: ``forward`` (forward exchange of the SpMM), ``backward`` (its
transpose), ``grad_allreduce`` (weight gradients), ``halo`` (the one-time
exchange of a static input's boundary rows, :mod:`sparse_dist.halo`),
``sample`` (what a sampling policy's owners and receivers agree on, e.g. ``psc``'s probabilities, and
mini-batch neighbour sampling's requests and answers, :mod:`sparse_dist.sampling`), ``fetch`` (mini-batch
feature rows pulled from their owners, :mod:`sparse_dist.fetch`), ``other`` (set-up and metadata).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Iterator

import torch

PHASES: tuple[str, ...] = ("forward", "backward", "grad_allreduce", "halo", "sample", "fetch", "other")


def ring_allreduce_bytes(numel: int, group_size: int, index: int, itemsize: int) -> int:
    """Bytes one rank sends (and receives) in a ring allreduce of ``numel`` elements over ``group_size`` ranks,
    this rank at ``index``: the byte convention of :meth:`sparse_dist.comm.Communicator.allreduce` (chunks as
    ``numpy.array_split``), shared with the analytic model of :mod:`sparse_dist.predict`."""
    if group_size <= 1:
        return 0
    base, extra = divmod(numel, group_size)
    own_chunk = base + (1 if index < extra else 0)
    return 2 * (numel - own_chunk) * itemsize


@dataclass
class PhaseCounter:
    """What one rank moved and how long it spent in MPI in one phase (``seconds``), and of that how long it
    waited for late partners (``wait_seconds``)."""

    bytes_sent: int = 0
    bytes_recv: int = 0
    seconds: float = 0.0
    calls: int = 0
    wait_seconds: float = 0.0


class CommStats:
    """Per-phase counters of one rank; shared by a communicator and its sub-communicators."""

    def __init__(self) -> None:
        self.phases: dict[str, PhaseCounter] = {name: PhaseCounter() for name in PHASES}

    def counter(self, phase: str) -> PhaseCounter:
        """The counter of ``phase``; an unknown phase name is a programming error."""
        try:
            return self.phases[phase]
        except KeyError:
            raise ValueError(f"unknown communication phase {phase!r}; expected one of {PHASES}") from None

    def add_bytes(self, phase: str, sent: int, recv: int) -> None:
        counter = self.counter(phase)
        counter.bytes_sent += int(sent)
        counter.bytes_recv += int(recv)
        counter.calls += 1

    def add_seconds(self, phase: str, seconds: float, waited: float = 0.0) -> None:
        """Book ``seconds`` in MPI under ``phase``, ``waited`` of them (at most ``seconds``) for late partners."""
        counter = self.counter(phase)
        counter.seconds += seconds
        counter.wait_seconds += min(waited, seconds)

    def absorb(self, other: "CommStats") -> None:
        """Add every counter of ``other`` to this one's (a worker communicator's, when it ends)."""
        for name, theirs in other.phases.items():
            mine = self.counter(name)
            for key, value in asdict(theirs).items():
                setattr(mine, key, getattr(mine, key) + value)

    def reset(self) -> None:
        for name in PHASES:
            self.phases[name] = PhaseCounter()

    def snapshot(self) -> dict[str, dict[str, float]]:
        """A plain-dict copy, for results files and differences between two moments."""
        return {name: asdict(counter) for name, counter in self.phases.items()}


class ComputeTimer:
    """Accumulates seconds of local work (e.g. local SpMM) by name.

    On a CUDA device the work is timed with a pair of events on the current
    stream, so measuring never synchronises the device; the events are read
    (and waited for) only when :attr:`seconds` is asked for, at the end of an
    epoch. On the CPU it is wall time.
    """

    def __init__(self) -> None:
        self._seconds: dict[str, float] = {}
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    @contextmanager
    def measure(self, name: str, device: torch.device | None = None) -> Iterator[None]:
        if device is not None and device.type == "cuda":
            stream = torch.cuda.current_stream(device)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record(stream)
            try:
                yield
            finally:
                end.record(stream)
                self._pending.append((name, begin, end))
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - start

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds per name so far (waits for the device work timed with events)."""
        for name, begin, end in self._pending:
            end.synchronize()
            self._seconds[name] = self._seconds.get(name, 0.0) + begin.elapsed_time(end) / 1000.0
        self._pending.clear()
        return self._seconds

    def reset(self) -> None:
        self._seconds.clear()
        self._pending.clear()

    @contextmanager
    def apart(self) -> Iterator["ComputeTimer"]:
        """Book what is measured meanwhile on another timer (yielded), not this one: work that runs inside a
        step but is not the step's (an evaluation run in turns beside it). Reads nothing, so on a CUDA device
        it synchronises nothing."""
        side = ComputeTimer()
        saved = self._seconds, self._pending
        self._seconds, self._pending = side._seconds, side._pending
        try:
            yield side
        finally:
            self._seconds, self._pending = saved
