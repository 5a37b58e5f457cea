"""Checkpoint sets: a run's checkpoint is a SET of files that becomes current all at once.

On disk, for ``--checkpoint DIR/NAME`` (e.g. ``run.ckpt``)::

    DIR/NAME                         the pointer: names the current set (small; replaced by one rename)
    DIR/NAME.e000042.3fa9c2d1/       a set: the state after epoch 42, written by the run of token 3fa9c2d1
        main.ckpt                    weights, Adam state, epoch, RNG state, fingerprint (rank 0 writes it)
        rank00000.ckpt ...           per-rank policy state (caches, pipelined flights, feedback residuals),
                                     one per rank, only where the run keeps such state

Every file, the pointer included, is one header line ``SPARSE_DIST_CHECKPOINT 1 <sha256>\\n`` followed by
the ``torch.save`` payload; a reader refuses a file whose header or digest does not match. The pointer
also holds each set file's SHA-256, where the set was written (world size, replication, plan) and its
epoch, so the files of a set are checked to belong together and a resume at another ``P`` knows before
reading them that the per-rank files do not fit.

Writing a set (:meth:`SetWriter.commit`, collective):

1. every rank writes its file(s) into the new set directory (temporary name, fsync, rename, fsync);
2. every rank passes one allgather (the barrier) with its digests or its error; on any error every rank
   raises the same :class:`CheckpointError` and the pointer stays where it was;
3. rank 0 writes the pointer to ``.NAME.tmp-PID``, fsyncs it, renames it over ``NAME`` (the commit
   point) and fsyncs ``DIR``;
4. only then rank 0 removes every other set of this checkpoint (the previous one included).

So a kill at any instant leaves the pointer naming a complete set: the previous one until step 3's
rename, the new one from then on. Leftovers (sets the pointer does not name, pointer temporaries,
temporaries inside sets) are removed by rank 0 after every commit and when a run with this
``--checkpoint`` starts (:func:`remove_leftovers`). Only names of exactly these patterns are touched,
and a set directory is removed only once nothing else is in it: what the project did not write stays.
Every rank must see ``DIR`` (a shared filesystem, as for the dataset).

Before checkpoint sets, ``NAME`` itself held the weights (with ``NAME.rankNNNNN`` beside it); such a file
is refused with one sentence (it would be cheap to read, but not to clean up after safely).

Test hook (tests only): ``SPARSE_DIST_CHECKPOINT_KILL=POINT:RANK:N`` makes rank ``RANK`` kill itself with
SIGKILL at ``POINT`` (one of :data:`KILL_POINTS`) of its ``N``-th commit (1-based).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import secrets
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from sparse_dist.comm import ranked_messages, said_once
from sparse_dist.compress import Codec
from sparse_dist.log import get_logger

if TYPE_CHECKING:
    from sparse_dist.comm import Communicator

MAGIC = b"SPARSE_DIST_CHECKPOINT"
VERSION = 1
POINTER_KIND = "sparse_dist checkpoint set"
MAIN_FILE = "main.ckpt"
KILL_ENV = "SPARSE_DIST_CHECKPOINT_KILL"
_DIGEST = re.compile(rb"[0-9a-f]{64}")
KILL_POINTS = ("begin", "partial", "written", "agreed", "pointer-temp", "current", "cleaning")
"""Where the test hook may kill a rank: after the set directory exists; halfway through writing this rank's
file; after its files are written (before the barrier); after the barrier; (rank 0) with the pointer's
temporary written but not renamed; after the rename; after removing the first file of an old set."""

_log = get_logger(__name__)


class CheckpointError(ValueError):
    """A checkpoint that is damaged, of another format, or of another run."""


def rank_file(rank: int) -> str:
    """Name of a rank's policy-state file inside a set."""
    return f"rank{rank:05d}.ckpt"


