"""The ``sparse-dist`` command: ``prepare``, ``train``, ``sweep``, ``plot``, ``cost``, ``demo``, ``bench`` and ``info``.

Launch under MPI: ``mpiexec -n P sparse-dist demo`` or ``srun --mpi=pmi2
sparse-dist ...``. Any exception on any rank ends the whole job with a
non-zero status and that rank's message (:func:`sparse_dist.comm.run_or_abort`).

User errors (:func:`user_errors`: bad input or a path that cannot be used,
each named in the message) are one line ``sparse-dist CMD: error: ...`` said
once per job with exit status 2 and no traceback (``--debug`` adds it);
anything else is an internal error and shows its traceback. A bad flag is
refused while the command line is parsed, before MPI starts; a subcommand
module may offer ``check_arguments(args) -> str | None`` for flag
combinations argparse cannot express. A renamed command keeps its old name one release
(:data:`RENAMED_COMMANDS`, saying the new one in one line), as renamed flags do
(:func:`runners.argtypes.add_renamed`). SIGTERM raises ``SystemExit(143)`` so
that cleanup (``finally``, context managers) runs as it does for SIGINT; under MPI from the moment MPI has
started, with a watcher that ends a rank which cannot act on it (:mod:`runners.termination`).
"""

from __future__ import annotations

from runners import launch as _launch  # noqa: F401  first: its fallback launch time is this import (runners.launch)

import argparse
import errno
import os
import platform
import re
import signal
import sys
import warnings
from typing import Any, Callable, NoReturn

from runners import termination
from runners.argtypes import (bound_flags, deprecation_notice, launcher_rank, launcher_world_size, replication_problem,
                              say_once)
from sparse_dist import log
from sparse_dist.hostmem import one_heap_where_kept


class _Parser(argparse.ArgumentParser):
    """A bad flag is said once per job: every rank parses the same command line and fails the same way,
    before MPI starts, so only launcher rank 0 prints the sentence; every rank exits with status 2."""

    def error(self, message: str) -> NoReturn:
        if launcher_rank() == 0:
            sys.stderr.write(f"{self.prog}: error: {message}\n(see {self.prog} --help)\n")
            sys.stderr.flush()
        raise SystemExit(2)


# name -> (module, one-line summary, whether the command runs under MPI). A module offers ``add_arguments``
# and ``main``; only the module of the command being run is imported (most import torch, about a second).
_COMMANDS: dict[str, tuple[str, str, bool]] = {
    "demo": ("runners.demo_cmd", "distributed SpMM on a built-in graph vs scipy", True),
    "prepare": ("runners.prepare_cmd", "write a dataset as shards (single process)", True),
    "train": ("runners.train_cmd", "distributed full-graph training from shards", True),
    "sweep": ("runners.sweep_cmd", "run a scaling study (TOML) with mpiexec or srun; collect a CSV", False),
    "plot": ("runners.plot_cmd", "PNG figures of one or more studies", False),
    "cost": ("runners.perf_model_cmd", "alpha-beta cost model: compare with a study, or predict large P", False),
    "emulate": ("runners.emulate.command", "an MPI job over emulated nodes: namespaces, capped links, TCP", False),
}
_BENCH_KINDS: dict[str, tuple[str, str, bool]] = {
    "spmm": ("runners.bench.spmm", "distributed SpMM vs single-process torch SpMM", True),
    "network": ("runners.bench.network", "alpha and beta of this MPI for `sparse-dist cost`", True),
    "train": ("runners.bench.train", "full training epochs: sparse-dist vs PyG on the same graph", True),
    "policies": ("runners.bench.policy_savings", "exact vs BNS-GCN sampling vs SANCUS staleness, one run", True),
    "minibatch": ("runners.bench.minibatch",
                  "distributed mini-batch training vs DGL's NeighborSampler or PyG's NeighborLoader (numpy "
                  "kernel) + SAGE, one run", True),
    "grid": ("runners.bench.grid", "GCN or SAGE epochs over an X x Y x Z process grid: time, bytes against the model, "
             "memory", True),
    "cores": ("runners.bench.cores", "ranks x threads on this node, dropout on and off: step, dropout, exchange, "
              "speed-up", False),
    "partition": ("runners.bench.partition",
                  "partitioners side by side: balance, cut, remote rows of K-hop sampling", True),
}
_GLOBAL_FLAGS_WITH_VALUES = ("--log-level", "--gpu-aware")


