"""Taking turns: a computation that runs in slices between the caller's own work, its transfers in flight meanwhile.

Why: an exact evaluation after every epoch is a forward whose exchanges cost as much link time as a training
forward's (over a 1 Gbit/s link, 0.47 s of a 0.7 s evaluation on the 200k synthetic, P = 2), while a sampling
policy's step leaves the link idle. Run in turns beside the next step, the evaluation's transfers travel while
the step computes.

:class:`TakingTurns` runs a function in a helper thread, but never at the same time as the caller: the caller
hands it the turn (:meth:`TakingTurns.advance`) and waits until the helper reaches a :func:`pause_point` (after
posting a transfer and doing the local work beside it: :class:`sparse_dist.partial.PartialSpMM` has one) or ends.
So the two threads never run together, the helper's state needs no locks, and every rank's MPI calls come in
the same order as long as every rank hands over turns at the same points of its own work. The helper's MPI calls
come from another thread, so MPI must give ``MPI_THREAD_MULTIPLE`` (checked by the caller) or
``MPI_THREAD_SERIALIZED``.

An exception in the helper is raised again in the caller by the call that handed it the turn.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

Result = TypeVar("Result")

_current = threading.local()


def pause_point() -> None:
    """Where a computation running in turns hands the turn back (nothing in any other thread)."""
    pause = getattr(_current, "pause", None)
    if pause is not None:
        pause()


class TakingTurns(Generic[Result]):
    """Runs ``work()`` in slices: each :meth:`advance` runs it up to its next :func:`pause_point` (or its end)."""

    def __init__(self, work: Callable[[], Result], name: str = "turns") -> None:
        self._work = work
        self._helper_turn = threading.Semaphore(0)
        self._caller_turn = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False
        self.done = False
        self._result: Result | None = None
        self._error: BaseException | None = None

    def _run(self) -> None:
        _current.pause = self._pause
        try:
            self._result = self._work()
        except BaseException as exc:  # handed to the caller, raised there
            self._error = exc
        finally:
            self.done = True
            self._caller_turn.release()

    def _pause(self) -> None:
        self._caller_turn.release()
        self._helper_turn.acquire()

    @property
    def running(self) -> bool:
        """Started and not yet ended (its transfers may be in flight)."""
        return self._started and not self.done

    def advance(self) -> None:
        """Let the computation run until its next pause point or its end; blocks the caller meanwhile."""
        if self.done:
            return
        if self._started:
            self._helper_turn.release()
        else:
            self._started = True
            self._thread.start()
        self._caller_turn.acquire()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def finish(self) -> Result:
        """Run the computation to its end; its result."""
        while not self.done:
            self.advance()
        self._thread.join()
        return self._result  # type: ignore[return-value]