def _encode(state: dict[str, Any]) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    digest = hashlib.sha256(payload).hexdigest()
    return b"%s %d %s\n" % (MAGIC, VERSION, digest.encode()) + payload, digest


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _write_atomically(path: Path, data: bytes, *, die_halfway: bool = False, die_before_rename: bool = False) -> None:
    """``data`` to ``.NAME.tmp-PID`` beside ``path`` (fsync), renamed to ``path``; the temporary is removed on
    any exception. The ``die_*`` flags are the test hook's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(temporary, "wb") as handle:
            if die_halfway:
                handle.write(data[:len(data) // 2])
                handle.flush()
                os.fsync(handle.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if die_before_rename:
            os.kill(os.getpid(), signal.SIGKILL)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> str:
    """Write one verified file atomically; returns the SHA-256 of its payload (hex)."""
    data, digest = _encode(state)
    _write_atomically(Path(path), data)
    return digest


def read_checkpoint(path: str | Path) -> tuple[dict[str, Any], str]:
    """One verified file's state and the SHA-256 of its payload (refused if its header or digest is wrong)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no checkpoint file")
    data = path.read_bytes()
    header, _, payload = data.partition(b"\n")
    fields = header.split(b" ")
    if len(fields) != 3 or fields[0] != MAGIC:
        raise CheckpointError(f"{path}: not a sparse_dist checkpoint (header {header[:40]!r})")
    if fields[1] != str(VERSION).encode():  # header bytes are shown as bytes: a damaged one need not be UTF-8
        raise CheckpointError(f"{path}: checkpoint format {fields[1][:20]!r}, expected {VERSION}")
    if not _DIGEST.fullmatch(fields[2]):
        raise CheckpointError(f"{path}: damaged checkpoint header: its checksum field {fields[2][:80]!r} is not "
                              f"a SHA-256")
    digest = hashlib.sha256(payload).hexdigest()
    if digest.encode() != fields[2]:
        raise CheckpointError(f"{path}: checksum mismatch (file damaged): sha256 {digest[:16]}..., "
                              f"header says {fields[2].decode()[:16]}...")
    try:
        return torch.load(io.BytesIO(payload), weights_only=True), digest
    except Exception as exc:  # noqa: BLE001 - refused types (pickle.UnpicklingError), a damaged archive, ...
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        reason = next((line for line in lines if "unsupported" in line.lower()), lines[0])  # torch: the refused type
        reason = reason.split(". ")[0].rstrip(".")
        raise CheckpointError(f"{path}: refused: not a checkpoint this version can read safely ({reason})") from None


def is_checkpoint_file(path: str | Path) -> bool:
    """Whether ``path`` is a file this module wrote (a pointer, a set file, or the single-file format before
    sets), judged by its first bytes only (damaged or not): ``train --checkpoint`` replaces such a file and
    refuses any other (:func:`runners.train_cmd.main`, without ``--overwrite``). An empty file holds nothing to
    lose and counts as one."""
    with open(path, "rb") as handle:
        start = handle.read(len(MAGIC) + 1)
    return start in (b"", MAGIC + b" ")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """One verified file's state."""
    return read_checkpoint(path)[0]


# ------------------------------------------------------------------ sets
def _set_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"{re.escape(name)}\.e\d{{6,}}\.[0-9a-f]{{8}}")


_SET_FILE = re.compile(r"(main|rank\d{5})\.ckpt")
_SET_TEMPORARY = re.compile(r"\.(main|rank\d{5})\.ckpt\.tmp-\d+")


@dataclass(frozen=True)
class CheckpointSet:
    """The current set of a checkpoint, as its pointer names it."""

    pointer: Path
    directory: Path
    epoch: int
    world_size: int
    replication: int
    plan: str
    files: dict[str, str]  # file name in the set -> SHA-256 of its payload

    @property
    def has_rank_files(self) -> bool:
        return any(name != MAIN_FILE for name in self.files)

    def written_at(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "replication": self.replication, "plan": self.plan}

    def load(self, name: str) -> dict[str, Any]:
        """A file of the set, verified against its own header and the digest the pointer holds for it."""
        if name not in self.files:
            raise CheckpointError(f"{self.pointer}: its set {self.directory.name} has no {name}")
        if not self.directory.is_dir():
            raise CheckpointError(f"{self.pointer}: names the set {self.directory}, which is missing")
        state, digest = read_checkpoint(self.directory / name)
        if digest != self.files[name]:
            raise CheckpointError(f"{self.directory / name}: not the file the pointer {self.pointer} names "
                                  f"(sha256 {digest[:16]}..., the pointer says {self.files[name][:16]}...)")
        return state


