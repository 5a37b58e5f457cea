"""Dropout passes at memory speed on the CPU: a layer's counter-based words made and applied in one compiled pass.

Why: applying a boolean mask with torch on the CPU costs several passes over the activations (the mask
drawn into a byte array, an inverted copy, a masked fill, or a float copy of the mask in a ``mul``):
about 4 ns an entry at one thread, where one pass over memory costs well under 1. The kernels
(:mod:`sparse_dist.dropout_compiled`, numba) make a block of words into a small buffer and read and write
each entry once; what they do to it is one of :mod:`sparse_dist.dropout_modes`.

This module is their driver. :class:`LaneRuns` says where a pass's lanes go (the caller works that out from
the rule: :func:`algorithms.dropout.row_runs`); :func:`apply_runs` cuts a pass into equal shares of lanes, one
for each of the caller's threads, on a thread pool of its own (the words are counter-based, so a share may
start anywhere: every thread works, whatever the number of rows or the width). The kernels release the GIL;
numba's own threading layer is not used, so they never meet the compiled sampler's launches.

Compilation: :func:`ready` imports numba and compiles (or loads from numba's cache, ``cache=True``) the
kernels in a background thread the first time it is asked, seconds the first time on a machine and
about one from the cache, and says False until then, so that no run waits for the compiler: callers
keep NumPy's words (:func:`keep_runs_numpy`) and torch's passes meanwhile, which give the same values.
A full-graph run that knows at set-up that its passes will be compiled loads them there instead
(:func:`load_now`): in the background the load competes with the ranks for the cores (CiteSeer at P = 2
on the 2-core machine, one thread a rank: steps of 0.15 s instead of 0.024 s for the first 44 epochs of a
cold compile, and for two epochs loading from the cache), which slows the first epochs and everything
timed beside them (the guard's bias reference chose its interval from them). ``make venv`` fills numba's
cache once at install.
Callers ask through :func:`worth`, which says no to passes under :data:`MIN_ENTRIES` without asking
:func:`ready`, so that a short run on a small graph (Cora, the tests' graphs) never imports numba at all; a long
one loads them at set-up (:func:`loads_at_set_up`) and then compiles its small passes too.
Where numba cannot be imported, that is said once in the log and the kernels are never ready. Pure (no
communication).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import Callable

import numpy as np

from sparse_dist.dropout_modes import FILL, KEEP, MULTIPLY, RELU_FILL
from sparse_dist.splitmix import stream_words

__all__ = ["FILL", "KEEP", "MIN_ENTRIES", "MIN_LOADED_ENTRIES", "MIN_RUN_LANES", "MULTIPLY", "RELU_FILL", "LaneRuns",
           "apply_mask_threaded", "apply_runs", "keep_runs_numpy", "load_now", "loaded", "loads_at_set_up", "ready",
           "warm_up", "worth"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaneRuns:
    """Where one pass's lanes go (:func:`sparse_dist.dropout_compiled.apply_runs`): ``int64`` arrays, one entry a
    run of consecutive lanes landing in consecutive output positions."""

    lane: np.ndarray    # first global lane of each run (``row * width + column``), any order
    pos: np.ndarray     # first flat position of each run in the output
    length: np.ndarray  # lanes of each run

    @property
    def lanes(self) -> int:
        return int(self.length.sum())

    def shares(self, count: int) -> list["LaneRuns"]:
        """The runs cut into ``count`` pieces of (nearly) equal lanes, in order; a run may be cut anywhere."""
        ends = np.cumsum(self.length)
        starts = ends - self.length
        cuts = np.linspace(0, int(ends[-1]) if ends.size else 0, count + 1).astype(np.int64)
        pieces = []
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
            first, last = int(np.searchsorted(ends, a, "right")), int(np.searchsorted(starts, b, "left"))
            begin = np.maximum(starts[first:last], a) - starts[first:last]
            stop = np.minimum(ends[first:last], b) - starts[first:last]
            pieces.append(LaneRuns(self.lane[first:last] + begin, self.pos[first:last] + begin, stop - begin))
        return pieces


def apply_runs(key: int, runs: LaneRuns, src: np.ndarray, dst: np.ndarray, threshold: int, mode: int,
               threads: int) -> None:
    """:func:`~sparse_dist.dropout_compiled.apply_runs` over ``runs``, cut into equal shares of at least
    :data:`_MIN_SHARE` lanes over ``threads`` threads (the caller's among them). ``key``: the layer's stream key;
    ``src`` and ``dst``: flat arrays every run's positions lie in."""
    kernels = _compiled()
    word = np.uint64(key)
    workers = max(1, min(int(threads), runs.lanes // _MIN_SHARE))
    _spread([lambda share=share: kernels.apply_runs(word, share.lane, share.pos, share.length, src, dst, threshold,
                                                    mode)
             for share in runs.shares(workers)])


def apply_mask_threaded(src: np.ndarray, mask: np.ndarray, dst: np.ndarray, mode: int, threads: int) -> None:
    """``dst[i] = op(src[i], mask[i])`` for a boolean ``mask`` (flat arrays of one size; ``dst`` may be ``src``)
    over ``threads`` threads (the caller's among them), each a contiguous share of at least
    :data:`_MIN_SHARE` entries."""
    kernels = _compiled()
    workers = max(1, min(int(threads), dst.size // _MIN_SHARE))
    bounds = np.linspace(0, dst.size, workers + 1).astype(np.int64).tolist()
    _spread([lambda a=a, b=b: kernels.apply_mask(src[a:b], mask[a:b], dst[a:b], mode)
             for a, b in zip(bounds, bounds[1:])])


_MIN_SHARE = 1 << 16  # entries: below this a thread's hand-off costs more than its share


@lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1), thread_name_prefix="dropout")


def _spread(tasks: list[Callable[[], None]]) -> None:
    """Runs ``tasks``: the first on the calling thread, the others on the pool meanwhile."""
    futures = [_pool().submit(task) for task in tasks[1:]]
    if tasks:
        tasks[0]()
    for future in futures:
        future.result()


def keep_runs_numpy(key: int, runs: LaneRuns, out: np.ndarray, threshold: int) -> None:
    """:data:`KEEP` of every run with NumPy (small masks, and the path until the kernels are ready): long runs
    make their words and compare them in place, short ones (a receiver's scattered rows) make one word a lane at
    once. ``out``: flat boolean array."""
    bound = threshold - (1 << 15)
    long = runs.length >= _LONG_RUN
    for lane, pos, length in zip(runs.lane[long].tolist(), runs.pos[long].tolist(), runs.length[long].tolist()):
        first = lane // 4
        lanes = stream_words(key, np.arange(first, (lane + length + 3) // 4)).view(np.int16)
        np.less(lanes[lane - 4 * first:lane - 4 * first + length], bound, out=out[pos:pos + length])
    firsts, positions, lengths = runs.lane[~long], runs.pos[~long], runs.length[~long]
    ends = np.cumsum(lengths)
    start = 0
    while start < lengths.size:  # a few int64 arrays of the gathered lanes at a time, not of all of them
        before = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + _GATHERED_LANES, "right")))
        _keep_gathered(key, firsts[start:stop], positions[start:stop], lengths[start:stop], out, threshold)
        start = stop


def _keep_gathered(key: int, firsts: np.ndarray, positions: np.ndarray, lengths: np.ndarray, out: np.ndarray,
                   threshold: int) -> None:
    """:data:`KEEP` of short runs, one word a lane at once (six int64 arrays of ``lengths.sum()`` entries)."""
    step = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    lane = np.repeat(firsts, lengths) + step
    words = stream_words(key, lane >> 2)
    values = ((words >> ((lane & 3) * 16).astype(np.uint64)) & np.uint64(0xFFFF)).astype(np.int64)
    out[np.repeat(positions, lengths) + step] = (values ^ 0x8000) < threshold


_LONG_RUN = 1 << 12  # lanes: a run this long is compared in place, shorter ones are gathered
_GATHERED_LANES = 1 << 20
"""Lanes of short runs gathered at once: a process grid's block cuts every row into a run (R-MAT SCALE 20 at
2x2x2, 33.5M lanes in runs of 64), and gathered all at once their int64 arrays took 1.6 GiB beside a 0.13 GiB
mask (measured, ``ru_maxrss``); in pieces of 2^20 lanes they take about 50 MB."""


_warm = threading.Event()
_warming = threading.Lock()
_started = False
_kernels: ModuleType | None = None


def _compiled() -> ModuleType:
    if _kernels is None:
        raise RuntimeError("the compiled dropout kernels are not ready: ask ready() first, or call warm_up()")
    return _kernels


def warm_up() -> None:
    """Import numba and compile (or load from its cache) every kernel for every dtype the callers use; returns
    when done. Raises ImportError where numba is missing."""
    global _kernels
    from sparse_dist import dropout_compiled as kernels

    key = np.uint64(0)
    runs = [np.zeros(1, np.int64), np.zeros(1, np.int64), np.ones(1, np.int64)]
    for dtype in (np.float32, np.float64):
        values = np.zeros(1, dtype)
        kernels.apply_runs(key, *runs, values, values, 1, MULTIPLY)
        kernels.apply_mask(values, np.ones(1, np.bool_), values, MULTIPLY)
    keep = np.zeros(1, np.uint8)
    kernels.apply_runs(key, *runs, keep, keep, 1, KEEP)
    _kernels = kernels
    _warm.set()


MIN_ENTRIES = 1 << 22  # lanes; below, torch's passes cost milliseconds: numba's load would not pay
MIN_RUN_LANES = 1 << 27
"""Lanes of a run's largest pass times its epochs from which set-up loads the kernels although no pass reaches
:data:`MIN_ENTRIES`: NumPy's words cost 3 ns a lane in long runs and 16 ns in a receiver's scattered rows
(Cora-sized passes, one thread: 11.7 ms for 3.9M lanes in one run, 50 ms for 3.1M in rows of 1433), the
compiled pass 0.4-1.6 ms, and the load 0.4-1 s, so from 2^27 lanes (0.4-2.1 s of NumPy's words) the load pays
for itself: Cora at P = 2 over 200 epochs (650M lanes) loads, a 5-epoch run does not."""
MIN_LOADED_ENTRIES = 1 << 12  # lanes; once loaded, a compiled pass beats NumPy's words from here (0.06 ms vs 0.4)


def worth(entries: int) -> bool:
    """Whether a pass over ``entries`` entries should be compiled: from :data:`MIN_ENTRIES` where :func:`ready`
    (which starts the load), and from :data:`MIN_LOADED_ENTRIES` where the kernels are :func:`loaded` already.
    Smaller passes never ask for a load, so a short run on a small graph never loads numba (about a second of
    one core)."""
    if entries >= MIN_ENTRIES:
        return ready()
    return entries >= MIN_LOADED_ENTRIES and loaded()


def loaded() -> bool:
    """Whether the kernels are loaded (asks for nothing: no load starts)."""
    return _warm.is_set()


def loads_at_set_up(largest_pass: int, epochs: int) -> bool:
    """Whether a CPU run whose largest dropout pass has ``largest_pass`` lanes over ``epochs`` epochs loads the
    kernels at set-up: a pass reaches :data:`MIN_ENTRIES`, or the passes together :data:`MIN_RUN_LANES`."""
    return largest_pass >= MIN_ENTRIES or largest_pass * max(epochs, 1) >= MIN_RUN_LANES


def load_now() -> float | None:
    """Load (or compile) the kernels in the calling thread; the seconds it took, 0 where they were loaded
    already, None where they are not loaded now (numba unavailable, said once in the log, or a background load
    already under way: torch's and NumPy's passes meanwhile, with the same values). Not collective."""
    global _started
    with _warming:
        if _warm.is_set() or _started:
            return 0.0 if _warm.is_set() else None
        _started = True
    start = time.perf_counter()
    return time.perf_counter() - start if _warm_up_logged() else None


def ready() -> bool:
    """Whether the kernels can run now. The first call starts :func:`warm_up` in a background thread and says
    False until it is done (the module docstring)."""
    global _started
    if _warm.is_set():
        return True
    with _warming:
        if not _started:
            _started = True
            threading.Thread(target=_warm_up_logged, name="dropout-compile", daemon=True).start()
    return False


def _warm_up_logged() -> bool:
    try:
        warm_up()
    except Exception:  # numba missing or failing: torch's and NumPy's passes stay, with the same values
        _log.warning("the compiled dropout kernels are unavailable; dropout keeps torch's passes", exc_info=True)
        return False
    return True
