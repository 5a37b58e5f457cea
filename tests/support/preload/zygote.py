"""A zygote for the test suite's launches: one process that imported torch, numpy, scipy and numba once and
forks a child for each Python process a test starts (``python zygote.py FOLDER INDEX``).

Why: the suite starts about a thousand Python processes (every rank of every ``mpiexec`` launch, every
command a test runs), and each spent about 2 CPU seconds importing torch and its neighbours before it did
what the test checks: most of the two lanes' CPU time on the 2-core CI machine. A child of the zygote skips
that; everything else is the process's own: it is launched by the real ``mpiexec`` (the launcher starts a
small Python process, :mod:`sitecustomize`, which hands its command line, environment, working directory,
umask and every open file descriptor, the PMI socket included, to the zygote and then waits), it starts MPI
itself, imports the project's modules afresh, and exits with its own status, which the waiting process
repeats (a death by a signal included). A signal sent to the waiting process is forwarded to the child, and
a waiting process that dies (``SIGKILL`` at a test's timeout) takes its child with it.

What differs from a fresh interpreter, and how the suite keeps it honest:

* string hashing: one hash seed a zygote. The suite runs four a family (:data:`start.COUNT`) and rank ``r`` of a
  launch goes to zygote ``r mod 4``, so the ranks of a job still iterate sets of strings in different
  orders, as separate interpreters would (an order that differs between ranks must not reach a collective);
* the random modules: ``random`` and NumPy's global generator are reseeded from the OS in every child;
* a process whose interpreter, flags, namespaces, resource limits or import-time environment differ from
  the zygote's (:mod:`zygote_key`), or that runs ``-c``, starts as usual; so do the processes that work with
  their own pid, parent and descendants (``sitecustomize.SUPERVISING_MODULES`` and ``SUPERVISING_COMMANDS``).
  Signals keep their meaning: until the child installs a handler, SIGTERM forwarded to it ends it, as it would
  end a fresh interpreter (the suite's SIGTERM-before-MPI tests pass either way);
* the end (:func:`end_as_the_interpreter`): every program ends as ``Py_FinalizeEx`` begins (non-daemon
  threads joined, ``atexit`` handlers run, the standard streams flushed, one garbage collection with its
  finalizers; an uncaught exception first printed by ``sys.excepthook``), finalises MPI as mpi4py would at its
  end, and calls the C library's ``exit`` with the status the interpreter would give (an uncaught
  ``KeyboardInterrupt`` ends by ``SIGINT``, as the interpreter's does), without tearing down its modules. The
  handlers the child registered run (MPICH's, which closes its PMI connection: a rank that leaves without it is
  one MPICH's launcher reports as killed); then :func:`_leave_after_the_childs_handlers`, registered before the
  program starts, flushes C's streams and leaves, so the preloaded libraries' destructors (torch's take 0.1 s
  of a core) never run. With torch loaded the module teardown costs a process about 0.2 s of one core, and a
  suite starts about a thousand;
* the preloaded modules' objects are frozen out of the collector (``gc.freeze``) before the first fork: a
  child's collections skip them instead of writing to every page of the zygote's heap (each write a
  copy-on-write fault). A forked 1-rank job that imports MPI, torch and sparse_dist and ends, every process it
  starts together: 0.30 s of CPU with C's whole ``exit`` and no freeze, 0.21 s with the freeze, 0.09 s with
  both (eight launches each).

Each zygote ends when the process that started it ends (``PR_SET_PDEATHSIG``), and so does each child when its
zygote ends.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "site"))
from zygote_key import process_key  # noqa: E402  (standard library only, shared with sitecustomize)
from zygote_wire import receive_exactly  # noqa: E402

del sys.path[0]
PRELOADED = ("torch", "numpy", "scipy.sparse", "scipy.sparse.csgraph", "scipy.linalg", "numba", "mpi4py", "tqdm")
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # the C library (prctl, __cxa_atexit, fflush, exit)


def _die_with_parent() -> None:
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _read_request(link: socket.socket) -> tuple[dict, list[int]]:
    message, fds, _, _ = socket.recv_fds(link, 8, 1024)
    rest = receive_exactly(link, 8 - len(message)) if len(message) < 8 else b""
    body = None if rest is None else receive_exactly(link, int.from_bytes(message + rest, "little"))
    if body is None:
        for fd in fds:
            os.close(fd)
        raise ConnectionError("the launching process went away")
    return json.loads(body), fds


def serve(folder: str, name: str) -> tuple[socket.socket, dict, list[int]]:
    """Accept launches on ``FOLDER/NAME.sock`` until the parent ends; returns only in a forked child, with its
    connection, request and received descriptors."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = os.path.join(folder, f"{name}.sock")
    listener.bind(path + ".partial")
    os.rename(path + ".partial", path)
    listener.listen(256)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    children: dict[int, socket.socket] = {}
    while True:
        try:
            readable, _, _ = select.select([listener, wake_read, *children.values()], [], [])
        except InterruptedError:
            continue
        if wake_read in readable:
            os.read(wake_read, 4096)
        for link in [entry for entry in readable if isinstance(entry, socket.socket) and entry is not listener]:
            if not link.recv(1, socket.MSG_PEEK):  # the launching process died: so does its child
                pid = next(pid for pid, value in children.items() if value is link)
                _kill(pid)
        if listener in readable:
            link, _ = listener.accept()
            try:
                request, fds = _read_request(link)
            except (ConnectionError, OSError, ValueError):
                link.close()
                continue
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                for other in (listener, *children.values()):
                    other.close()
                os.close(wake_read)
                os.close(wake_write)
                return link, request, fds
            for fd in fds:
                os.close(fd)
            try:
                link.sendall(pid.to_bytes(8, "little", signed=True))
            except OSError:
                _kill(pid)
            children[pid] = link
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            link = children.pop(pid, None)
            if link is not None:
                try:
                    link.sendall(status.to_bytes(4, "little", signed=True))
                except OSError:
                    pass
                link.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def become(link: socket.socket, request: dict, fds: list[int]) -> tuple[str, str, list[str]]:
    """Turn this forked child into the launched process (descriptors, directory, environment, streams, argv);
    returns how to run it: ``("path", script, argv)`` or ``("module", name, argv)``."""
    _die_with_parent()
    link.close()
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    targets = [int(fd) for fd in request["fds"]]
    floor = max(targets + [2]) + 1
    parked = []
    for fd in fds:
        parked.append(_fcntl_dupfd(fd, floor))
        os.close(fd)
    for fd, target in zip(parked, targets):
        os.dup2(fd, target, inheritable=True)
        os.close(fd)
    os.chdir(request["cwd"])
    os.umask(int(request["umask"]))
    os.environ.clear()
    os.environ.update(request["env"])
    command = request["command"]  # parsed by the launching process (zygote_wire.parse_command)
    _reopen_streams(bool(request["env"].get("PYTHONUNBUFFERED")) or command["unbuffered"])
    _reseed()
    sys.orig_argv = list(request["orig_argv"])
    sys.path[0] = os.getcwd() if command["kind"] == "module" else os.path.dirname(os.path.realpath(command["target"]))
    return command["kind"], command["target"], command["argv"]