def _named_command(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names (its first word after the global flags), or None (``--help``, a typo)."""
    words = iter(argv)
    for word in words:
        if len(word) > 2 and any(flag.startswith(word) for flag in _GLOBAL_FLAGS_WITH_VALUES):  # argparse's abbrevs
            next(words, None)
        elif not word.startswith("-"):
            return RENAMED_COMMANDS.get(word, word)
    return None


def _parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line's parser. With ``argv``, only the module of the command it names is imported
    (``sparse-dist emulate`` and ``plot`` then start without torch); the others get a stub that
    lists them in ``--help``. Without ``argv``, every command is complete."""
    import importlib

    wanted = _named_command(argv) if argv is not None else None

    def module_if(command: str, module_name: str) -> object | None:
        return importlib.import_module(module_name) if argv is None or wanted == command else None

    parser = _Parser(prog="sparse-dist", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}",
                        help="print the installed package's version and exit")
    parser.add_argument("--log-level", default="WARNING", help="library log level (default: WARNING)")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of user errors too (bad input, unusable paths); internal "
                             "errors always show theirs")
    parser.add_argument("--gpu-aware", choices=("auto", "on", "off", "force"), default="auto",
                        help="CUDA buffers: hand them to MPI if the library reports CUDA support (auto), "
                             "demand a library that reports it (on: else a clear error before any exchange), "
                             "stage through host memory (off), or hand them over unchecked (force)")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, summary, mpi) in _COMMANDS.items():
        aliases = [old for old, new in RENAMED_COMMANDS.items() if new == name]
        _command(commands, name, summary, module_if(name, module_name), mpi=mpi, aliases=aliases)
    bench = commands.add_parser("bench", help="benchmarks")
    bench_kinds = bench.add_subparsers(dest="bench", required=True)
    for name, (module_name, summary, mpi) in _BENCH_KINDS.items():
        _command(bench_kinds, name, summary, module_if("bench", module_name), mpi=mpi, path=f"bench {name}")
    info = commands.add_parser("info", help="versions, MPI library, CUDA and CUDA-aware MPI status")
    info.set_defaults(func=_info)
    return parser


def _version() -> str:
    """The installed distribution's version (package metadata), or a note where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sparse-dist")
    except PackageNotFoundError:
        return "(not installed: no package metadata)"


_CHECKS: dict[object, tuple[Callable[[argparse.Namespace], str | None] | None, argparse.ArgumentParser]] = {}
"""A subcommand's ``main`` -> its ``check_arguments`` (or None) and its parser (which says the error)."""


RENAMED_COMMANDS = {"model": "cost"}
"""Old command name -> new one: the old name still runs the command this release and says the new one."""


def _command(subparsers: argparse._SubParsersAction, name: str, summary: str, module: object | None,
             mpi: bool = True, aliases: list[str] | None = None, path: str | None = None) -> None:
    """A subcommand whose module offers ``add_arguments(parser)`` and ``main(comm, args)``.

    ``mpi=False``: a single-process tool (sweep, plot, cost) that never initialises MPI, so the
    ``mpiexec`` jobs it launches do not inherit a singleton MPI's environment; ``comm`` is None.
    A module's ``EPILOG`` (preformatted text) ends its ``--help``; its ``check_arguments(args)`` returns
    a flag problem (or None) to refuse before MPI starts (kept in :data:`_CHECKS`, not in the namespace,
    which the benchmarks write into their JSON). ``module`` None: a stub, listed in ``--help`` but not
    parsed (:func:`_parser` with the command line of another command). Every numeric flag gets its range from
    :data:`runners.argtypes.FLAG_RANGES` under ``path`` (default: ``name``), checked while it is parsed.
    """
    if module is None:
        subparsers.add_parser(name, aliases=aliases or [], help=summary).set_defaults(stub=True)
        return
    epilog = getattr(module, "EPILOG", None)
    parser = subparsers.add_parser(name, aliases=aliases or [], help=summary, description=summary, epilog=epilog,
                                   formatter_class=argparse.RawDescriptionHelpFormatter if epilog
                                   else argparse.HelpFormatter)
    module.add_arguments(parser)  # type: ignore[attr-defined]
    bound_flags(parser, path or name)
    parser.set_defaults(func=module.main, mpi=mpi)  # type: ignore[attr-defined]
    _CHECKS[module.main] = (getattr(module, "check_arguments", None), parser)  # type: ignore[attr-defined]


