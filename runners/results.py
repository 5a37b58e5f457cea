"""Results files: JSON lines streamed by rank 0 to ``NAME.partial``, renamed to ``NAME`` when the run is complete;
what a resumed run keeps of its earlier legs' records; how a results file of ours is recognised."""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


def temporary_beside(path: Path) -> Path:
    """Where a file is written before it is renamed to ``path`` (hidden, unique to this process)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def output_path_problem(path: str | Path, flag: str, what: str, example: str) -> str | None:
    """Why ``path`` cannot become the file ``what`` (named by ``flag``; a typical name ``example``) by a rename
    beside it; None if it can.

    Missing directories on the way are fine (the writers create them); the nearest existing one must be
    a writable directory, and ``path`` itself must not be a directory.
    """
    path = Path(path)
    if path.is_dir():
        return f"{flag} {path}: is a directory; expected the path of {what}, e.g. {path / example}"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{flag} {path}: {ancestor} is not a directory; expected the path of {what} in a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return (f"{flag} {path}: directory {ancestor} is not writable; expected the path of {what} "
                f"in a writable directory")
    return None


def partial_beside(path: Path) -> Path:
    """Where a results file grows while its run is going: ``NAME.partial`` beside ``NAME``."""
    return path.with_name(path.name + ".partial")


RESULTS_START = b'{"type": "config", '
"""How every results file ``train`` writes begins: its ``config`` record, the first line, type first."""


def is_results_file(path: str | Path) -> bool:
    """Whether ``path`` is a results file ``train`` wrote (complete, partial or torn), judged by its first bytes
    (:data:`RESULTS_START`); an empty file holds nothing to lose and counts as one. ``train --out`` replaces
    such a file and refuses any other without ``--overwrite``."""
    with open(path, "rb") as handle:
        start = handle.read(len(RESULTS_START))
    return start in (b"", RESULTS_START)


def foreign_results(path: str | Path, flag: str = "--out") -> str | None:
    """Why ``NAME`` or ``NAME.partial`` of the results file ``path`` may not be replaced (a file that is not a
    results file of ours), or None."""
    for candidate in (Path(path), partial_beside(Path(path))):
        if candidate.is_file() and not is_results_file(candidate):
            return (f"{flag} {path}: {candidate} exists and is not a results file of sparse_dist (its first line "
                    f"is not a config record); pass --overwrite to replace it, or choose another {flag}")
    return None


class EarlierResultsError(ValueError):
    """The results file of a resumed run's earlier legs cannot be continued (damaged, or another run's)."""


@dataclass
class EarlierLegs:
    """What a resumed run keeps of its earlier legs' results file: every record up to the checkpoint's epoch."""

    source: Path  # NAME.partial (a killed leg) or NAME (a leg that completed)
    lines: list[bytes]  # the kept records, byte for byte, each with its newline
    epochs: list[dict[str, Any]]  # the kept epoch records
    legs: int  # how many legs they hold
    torn: bool  # whether a torn last line (a leg killed inside a write) was left out

    @property
    def wall(self) -> float:
        """The run time at the last kept epoch (its ``wall``; 0.0 without one)."""
        return float(self.epochs[-1].get("wall") or 0.0) if self.epochs else 0.0

    def missing(self, epoch: int) -> list[int]:
        """Epochs up to ``epoch`` that no kept record holds."""
        held = {int(record["epoch"]) for record in self.epochs}
        return [number for number in range(1, epoch + 1) if number not in held]


def read_earlier_legs(path: str | Path, epoch: int, identity: dict[str, Any]) -> EarlierLegs | None:
    """The records of the earlier legs of a run resumed at ``epoch`` from the results file ``path``:
    ``NAME.partial`` where a leg was killed, else ``NAME`` where one completed; None where neither holds a
    record. Kept: ``config``, ``environment``, ``setup``, the epochs up to ``epoch`` and the legs that started
    before it; left out: later epochs (the resumed leg writes them again), ``final`` and a torn last line.
    Raises :class:`EarlierResultsError` where a line other than the last is not JSON, the epochs are out of
    order, or the ``config`` record differs from ``identity`` (the fields a checkpoint must agree with)."""
    path = Path(path)
    source = next((p for p in (partial_beside(path), path) if p.is_file() and p.stat().st_size), None)
    if source is None:
        return None
    pieces = source.read_bytes().split(b"\n")
    torn = pieces.pop() != b""  # the last piece follows the last newline: empty unless a write was cut
    hint = (f"move it away, choose another --out, or pass --overwrite to start the results file again at "
            f"epoch {epoch + 1}")
    kept: list[bytes] = []
    epochs: list[dict[str, Any]] = []
    legs = 1
    for number, line in enumerate(pieces, start=1):
        try:
            record = json.loads(line)
            kind = record["type"]
        except (ValueError, TypeError, KeyError):
            raise EarlierResultsError(f"--out {path}: line {number} of {source} is not a record of ours (two runs "
                                      f"wrote it at once?); {hint}") from None
        if number == 1:
            problem = _identity_problem(record, identity)
            if problem:
                raise EarlierResultsError(f"--out {path}: {source} holds the records of another run ({problem}); "
                                          f"resuming would mix two runs in one file, so {hint}")
        if kind == "final" or (kind == "leg" and int(record["start_epoch"]) >= epoch):
            continue
        if kind == "epoch":
            if int(record["epoch"]) > epoch:
                continue
            if epochs and int(record["epoch"]) <= int(epochs[-1]["epoch"]):
                raise EarlierResultsError(f"--out {path}: the epoch records of {source} are out of order at line "
                                          f"{number} (two runs wrote it at once?); {hint}")
            epochs.append(record)
        legs += kind == "leg"
        kept.append(line + b"\n")
    return EarlierLegs(source, kept, epochs, legs, torn) if kept else None


def _identity_problem(config: dict[str, Any], identity: dict[str, Any]) -> str | None:
    """How a results file's first record differs from this run's ``identity``, each field with both values."""
    if config.get("type") != "config":
        return f"its first record is of type {config.get('type')!r}, not config"
    differences = [f"{key} {config[key]!r} there, {value!r} in this run" for key, value in identity.items()
                   if key in config and config[key] != value]
    return "; ".join(differences) or None


class ResultsWriteError(OSError):
    """The results file could not be written (a full disk, a quota, a read-only file system); the message
    says where the records written so far are."""


class ResultsWriter:
    """Streams JSON lines to ``NAME.partial`` as they are written; :meth:`close` renames it to ``NAME``.

    Every record reaches the file when :meth:`write` returns (one whole line per ``write`` system call,
    flushed to the kernel, so it survives a crash of the process, ``kill -9`` or another rank's
    ``MPI_Abort``). A run that ends early leaves ``NAME.partial``: a valid JSON-lines prefix of the run (the
    ``config``, ``environment``, ``setup`` and ``epoch`` records so far) without the ``final`` record, except
    that ``kill -9`` inside a write can leave a torn last line after it (Linux stops a write to a file at a
    page boundary when a fatal signal is pending, and a line of a few KiB often crosses one): readers keep the
    whole lines and leave a torn last one out (:func:`read_earlier_legs`). Only a
    complete run (its ``final`` record written, then :meth:`close`) has ``NAME``, so an existing ``NAME``
    from an earlier run stays until the new run completes, and a reader (``sparse-dist sweep``) never
    mistakes a partial run for a finished one. A new run truncates any ``NAME.partial`` it finds (that of an
    earlier killed run of the same output); a resumed run starts it with the ``carried`` lines of its earlier
    legs (:func:`read_earlier_legs`) instead. One writer per output: ``train`` holds ``NAME.lock``
    (:mod:`runners.output_lock`) while it writes.

    A write that fails (``ENOSPC``, ``EDQUOT``, ``EROFS``, ...) cuts the file back to its last whole line,
    stops writing and keeps the reason in :attr:`error` (one sentence); the command decides when every rank
    learns it (``sparse-dist train``: at the end of that epoch's gather). :meth:`close` raises it.
    """

    def __init__(self, path: str | Path | None, carried: list[bytes] | None = None) -> None:
        self.path = Path(path) if path else None
        self.partial = partial_beside(self.path) if self.path is not None else None
        self.error: str | None = None
        self.records = 0
        self._fd: int | None = None
        self._size = 0
        self._carried = carried or []

    def _open(self) -> None:
        """Start ``NAME.partial``: empty, or (a resumed run) holding the carried lines of the earlier legs,
        written beside it and renamed over it, so that their records are in one whole file at every instant."""
        assert self.partial is not None
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        if not self._carried:
            self._fd = os.open(self.partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            return
        temporary = temporary_beside(self.partial)
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            try:
                _write_all(descriptor, b"".join(self._carried))
                os.fsync(descriptor)
            finally:
                os.close(descriptor)
            os.replace(temporary, self.partial)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
        self._fd = os.open(self.partial, os.O_WRONLY | os.O_APPEND)
        self._size, self.records = sum(len(line) for line in self._carried), len(self._carried)
        self._carried = []

    def write(self, record: dict[str, Any]) -> None:
        """Append one record as one line (no-op without a path, or after a failed write)."""
        if self.partial is None or self.error is not None:
            return
        line = (json.dumps(record) + "\n").encode()
        try:
            if self._fd is None:
                self._open()
            _write_all(self._fd, line)
        except OSError as exc:
            self._fail(exc)
            return
        self._size += len(line)
        self.records += 1

    def _fail(self, exc: OSError) -> None:
        """Keep the file a valid prefix (cut the partly written line off), stop, and remember why."""
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                pass
        kept = (f"the {self.records} record(s) written so far are in {self.partial}" if self.records
                else "no record was written")
        self.error = f"--out {self.path}: cannot write the results file: {exc.strerror or exc}; {kept}"
        self._close_descriptor()

    def _close_descriptor(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None

    def raise_if_failed(self) -> None:
        """Raise :class:`ResultsWriteError` if a write failed."""
        if self.error is not None:
            raise ResultsWriteError(self.error)

    def close(self) -> None:
        """The run is complete: sync ``NAME.partial`` and rename it to ``NAME`` (raises if a write failed)."""
        self.raise_if_failed()
        if self.path is None or self.partial is None:
            return
        try:
            if self._fd is None:  # nothing written: an empty results file (or the carried records alone)
                self._open()
            os.fsync(self._fd)
            self._close_descriptor()
            os.replace(self.partial, self.path)
        except OSError as exc:
            self._fail(exc)
            self.raise_if_failed()
        self.path = self.partial = None


def _write_all(descriptor: int, data: bytes) -> None:
    """``data`` by as many ``write`` calls as it takes (one, for a line of the results file)."""
    view = memoryview(data)
    while view:
        written = os.write(descriptor, view)
        view = view[written:]


def print_report(rank: int, text: str, result: dict[str, Any], as_json: bool) -> None:
    """Rank 0 prints a benchmark's table, then (``--json``) the whole result as the last line."""
    if rank != 0:
        return
    print(text, flush=True)
    if as_json:
        print(json.dumps(result), flush=True)


def spread(values: list[float]) -> dict[str, float]:
    """min / mean / max of one figure over ranks."""
    array = np.asarray(values, dtype=np.float64)
    return {"min": float(array.min()), "mean": float(array.mean()), "max": float(array.max())}


def cpu_seconds() -> dict[str, float]:
    """This process's CPU seconds so far, all its threads (MPI's and the progress thread's included): ``user``
    and ``system``. System time is mostly the kernel's network stack when ranks talk over TCP. Their sum is the
    run time the kernel measured; the split between the two is sampled at timer ticks, so over an interval of a
    few milliseconds one side can read 0 while the other holds it all."""
    usage = resource.getrusage(resource.RUSAGE_SELF)  # microseconds, where os.times() counts 10 ms ticks
    return {"user": usage.ru_utime, "system": usage.ru_stime}


def cpu_since(before: dict[str, float]) -> dict[str, float]:
    """CPU seconds (``user``, ``system``) spent since :func:`cpu_seconds` read ``before``."""
    now = cpu_seconds()
    return {key: now[key] - before[key] for key in now}


def peak_memory_bytes(device: torch.device) -> dict[str, int]:
    """Peak resident set of this process (and peak CUDA allocation when on a GPU)."""
    import torch

    peak = {"rss": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024}
    if device.type == "cuda":
        peak["cuda"] = int(torch.cuda.max_memory_allocated(device))
    return peak


PACKAGE_ROOT = Path(__file__).resolve().parents[1]
"""The directory holding the ``runners``, ``algorithms`` and ``sparse_dist`` packages that run."""


def code_provenance(root: Path = PACKAGE_ROOT) -> dict[str, Any]:
    """Which code ran: the commit of the git checkout ``root`` is the top of, and whether its tracked files
    differed from that commit; both None where ``root`` is no checkout's top (an installed wheel, a copy, git
    missing). A figure's commit then comes from its results file, not from memory."""
    def git(*argv: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *argv], capture_output=True, text=True, timeout=10,
                                  check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    commit = git("rev-parse", "HEAD") if top is not None and Path(top).resolve() == root.resolve() else None
    if commit is None:
        return {"commit": None, "modified": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "modified": None if status is None else bool(status)}


def environment(mpi: dict[str, str], world_size: int, threads: int, ranks_on_node: int,
                writes: bool = True) -> dict[str, Any]:
    """Where a run ran: versions, the code's commit (:func:`code_provenance`, asked of git only where ``writes``:
    the rank that writes the record), MPI library, ranks and threads, the node's CPU count (to spot
    oversubscription: ranks_on_node * threads_per_rank > cpu_count), and the network when ``sparse-dist
    emulate`` ran it (its ``SPARSE_DIST_NETWORK``; absent otherwise), and MPICH's VCIs where
    set (``MPIR_CVAR_CH4_NUM_VCIS``: ``--overlap-evaluation`` asks for 2)."""
    import torch  # here, not at the top: sweep and plot read results files without torch

    from sparse_dist.comm.startup import ENDPOINTS_VARIABLE

    network = os.environ.get("SPARSE_DIST_NETWORK")
    vcis = os.environ.get(ENDPOINTS_VARIABLE)
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
            "platform": platform.platform(), "code": code_provenance() if writes else None, "argv": sys.argv,
            "world_size": world_size,
            "threads_per_rank": threads, "cpu_count": os.cpu_count(), "ranks_on_node": ranks_on_node, **mpi,
            **({"network": json.loads(network)} if network else {}), **({"mpich_vcis": vcis} if vcis else {})}