def _fcntl_dupfd(fd: int, floor: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor)


def _reopen_streams(unbuffered: bool) -> None:
    """New ``sys.stdin/stdout/stderr`` over descriptors 0-2 with the buffering a fresh interpreter would choose."""
    import io

    for name, fd, mode in (("stdin", 0, "r"), ("stdout", 1, "w"), ("stderr", 2, "w")):
        old = getattr(sys, name)
        try:
            raw = io.FileIO(fd, mode + "b", closefd=False)
        except OSError:
            setattr(sys, name, None)
            continue
        interactive = raw.isatty()
        binary = raw if (unbuffered and mode == "w") else io.BufferedWriter(raw) if mode == "w" else \
            io.BufferedReader(raw)
        stream = io.TextIOWrapper(binary, encoding=old.encoding if old else "utf-8",
                                  errors=old.errors if old else "strict",
                                  line_buffering=(name == "stderr" or interactive) and not unbuffered,
                                  write_through=unbuffered or name == "stderr")
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reseed() -> None:
    import random

    random.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    import tempfile

    tempfile.tempdir = None


def main() -> None:
    folder, name = sys.argv[1], sys.argv[2]
    _die_with_parent()
    key = json.dumps({"key": process_key()})  # before the imports: what a launched process has at its start
    for module in PRELOADED:
        __import__(module)
    gc.collect()
    gc.freeze()  # the children's collections leave the preloaded objects (and their pages) alone
    with open(os.path.join(folder, f"{name}.json.partial"), "w") as handle:
        handle.write(key)
    os.rename(os.path.join(folder, f"{name}.json.partial"), os.path.join(folder, f"{name}.json"))
    link, request, fds = serve(folder, name)
    kind, target, argv = become(link, request, fds)
    import runpy

    sys.argv = list(argv)
    sys.modules["__main__"] = types.ModuleType("__main__")  # a fresh one, as a new interpreter's
    _register_the_last_exit_handler()
    try:
        if kind == "module":
            runpy._run_module_as_main(target, alter_argv=True)  # what ``python -m`` itself calls
        else:
            runpy.run_path(target, run_name="__main__")
    except SystemExit as exit:
        end_as_the_interpreter(exit.code)
    except BaseException as error:  # what the interpreter does with an uncaught exception, then its end
        error.__traceback__ = _as_a_fresh_interpreter_traces(error.__traceback__, kind)  # what the hook prints
        sys.excepthook(type(error), error, error.__traceback__)
        end_as_the_interpreter(1, interrupted=isinstance(error, KeyboardInterrupt))
    end_as_the_interpreter(None)