def _info(comm: object, args: argparse.Namespace) -> int:
    import numpy
    import scipy
    import torch

    from sparse_dist.comm import Communicator, detect_cuda_aware_mpi, mpi_vendor_details

    assert isinstance(comm, Communicator)
    if comm.rank == 0:
        print(f"python      {platform.python_version()}")
        print(f"torch       {torch.__version__} (threads {torch.get_num_threads()})")
        print(f"numpy       {numpy.__version__}")
        print(f"scipy       {scipy.__version__}")
        for key, value in mpi_vendor_details().items():
            print(f"{key:<13}{value}")
        print(f"world size  {comm.size}")
        cuda = torch.cuda.is_available()
        print(f"cuda        {'available: ' + torch.cuda.get_device_name(0) if cuda else 'not available'}"
              f" (torch built with CUDA {torch.version.cuda})")
        awareness = detect_cuda_aware_mpi()
        print(f"cuda-aware  library reports {'CUDA support' if awareness else 'no CUDA support'} "
              f"({awareness.reason})")
        print(f"gpu path    {comm.gpu_path}")
        if comm.force_host_staging:
            print("staging     host staging forced for every buffer (SPARSE_DIST_FORCE_HOST_STAGING=1)")
        print(f"reduce      segments of {comm.reduce_segment_bytes} bytes (0: unsegmented)")
        try:
            import cupy  # optional

            print(f"cupy        {cupy.__version__}")
        except ImportError:
            print("cupy        not installed (optional)")
    return 0


def user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean bad input, not a bug: their message names the file, field or flag and
    what was expected, so the user sees that one line and no traceback."""
    from algorithms.checkpoint import CheckpointError
    from runners.data.datasets import DatasetError
    from runners.data.shards import ShardError
    from runners.study.collect import ResultsError
    from runners.study.spec import StudyError
    from algorithms.static_input import HaloBudgetError
    from runners.train_cmd import PathError
    from runners.train_grid import GridRunError
    from runners.resources import ResourceError
    from runners.results import ResultsWriteError
    from sparse_dist.comm import GpuAwareError

    return (DatasetError, ShardError, CheckpointError, PathError, GpuAwareError, StudyError, ResultsError,
            HaloBudgetError, ResultsWriteError, ResourceError, GridRunError)


_MEMORY_HINTS = {
    "train": "more ranks (on more nodes), a smaller --hidden or fewer --layers",
    "prepare": "prepare synthetic --stream (bounded memory), or a machine with more memory",
}


def describe_environment_error(command: str) -> Callable[[BaseException], tuple[str, int] | None]:
    """For :func:`sparse_dist.comm.run_or_abort`: one sentence and an exit status for what the machine, not the
    input, caused: out of memory (status 1, with the flag that would help), a full disk, a quota or a read-only
    file system (1), Ctrl-C (130) and SIGTERM (143). Every writer of the project writes under a temporary name
    that is removed on failure or, for results files, streams to ``NAME.partial`` (a valid prefix of the run;
    see :class:`runners.results.ResultsWriter`), so none of these leaves a half-written output under its
    final name."""

    def describe(exc: BaseException) -> tuple[str, int] | None:
        if isinstance(exc, MemoryError) or _allocator_failure(exc):
            wanted = re.search(r"allocate (\d+) bytes", str(exc))
            detail = (f" (could not allocate {int(wanted.group(1)) / 2**30:.1f} GiB more)" if wanted
                      else f" ({str(exc).splitlines()[0]})" if str(exc) else "")
            hint = _MEMORY_HINTS.get(command, "more ranks or a machine with more memory")
            return f"out of memory{detail}; try {hint}", 1
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            where = f" writing {exc.filename}" if exc.filename else ""
            what, hint = {errno.ENOSPC: ("the disk is full", "free some space or write elsewhere"),
                          errno.EDQUOT: ("the disk quota is exceeded", "free some space or write elsewhere"),
                          errno.EROFS: ("the file system is read-only", "write elsewhere")}[exc.errno]
            return f"{what}{where} ({errno.errorcode[exc.errno]}); {hint}", 1
        if isinstance(exc, KeyboardInterrupt):
            return "interrupted (SIGINT, Ctrl-C)", 128 + signal.SIGINT
        if isinstance(exc, SystemExit) and exc.code == 128 + signal.SIGTERM:
            return "terminated (SIGTERM)", 128 + signal.SIGTERM
        return None

    return describe


def device_problem() -> str | None:
    """Why ``--device cuda`` cannot run in this process (no GPU torch can use), or None; asked before MPI starts,
    so every rank of a job on a machine without a GPU refuses alike and rank 0 says it once."""
    import torch

    if torch.cuda.is_available():
        return None
    built = (f"torch {torch.__version__} was built without CUDA" if torch.version.cuda is None
             else f"torch sees no GPU (built with CUDA {torch.version.cuda})")
    return f"argument --device: cuda needs a GPU, but {built}; use --device cpu"


def _allocator_failure(exc: BaseException) -> bool:
    """torch's way of running out of memory: ``RuntimeError`` from its CPU allocator, ``OutOfMemoryError`` on CUDA."""
    return isinstance(exc, RuntimeError) and (type(exc).__name__ == "OutOfMemoryError"
                                              or "can't allocate memory" in str(exc))


