"""sparse_dist.turns: a computation run in slices between the caller's own work, never at the same time."""

from __future__ import annotations

import threading

import pytest

from sparse_dist.turns import TakingTurns, pause_point


def test_turns_alternate_in_order_and_return_the_result() -> None:
    log: list[str] = []

    def work() -> int:
        for piece in range(3):
            log.append(f"helper {piece}")
            pause_point()
        log.append("helper end")
        return 42

    turns = TakingTurns(work)
    assert not turns.running
    turns.advance()
    log.append("caller 0")
    assert turns.running
    turns.advance()
    log.append("caller 1")
    assert turns.finish() == 42 and turns.done and not turns.running
    assert log == ["helper 0", "caller 0", "helper 1", "caller 1", "helper 2", "helper end"]
    turns.advance()  # nothing left: a no-op
    assert log[-1] == "helper end"


def test_pause_point_outside_turns_does_nothing() -> None:
    pause_point()  # the caller's own thread: returns at once


def test_the_two_threads_never_run_together() -> None:
    running = threading.Semaphore(1)  # held by whichever thread runs
    overlaps: list[str] = []

    def work() -> None:
        for _ in range(50):
            if not running.acquire(blocking=False):
                overlaps.append("helper ran while the caller did")
            else:
                running.release()
            pause_point()

    turns = TakingTurns(work)
    for _ in range(60):
        running.acquire()
        running.release()
        turns.advance()
    assert turns.done and not overlaps


def test_an_exception_in_the_helper_is_raised_by_the_call_that_handed_it_the_turn() -> None:
    def work() -> None:
        pause_point()
        raise RuntimeError("rank 0: the evaluation failed")

    turns = TakingTurns(work)
    turns.advance()
    with pytest.raises(RuntimeError, match="the evaluation failed"):
        turns.advance()
    assert turns.done
