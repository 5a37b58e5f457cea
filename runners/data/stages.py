"""Stages of a long single-process command (``prepare``): time and memory per stage, and a heartbeat.

``Stages.stage(name)`` times a block of work and measures the resident set size during it. Its peak is exact:
the kernel's high-water mark (``VmHWM``) is reset to the current RSS when the stage starts (writing ``5`` to
``/proc/self/clear_refs``) and read when it ends; the process's own peak, which that reset forgets, is
kept by :class:`Stages` (the largest of the mark before the first stage and every stage's peak). Where the
reset is refused (an old kernel, a restricted ``/proc``), a sampling thread's largest reading of
``/proc/self/statm`` every :data:`SAMPLE_SECONDS` stands in, which can miss a spike shorter than that. A
stage that runs longer than ``heartbeat`` seconds and says nothing itself (METIS is one C call; ctypes
releases the GIL, so the thread still runs) gets a self-overwriting line on stderr with its elapsed time and
RSS. :meth:`Stages.table` gives one line per stage for the command's report.

Linux only (``/proc``); elsewhere the figures are left out and the times remain.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Iterator

SAMPLE_SECONDS = 0.05
"""Period of the RSS sampling thread."""
HEARTBEAT_SECONDS = 5.0
"""A stage silent this long gets an elapsed-time-and-RSS line on stderr, renewed as often."""
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def progress_line(label: str, done: int, total: int, started: float) -> None:
    """One self-overwriting progress line on stderr (the command's, not the library's): ``done`` of ``total``."""
    elapsed = time.perf_counter() - started
    end = "\n" if done == total else ""
    sys.stderr.write(f"\r{label}: {done}/{total} ({100 * done / max(total, 1):.0f}%, {elapsed:.0f} s)" + end)
    sys.stderr.flush()


def current_rss() -> int | None:
    """This process's resident set size in bytes (``/proc/self/statm``), or None where it cannot be read."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def reset_peak_rss() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (Linux >= 4.0); False where that is refused."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int | None:
    """The process's peak resident set size so far (``VmHWM``, bytes), or None."""
    try:
        with open("/proc/self/status", "rb") as handle:
            for line in handle:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / (1 << 30):.2f}"


@dataclass
class StageRecord:
    """One finished stage: wall seconds, RSS at its start and end, its peak, and the process peak after it."""

    name: str
    seconds: float
    rss_start: int | None
    rss_end: int | None
    peak: int | None
    process_peak: int | None


class Stages:
    """Times and memory of a command's stages (module docstring); ``label`` prefixes the heartbeat lines."""

    def __init__(self, label: str = "prepare", heartbeat: float | None = HEARTBEAT_SECONDS) -> None:
        self.label = label
        self.heartbeat = heartbeat
        self.records: list[StageRecord] = []
        self.started = time.perf_counter()
        self.process_peak = peak_rss()  # the process's peak; VmHWM forgets it when a stage resets the mark

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time and measure the body as stage ``name`` (not re-entrant: stages follow one another)."""
        self._note_peak(peak_rss())
        exact = reset_peak_rss()
        start_rss = current_rss()
        sampled = [start_rss or 0]
        stop = threading.Event()
        began = time.perf_counter()
        shown = [False]

        def sample() -> None:
            last = began
            while not stop.wait(SAMPLE_SECONDS):
                rss = current_rss()
                if rss is not None:
                    sampled[0] = max(sampled[0], rss)
                now = time.perf_counter()
                if self.heartbeat is not None and now - began > self.heartbeat and now - last >= self.heartbeat:
                    last = now
                    shown[0] = True
                    sys.stderr.write(f"\r{self.label}: {name}: {now - began:.0f} s, RSS {gib(rss)} GiB   ")
                    sys.stderr.flush()

        thread = threading.Thread(target=sample, name=f"stage-{name}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            if shown[0]:
                sys.stderr.write("\n")
            end_mark = peak_rss()
            peak = end_mark if exact and end_mark is not None else (sampled[0] or None)
            self._note_peak(peak)
            self.records.append(StageRecord(name, time.perf_counter() - began, start_rss, current_rss(), peak,
                                            self.process_peak))

    def _final_peak(self) -> int | None:
        self._note_peak(peak_rss())
        return self.process_peak

    def _note_peak(self, value: int | None) -> None:
        if value is not None:
            self.process_peak = max(self.process_peak or 0, value)

    def table(self) -> list[str]:
        """One line per stage: seconds, RSS at start and end, peak in the stage, process peak after it (GiB)."""
        lines = [f"{'stage':<22}{'seconds':>9}{'RSS start':>11}{'RSS end':>9}{'peak':>8}{'process peak':>14}"]
        for record in self.records:
            lines.append(f"{record.name:<22}{record.seconds:>9.1f}{gib(record.rss_start):>11}{gib(record.rss_end):>9}"
                         f"{gib(record.peak):>8}{gib(record.process_peak):>14}")
        lines.append(f"{'total':<22}{time.perf_counter() - self.started:>9.1f}{'':>28}"
                     f"{gib(self._final_peak()):>14}")
        return lines


class NoStages:
    """A :class:`Stages` that measures nothing (library callers that do not report stages)."""

    records: list[StageRecord] = []

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:  # noqa: ARG002
        yield