def _as_a_fresh_interpreter_traces(trace: types.TracebackType | None, kind: str) -> types.TracebackType | None:
    """``trace`` without the frames a fresh interpreter would not show: this file's, and for a script
    runpy's (``python -m`` shows runpy's frames itself)."""
    import runpy

    hidden = {main.__code__.co_filename} | ({runpy.run_path.__code__.co_filename} if kind == "path" else set())
    while trace is not None and trace.tb_frame.f_code.co_filename in hidden:
        trace = trace.tb_next
    return trace


_EXIT_STATUS: list[int] = []
"""The status :func:`end_as_the_interpreter` passed to C's ``exit``; empty before."""


def _leave_after_the_childs_handlers(_: object) -> None:
    """A C exit handler: flush C's streams and leave with the status, skipping the handlers registered before
    it (the preloaded libraries'). Reached only from :func:`end_as_the_interpreter`'s ``exit`` while the
    interpreter lives (it would crash after ``Py_FinalizeEx``); from any other ``exit`` (a library's own, with
    no status set) it returns and that ``exit`` goes on as usual."""
    if _EXIT_STATUS:
        _LIBC.fflush(None)
        os._exit(_EXIT_STATUS[0])


_EXIT_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_leave_after_the_childs_handlers)


def _register_the_last_exit_handler() -> None:
    """Register :func:`_leave_after_the_childs_handlers` in the child before its program starts: C runs exit
    handlers last-registered first, so every handler the program's libraries add (MPICH's at ``MPI_Init``) runs
    before it, and none the zygote's imports added (torch's) after it. Where the C library has no
    ``__cxa_atexit`` (not glibc) or refuses it, nothing is registered and the child's ``exit`` runs every
    handler, as before: a slower end, the same result."""
    register = getattr(_LIBC, "__cxa_atexit", None)
    if register is None:
        return
    register.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    register(ctypes.cast(_EXIT_HANDLER, ctypes.c_void_p), None, None)


def end_as_the_interpreter(code: object, interrupted: bool = False) -> None:
    """End as a fresh interpreter would after ``sys.exit(code)`` (or, ``interrupted``, after an uncaught
    ``KeyboardInterrupt``), without its module teardown (never returns)."""
    import atexit
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:
        status = 1
        if sys.stderr is not None:
            print(code, file=sys.stderr)
    threading._shutdown()  # non-daemon threads first, as Py_FinalizeEx does
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    gc.collect()
    mpi = sys.modules.get("mpi4py.MPI")  # mpi4py finalises MPI at the very end of the teardown (Py_AtExit): here
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    if interrupted:  # the interpreter's exit_sigint: die by SIGINT, else 130
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        status = 128 + signal.SIGINT
    _EXIT_STATUS.append(status)
    _LIBC.exit(status)


if __name__ == "__main__":
    main()
