"""One writer per output: an exclusive ``flock`` on ``NAME.lock`` beside each output, held for the writer's life.

``sparse-dist train`` takes one for ``--out`` and one for ``--checkpoint`` (rank 0, before any output is
touched; :func:`runners.train_cmd.main`), so a second job on the same path is refused, naming the holder's
host and pid, instead of interleaving its records or removing the first job's checkpoint sets as leftovers.

Why a file beside the output and not the output itself: outputs are replaced by renames (the results file
at completion, the checkpoint pointer at every commit), and a lock on an inode that a rename has just
unlinked guards nothing.

Why the lock file is left behind (never removed): a lock lives on an inode, not a name. Were the holder to
unlink ``NAME.lock`` before releasing it, a process that opened the old inode just before the unlink would
lock it once released while a third process creates and locks a new ``NAME.lock``: two writers, each holding
"the" lock. Left in place, every process opens the same inode, and a file left by a killed job is harmless:
the kernel released its lock when the process died (``kill -9``, a node's reboot excepted on network file
systems that keep locks for a lease). The file's one line says who held it last (host, pid, since when).

Where the file system has no locks (``flock`` fails with ``ENOLCK`` or ``EOPNOTSUPP``, e.g. some NFS or
Lustre mounts without ``-o flock``) the run goes on, unguarded, with one warning logged.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from sparse_dist.log import get_logger

LOCK_KIND = "sparse_dist output lock"
_START = b'{"kind": "' + LOCK_KIND.encode() + b'"'
_log = get_logger(__name__)


def lock_beside(path: str | Path) -> Path:
    """``NAME.lock`` beside ``path``: the lock of the output ``path``."""
    path = Path(path)
    return path.with_name(path.name + ".lock")


def _holder(descriptor: int) -> str:
    """Who holds the lock, as its file says: ``pid 123 on host node7 since 12:03:04``."""
    try:
        record = json.loads(os.pread(descriptor, 4096, 0))
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(record["since"])))
        return f"pid {int(record['pid'])} on host {record['host']}, since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that has not written its host and pid yet"


@dataclass
class OutputLocks:
    """The locks this process holds (rank 0 of a job; empty on the other ranks)."""

    descriptors: list[int] = field(default_factory=list)

    def take(self, output: str | Path, flag: str, *, overwrite: bool) -> str | None:
        """Lock ``NAME.lock`` beside ``output`` (named by ``flag``) without waiting and write this process's host
        and pid into it; why not (one sentence), or None once held. A lock file holding anything but a lock's
        line is not replaced unless ``overwrite``. Local: the caller agrees the answer across ranks."""
        path = lock_beside(output)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # no link followed, no FIFO or device waited on or read: only a regular file is a lock file
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return (f"{flag} {output}: its lock file {path} is a symbolic link; a lock file is a regular file "
                        f"sparse_dist makes, so move the link away")
            return f"{flag} {output}: cannot open its lock file {path}: {exc.strerror or exc}"
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            os.close(descriptor)
            return (f"{flag} {output}: its lock file {path} exists and is not a regular file (a FIFO, socket or "
                    f"device); move it away or choose another {flag}")
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = _holder(descriptor)
                os.close(descriptor)
                return (f"{flag} {output} is being written by another run ({holder}; it holds {path}); wait for "
                        f"it to end or choose another {flag}")
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):
                os.close(descriptor)
                return f"{flag} {output}: cannot lock {path}: {exc.strerror or exc}"
            _log.warning("%s %s: the file system cannot lock %s (%s); a second run on it would not be refused",
                         flag, output, path, exc.strerror)
        start = os.pread(descriptor, len(_START), 0)
        if start and start != _START and not overwrite:
            os.close(descriptor)
            return (f"{flag} {output}: {path} exists and is not a lock file of sparse_dist; move it away or pass "
                    f"--overwrite to replace it")
        line = json.dumps({"kind": LOCK_KIND, "host": socket.gethostname(), "pid": os.getpid(), "since": time.time()})
        try:
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, (line + "\n").encode(), 0)
        except OSError as exc:
            os.close(descriptor)
            return f"{flag} {output}: cannot write its lock file {path}: {exc.strerror or exc}"
        self.descriptors.append(descriptor)
        return None

    def release(self) -> None:
        """Release every lock (closing the file releases it; the file stays: see the module docstring)."""
        while self.descriptors:
            os.close(self.descriptors.pop())
