"""Ending a job: :func:`run_or_abort` (one sentence, a non-zero status, never a hang), user errors, the error
every rank raises together, and how several ranks' messages are said once (rank ranges)."""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Callable, Sequence

from sparse_dist.comm.startup import MPI, _initialised
from sparse_dist.log import get_logger

_log = get_logger(__name__)

DISTINCT_MESSAGES_SHOWN = 5
"""How many distinct messages :func:`ranked_messages` lists before it only counts the rest."""


def rank_ranges(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"ranks 0-2, 5, 7-8"``; one rank: ``"rank 3"``."""
    ordered = sorted(set(ranks))
    spans: list[str] = []
    start = previous = ordered[0]
    for rank in ordered[1:] + [None]:  # type: ignore[list-item]
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        spans.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(spans)


def ranked_messages(failed: Sequence[tuple[int, str]], size: int) -> str:
    """One text for the messages ``(rank, message)`` of several ranks: each distinct message once, prefixed with
    the ranks that said it (in order of the lowest such rank), at most :data:`DISTINCT_MESSAGES_SHOWN`, then
    ``and N more distinct messages (ranks ...)``. A job of one rank gets the bare message."""
    if size == 1:
        return "; ".join(message for _, message in failed)
    by_message: dict[str, list[int]] = {}
    for rank, message in failed:
        by_message.setdefault(message, []).append(rank)
    items = sorted(by_message.items(), key=lambda item: min(item[1]))
    shown = [f"{rank_ranges(ranks)}: {message}" for message, ranks in items[:DISTINCT_MESSAGES_SHOWN]]
    rest = items[DISTINCT_MESSAGES_SHOWN:]
    if rest:
        shown.append(f"and {len(rest)} more distinct message{'s' if len(rest) > 1 else ''} "
                     f"({rank_ranges([rank for _, ranks in rest for rank in ranks])})")
    return "; ".join(shown)


def said_once(error: BaseException) -> BaseException:
    """``error`` marked as raised by every rank at the same agreed point, so :func:`run_or_abort` has rank 0 say it
    once and no rank aborts the job; returns it (``raise said_once(SomeError(...))``)."""
    error.every_rank = True  # type: ignore[attr-defined]
    return error


class CollectiveError(RuntimeError):
    """Raised identically on every rank when any rank found a problem."""

def run_or_abort(main: Callable[[], int], *, user_errors: tuple[type[BaseException], ...] = (),
                 debug: bool = False, prog: str = "error",
                 describe: Callable[[BaseException], tuple[str, int] | None] | None = None) -> int:
    """Run ``main``; if it raises on any rank, end the whole job non-zero, never hanging.

    Internal errors: the failing rank writes its traceback, prefixed with its
    rank, to stderr and calls ``MPI_Abort`` on the world communicator, so
    ranks waiting in a collective are killed instead of hanging (the
    semantics of ``python -m mpi4py``). A non-zero ``SystemExit`` (also what
    the command's SIGTERM handler raises) counts as a failure too.

    User errors (instances of ``user_errors``: bad input, named by the
    message) are one line ``PROG: error: MESSAGE`` and exit status 2, with
    no traceback unless ``debug``:

    * raised on every rank at the same point (collective validation, e.g.
      :meth:`Communicator.raise_if_any` on the world, marks the exception with
      a true ``every_rank`` attribute; its message already names the ranks of
      each distinct message): world rank 0 alone writes the line and every
      rank returns 2; no abort is needed, since no rank is left inside a
      collective. An internal error marked ``every_rank`` is likewise written
      once (rank 0, with its traceback) and every rank returns 1;
    * otherwise (possibly this rank alone): this rank writes the line, the
      others write nothing, and the job is aborted with status 2.

    ``describe(exc)`` may turn any other exception into ``(sentence, status)``
    (out of memory, a full disk, an interrupt): the sentence is one line
    ``PROG: error: SENTENCE``, written by this rank, and the job ends with
    ``status``. ``KeyboardInterrupt`` and ``SystemExit`` (signals, which reach
    every rank of a job) are said by world rank 0, and by another rank only if
    rank 0's abort has not ended it within a grace (:func:`_report_sentence`).

    Before ``MPI_Abort`` the aborting rank unlinks the MPICH shared-memory
    segments it has mapped (``/dev/shm/mpich_shm_*``), which MPICH removes
    only in ``MPI_Finalize`` and an aborted job would leave behind.
    """
    try:
        return main()
    except SystemExit as exc:
        if exc.code in (None, 0):
            raise
        code = exc.code if isinstance(exc.code, int) else 1
        described = describe(exc) if describe is not None else None
        if described is not None:
            return _report_sentence(exc, prog, debug, *described)
        _abort_with(f"exit status {exc.code}", code)
    except user_errors as exc:
        return _report_user_error(exc, prog, debug)
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        described = describe(exc) if describe is not None else None
        if described is not None:
            return _report_sentence(exc, prog, debug, *described)
        if getattr(exc, "every_rank", False):
            if _initialised().Get_rank() == 0:
                _write_traceback(exc)
                sys.stderr.flush()
            return 1
        _write_traceback(exc)
        _abort_with(f"{type(exc).__name__}: {exc}", 1)
    return 1


ABORT_GRACE_SECONDS = 0.5
SIGNAL_GRACE_SECONDS = 2.0
USER_ERROR_STATUS = 2
_MPICH_SEGMENT_PREFIX = "/dev/shm/mpich_shm_"


def _write_traceback(exc: BaseException) -> None:
    rank = _initialised().Get_rank()
    details = "".join(traceback.format_exception(exc))
    sys.stderr.write("".join(f"[rank {rank}] {line}\n" for line in details.rstrip().splitlines()))


def _report_user_error(exc: BaseException, prog: str, debug: bool) -> int:
    """One line for a user error (see :func:`run_or_abort`); aborts unless every rank raised it."""
    world_comm = _initialised()
    rank, size = world_comm.Get_rank(), world_comm.Get_size()
    if getattr(exc, "every_rank", False):
        if rank == 0:
            if debug:
                _write_traceback(exc)
            sys.stderr.write(f"{prog}: error: {exc}\n")
            sys.stderr.flush()
        return USER_ERROR_STATUS
    if debug:
        _write_traceback(exc)
    where = f" (rank {rank} of {size}; ending the job)" if size > 1 else ""
    sys.stderr.write(f"{prog}: error: {exc}{where}\n")
    _abort_with(None, USER_ERROR_STATUS)
    return USER_ERROR_STATUS


def _report_sentence(exc: BaseException, prog: str, debug: bool, sentence: str, status: int) -> int:
    """One line for an exception :func:`run_or_abort`'s ``describe`` explained, then end the job with ``status``.

    Signals (``KeyboardInterrupt``, ``SystemExit``) reach every rank of a job, so world rank 0 says them and
    aborts at once; another signalled rank waits :data:`SIGNAL_GRACE_SECONDS` (a little longer the higher its rank)
    for that abort to end it, and says the sentence and aborts itself only if it is still running then (rank 0 may
    be blocked inside a collective this rank left, where it cannot see its own signal). Anything else is said by
    the rank that raised it, with its rank when there are several.
    """
    world_comm = _initialised()
    rank, size = world_comm.Get_rank(), world_comm.Get_size()
    signalled = isinstance(exc, (KeyboardInterrupt, SystemExit))
    if signalled and rank != 0:
        try:
            time.sleep(SIGNAL_GRACE_SECONDS + 0.25 * min(rank, 8))
        except (KeyboardInterrupt, SystemExit):  # a second signal: stop waiting
            pass
    if debug:
        _write_traceback(exc)
    where = f" (rank {rank} of {size}; ending the job)" if size > 1 and not signalled else ""
    sys.stderr.write(f"{prog}: error: {sentence}{where}\n")
    _abort_with(None, status)
    return status


def _abort_with(reason: str | None, code: int) -> None:
    """Write ``reason`` (if any), then end the job: ``MPI_Abort`` when there are other ranks."""
    rank = _initialised().Get_rank()
    if reason is not None:
        sys.stderr.write(f"[rank {rank}] error: {reason}; aborting all ranks\n")
    sys.stderr.flush()
    if MPI.COMM_WORLD.Get_size() > 1:
        unlink_mpich_segments()
        # Let the launcher forward this message before MPI_Abort tears the job down (without the pause an
        # abort from every rank at once sometimes lost all output).
        time.sleep(ABORT_GRACE_SECONDS)
        MPI.COMM_WORLD.Abort(code)
    raise SystemExit(code)


def unlink_mpich_segments() -> None:
    """Unlink the MPICH shared-memory files this process maps; the mappings stay valid until exit.

    Only this job's processes map them, and the job is about to end (aborted, or this rank ended by
    :mod:`runners.termination`), so nothing attaches to them again.
    Segments on other nodes (mapped only by ranks there) are not reached.
    """
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            fields = [line.rstrip("\n").split(maxsplit=5) for line in maps]
    except OSError:
        return
    paths = {f[5] for f in fields if len(f) == 6 and f[5].startswith(_MPICH_SEGMENT_PREFIX)
             and not f[5].endswith("(deleted)")}
    for path in sorted(paths):
        try:
            os.unlink(path)
            _log.debug("removed MPICH shared-memory segment %s before aborting", path)
        except OSError:
            pass