def main(argv: list[str] | None = None) -> int:
    """Console entry point."""
    one_heap_where_kept()  # before any second thread allocates (see sparse_dist.hostmem)
    warnings.showwarning = _show_warning
    words = sys.argv[1:] if argv is None else argv
    args = _parser(words).parse_args(words)
    if getattr(args, "stub", False):  # a command line _named_command misread (an abbreviated global flag)
        args = _parser().parse_args(words)
    if args.command in RENAMED_COMMANDS:
        new = RENAMED_COMMANDS[args.command]
        deprecation_notice("sparse-dist", f"sparse-dist {args.command}", f"sparse-dist {new}")
        args.command = new
    check, command_parser = _CHECKS.get(getattr(args, "func", None), (None, None))
    problem = check(args) if check is not None else None
    if not problem and getattr(args, "mpi", False) and isinstance(getattr(args, "replication", None), int):
        problem = replication_problem(args.replication, launcher_world_size())
    if not problem and getattr(args, "device", None) == "cuda":
        problem = device_problem()
    if problem:
        (command_parser or _parser()).error(problem)
    log.configure(args.log_level)
    if not getattr(args, "mpi", True):
        signal.signal(signal.SIGTERM, termination.raise_on_sigterm)
        return _run_without_mpi(args)
    from sparse_dist.comm import GpuAwareError, run_or_abort, separate_endpoints, world, world_rank

    if getattr(args, "overlap_evaluation", False):
        separate_endpoints()  # the evaluation's own communicator gets its own connections (MPICH)

    def body() -> int:
        try:
            comm = world(gpu_aware=args.gpu_aware)
        except GpuAwareError as exc:
            # The same deterministic error on every rank before any collective: one line from rank 0, and every
            # rank exits 2 on its own (no traceback, no MPI_Abort).
            if world_rank() == 0:
                print(f"sparse-dist: error: {exc}", file=sys.stderr, flush=True)
            return 2
        # SIGTERM's handler and the watcher only once MPI has started: MPI_Init holds the GIL, so a rank waiting
        # there for a peer that never came could take neither; with the default action the signal ends it.
        termination.install(f"sparse-dist {args.command}")
        # Where the launcher did not announce P (launcher_world_size() None), c is checked here: comm.size
        # is the same on every rank, so every rank decides alike before any collective, and rank 0 says it.
        problem = replication_problem(getattr(args, "replication", 1), comm.size) \
            if isinstance(getattr(args, "replication", None), int) else None
        if problem:
            if comm.rank == 0:
                print(f"sparse-dist {args.command}: error: {problem}", file=sys.stderr, flush=True)
            return 2
        return args.func(comm, args)

    return run_or_abort(body, user_errors=user_errors(), debug=args.debug, prog=f"sparse-dist {args.command}",
                        describe=describe_environment_error(args.command))


_SHOW_WARNING = warnings.showwarning


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None,
                  line: str | None = None) -> None:
    """A ``FutureWarning`` (a deprecation meant for users, e.g. a policy parameter's old name; the library
    warns, it does not print) is one line, once, from launcher rank 0; other warnings as Python shows them."""
    if issubclass(category, FutureWarning):
        say_once(f"sparse-dist: warning: {message}")
    else:
        _SHOW_WARNING(message, category, filename, lineno, file, line)


_TOOL_ERRORS = (("runners.study.spec", "StudyError"), ("runners.study.collect", "ResultsError"),
                ("runners.results", "ResultsWriteError"), ("runners.data.shard_reader", "ShardError"))


def _loaded_user_errors() -> tuple[type[BaseException], ...]:
    """The single-process tools' user errors whose modules are loaded (one not loaded cannot have been raised;
    importing ``runners.study.spec`` would import torch into ``emulate`` and ``plot``)."""
    return (FileNotFoundError, *(getattr(sys.modules[module], name) for module, name in _TOOL_ERRORS
                                 if module in sys.modules))


def _run_without_mpi(args: argparse.Namespace) -> int:
    """Single-process tools: a user error is one line on stderr and exit status 2."""
    try:
        return args.func(None, args)
    except BaseException as exc:  # out of memory, a full disk, Ctrl-C, SIGTERM: one sentence
        if isinstance(exc, BrokenPipeError) and not args.debug:
            # the reader of stdout left (`sparse-dist sweep --dry-run STUDY | head`): stop as a shell tool does,
            # quietly with 128 + SIGPIPE, and point stdout at nothing so that the exit's flush says nothing either
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + signal.SIGPIPE
        if isinstance(exc, _loaded_user_errors()):
            if args.debug:
                raise
            print(f"sparse-dist {args.command}: error: {exc}", file=sys.stderr)
            return 2
        described = describe_environment_error(args.command)(exc)
        if described is None or args.debug:
            raise
        print(f"sparse-dist {args.command}: error: {described[0]}", file=sys.stderr)
        return described[1]


if __name__ == "__main__":
    sys.exit(main())
