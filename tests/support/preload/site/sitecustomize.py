"""The test suite's launch hook: a Python process started by a test hands itself to a preloaded zygote.

Loaded at start-up by every Python process whose ``PYTHONPATH`` names this folder (the suite's conftest sets
it, with ``SPARSE_DIST_TEST_PRELOAD`` naming the zygotes' folder; :mod:`zygote`). Where the process runs a
script or ``-m module`` in the same interpreter, flags, namespaces, limits and import-time environment as
the zygotes (their ``FAMILY-INDEX.json``, :mod:`zygote_key`), it sends its command line, environment, working directory and open file
descriptors to a zygote, which forks a child that has already imported torch, numpy, scipy and numba; this
process then only waits, forwards signals to the child and exits as the child did. Anything else (another
interpreter, ``-c``, a test's own limits or network namespace, no zygote answering) starts as usual.

Imports only the standard library: it runs before the process's own imports.
"""

from __future__ import annotations


SUPERVISING_MODULES = {"runners.study.supervisor", "runners.emulate.launcher"}
SUPERVISING_COMMANDS = {"sweep", "emulate"}
"""Processes that work with their own pid, parent and descendants (a sweep's job supervisor, emulate's launcher, ``sparse-dist sweep``
and ``emulate``, and any command line naming those words): they always start as usual, while the ranks they
launch may be forked."""


def _handoff() -> None:
    import os

    folder = os.environ.get("SPARSE_DIST_TEST_PRELOAD")
    if not folder or folder == "off":
        return
    import sys

    try:
        why = _handed_off(folder)
    except Exception as error:  # before anything was sent: the process starts as usual
        why = f"error: {error!r}"
    trace = os.environ.get("SPARSE_DIST_TEST_PRELOAD_TRACE")
    if trace:  # where the suite's launches went (a line a process that started as usual)
        with open(trace, "a") as log:
            log.write(f"{why}\t{' '.join(sys.orig_argv)[:200]}\n")


def _handed_off(folder: str) -> str:
    """Hand this process to a zygote and exit as its child does; returns why not where it starts as usual."""
    import json
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    try:
        import zygote_key
        import zygote_wire
    finally:
        del sys.path[0]
    del sys.modules["zygote_key"], sys.modules["zygote_wire"]
    command = zygote_wire.parse_command(sys.orig_argv)
    if command is None:
        return "not a script or module"
    words = set(command["argv"][1:])
    if command["kind"] == "module" and command["target"] in SUPERVISING_MODULES or SUPERVISING_COMMANDS & words:
        return "supervises processes"
    try:
        with open(os.path.join(folder, "families.json")) as handle:
            families = json.load(handle)
    except (OSError, ValueError):
        return "no zygotes"
    key = zygote_key.process_key()
    import socket

    rank = os.environ.get("PMI_RANK", "0")
    index = (int(rank) if rank.isdigit() else 0) % int(families["zygotes"])
    link, differences = None, []
    for family in families["families"]:
        name = os.path.join(folder, f"{family}-{index}")
        theirs = _key_of(name)
        if theirs is None:
            return "zygote not running"
        if theirs != key:
            differences.append(sorted(part if part != "environment" else "environment: " + " ".join(sorted(
                name for name in set(key[part]) | set(theirs[part]) if key[part].get(name) != theirs[part].get(name)))
                for part in key if key[part] != theirs.get(part)))
            continue
        link = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            link.connect(name + ".sock")
        except OSError:
            link.close()
            return "zygote not answering"
        break
    if link is None:
        return f"differs in {differences}"
    trace = os.environ.get("SPARSE_DIST_TEST_PRELOAD_TRACE")
    if trace:
        with open(trace, "a") as log:
            log.write(f"forked\t{' '.join(sys.orig_argv)[:200]}\n")
    fds = sorted(int(name) for name in os.listdir("/proc/self/fd") if int(name) != link.fileno())
    fds = [fd for fd in fds if _is_open(fd)]
    request = json.dumps({"command": command, "orig_argv": sys.orig_argv, "env": dict(os.environ),
                          "cwd": os.getcwd(), "umask": _umask(), "fds": fds}).encode()
    socket.send_fds(link, [len(request).to_bytes(8, "little")], fds)
    link.sendall(request)
    answer = zygote_wire.receive_exactly(link, 8)
    if answer is None:  # no child was made: start as usual
        link.close()
        return "zygote failed to fork"
    try:  # the child runs the command: from here on this process must never run it too
        _wait_as(link, int.from_bytes(answer, "little", signed=True), zygote_wire.receive_exactly)
    except BaseException:
        os._exit(1)
    return "unreachable"


def _wait_as(link, pid: int, receive_exactly) -> None:
    """Forward signals to the child ``pid`` and end as it ended (its exit status, or its signal)."""
    import os
    import signal

    def forward(signum: int, frame: object) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, forward)
    answer = receive_exactly(link, 4)
    status = -1 if answer is None else int.from_bytes(answer, "little", signed=True)
    if status >= 0 and os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        if signum not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # a signal whose default is not to end the process
    os._exit(os.waitstatus_to_exitcode(status) if status >= 0 else 1)


def _key_of(name: str) -> dict | None:
    """The zygote ``name``'s key, waiting while it is still importing (its pid is written, its key not yet); None
    where it is not running."""
    import json
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with open(name + ".json") as handle:
                return json.load(handle)["key"]
        except (OSError, ValueError):
            pass
        try:
            with open(name + ".pid") as handle, open(f"/proc/{int(handle.read())}/stat", "rb") as stat:
                if stat.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return None  # it ended without writing its key
        except (OSError, ValueError, IndexError):
            return None
        time.sleep(0.05)
    return None


def _is_open(fd: int) -> bool:
    import os

    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


_handoff()