def read_pointer(path: str | Path) -> CheckpointSet:
    """The set the pointer ``path`` names (refused: damaged, not a pointer, old single-file format)."""
    path = Path(path)
    state = load_checkpoint(path)
    if "model" in state and "kind" not in state:
        raise CheckpointError(f"{path}: a checkpoint of the single-file format written before checkpoint sets; "
                              f"this version cannot resume it (start the run again, or finish it with the "
                              f"version that wrote it)")
    name = state.get("set")
    if state.get("kind") != POINTER_KIND or not isinstance(name, str) or not _set_pattern(path.name).fullmatch(name):
        raise CheckpointError(f"{path}: not a sparse_dist checkpoint pointer")
    try:
        files = {str(key): str(value) for key, value in dict(state["files"]).items()}
        found = CheckpointSet(path, path.parent / name, int(state["epoch"]), int(state["world_size"]),
                              int(state["replication"]), str(state["plan"]), files)
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{path}: not a sparse_dist checkpoint pointer (fields missing)") from None
    if MAIN_FILE not in files or not all(_SET_FILE.fullmatch(key) for key in files):
        raise CheckpointError(f"{path}: not a sparse_dist checkpoint pointer (files {sorted(files)})")
    return found


def remove_leftovers(path: str | Path, keep: str | None, *, sets: bool = True) -> list[str]:
    """Remove what earlier runs of checkpoint ``path`` left unfinished: pointer temporaries, and (``sets``)
    every set but ``keep`` (the current one). Local (rank 0); only this module's names are touched, and a set
    directory holding anything else is left (logged). Returns the names removed."""
    path = Path(path)
    parent, removed = path.parent, []
    if not parent.is_dir():
        return removed
    set_names, temporary = _set_pattern(path.name), re.compile(rf"\.{re.escape(path.name)}(\.rank\d{{5}})?\.tmp-\d+")
    for entry in sorted(parent.iterdir()):
        try:
            if entry.is_file() and not entry.is_symlink() and temporary.fullmatch(entry.name):
                entry.unlink()
                removed.append(entry.name)
            elif (sets and entry.is_dir() and not entry.is_symlink() and set_names.fullmatch(entry.name)
                  and entry.name != keep):
                _remove_set(entry)
                removed.append(entry.name)
        except OSError as exc:
            _log.warning("checkpoint: could not remove %s (%s); it is left", entry, exc.strerror or exc)
    return removed


_DIE_AFTER_FIRST_REMOVAL = {"armed": False}


def _remove_set(directory: Path) -> None:
    """Remove a set's own files (and temporaries), then the directory if nothing else is in it."""
    for entry in sorted(directory.iterdir()):
        if entry.is_file() and not entry.is_symlink() and (_SET_FILE.fullmatch(entry.name)
                                                            or _SET_TEMPORARY.fullmatch(entry.name)):
            entry.unlink()
            if _DIE_AFTER_FIRST_REMOVAL["armed"]:
                os.kill(os.getpid(), signal.SIGKILL)
    directory.rmdir()  # OSError (not empty) when something else is in it: the caller logs and leaves it


def _raise_gathered(errors: list[str | None]) -> None:
    """Raise the :class:`CheckpointError` that ``errors`` (one per rank, gathered) make, if any, said once (every
    rank raises it). A message every rank gave is said alone; distinct ones once each with the ranks that gave
    them (:func:`sparse_dist.comm.ranked_messages`)."""
    failed = [(rank, message) for rank, message in enumerate(errors) if message is not None]
    if not failed:
        return
    messages = {message for _, message in failed}
    text = failed[0][1] if len(failed) == len(errors) and len(messages) == 1 else ranked_messages(failed, len(errors))
    raise said_once(CheckpointError(text))


def agree(comm: Communicator, error: str | None) -> None:
    """Collective: if any rank passes an error, every rank raises the same :class:`CheckpointError`."""
    _raise_gathered(comm.allgather_object(error))


def _kill_plan(rank: int) -> tuple[str, int] | None:
    """The test hook's (point, commit number) for this rank, or None."""
    text = os.environ.get(KILL_ENV)
    if not text:
        return None
    point, target, commit = text.split(":")
    if point not in KILL_POINTS:
        raise ValueError(f"{KILL_ENV}: point must be one of {KILL_POINTS}, got {point!r}")
    return (point, int(commit)) if int(target) == rank else None


class SetWriter:
    """Writes a checkpoint's sets and makes each current at once (see the module docstring); collective."""

    def __init__(self, comm: Communicator, path: str | Path, *, replication: int, plan: str) -> None:
        self.comm, self.path = comm, Path(path)
        self.replication, self.plan = replication, plan
        self.token = comm.allgather_object(secrets.token_hex(4) if comm.rank == 0 else None)[0]
        self.commits = 0
        self._kill = _kill_plan(comm.rank)

    def _dies_at(self, point: str) -> bool:
        return self._kill is not None and self._kill == (point, self.commits)

    def _die_if(self, point: str) -> None:
        if self._dies_at(point):
            os.kill(os.getpid(), signal.SIGKILL)

    def commit(self, epoch: int, main_state: dict[str, Any] | None, rank_state: dict[str, Any] | None) -> None:
        """Write this rank's files of the set of ``epoch`` (rank 0: ``main_state``; every rank its
        ``rank_state`` where the run keeps one), then make the set current. Collective."""
        self.commits += 1
        directory = self.path.parent / f"{self.path.name}.e{epoch:06d}.{self.token}"
        digests: dict[str, str] = {}
        error = None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._die_if("begin")
            for name, state in ((MAIN_FILE, main_state), (rank_file(self.comm.rank), rank_state)):
                if state is not None:
                    data, digests[name] = _encode(state)
                    _write_atomically(directory / name, data, die_halfway=self._dies_at("partial"))
        except OSError as exc:
            error = f"--checkpoint {self.path}: cannot write the set {directory.name}: {exc.strerror or exc}"
        self._die_if("written")
        gathered = self.comm.allgather_object((digests, error))  # the barrier: every rank has written its files
        _raise_gathered([e for _, e in gathered])  # any rank's failure: the pointer stays where it was
        self._die_if("agreed")
        error = None
        if self.comm.rank == 0:
            files = {name: digest for rank_digests, _ in gathered for name, digest in rank_digests.items()}
            pointer = {"kind": POINTER_KIND, "set": directory.name, "epoch": epoch, "world_size": self.comm.size,
                       "replication": self.replication, "plan": self.plan, "files": files}
            try:
                _write_atomically(self.path, _encode(pointer)[0], die_before_rename=self._dies_at("pointer-temp"))
            except OSError as exc:
                error = f"--checkpoint {self.path}: cannot write the pointer: {exc.strerror or exc}"
            else:
                self._die_if("current")
                _DIE_AFTER_FIRST_REMOVAL["armed"] = self._dies_at("cleaning")
                remove_leftovers(self.path, keep=directory.name)
        agree(self.comm, error if self.comm.rank == 0 else None)


def checkpoint_mismatch(state: dict[str, Any], fingerprint: dict[str, Any], graph: dict[str, Any]) -> str | None:
    """Why a checkpoint's ``state`` does not belong to the run of ``fingerprint`` on ``graph``, naming each
    differing field with both values; None if it belongs. Needs no trainer: it runs before any shard is read."""
    differences = []
    for section, mine in (("config", fingerprint), ("graph", graph)):
        saved = state.get(section)
        saved = saved if isinstance(saved, dict) else {}
        for key in sorted(set(saved) | set(mine), key=lambda k: (k not in mine, k)):
            if saved.get(key) != mine.get(key):
                label = key if section == "config" else f"graph {key}"
                differences.append(f"{label} {_shown(saved, key)} in the checkpoint, {_shown(mine, key)} in this run")
    if not differences:
        return None
    return f"the checkpoint (epoch {state.get('epoch')}) belongs to another run: " + "; ".join(differences)


def _shown(table: dict[str, Any], key: str) -> str:
    return repr(table[key]) if key in table else "(not set)"


class PolicyChoice(Protocol):
    """The policy fields of a training configuration (``algorithms.train.TrainConfig`` has them; named by
    shape here so that this module, which the trainer imports, imports no trainer)."""

    stale: Any
    sample: Any
    compress: str


def dropped_policy_state(config: PolicyChoice) -> list[str]:
    """What per-rank policy state a run of ``config`` keeps, each as it is named when a resume at another
    world size, replication or plan drops it (and what happens then): each policy says its own
    (:meth:`algorithms.policies.base.PolicyBase.resume_drops`), staleness first, then compression."""
    dropped = [text for text in (axis.policy.resume_drops() for axis in (config.stale, config.sample)
                                 if axis.policy is not None) if text]
    codec = Codec.parse(config.compress)
    if codec is not None and codec.feedback:
        dropped.append("error-feedback residuals (they restart at zero)")
    return dropped or ["per-rank policy state"]
