"""``sparse-dist emulate``: run one command as an MPI job over an emulated cluster of N nodes on this machine.

::

    sparse-dist emulate --nodes 2 --ranks-per-node 1 --bandwidth 1gbit -- sparse-dist train --data DIR

builds the network of :mod:`runners.emulate.network` (a namespace per node, every node's link capped
at ``--bandwidth`` both ways), runs ``mpiexec -n NODES*RANKS_PER_NODE`` from the head namespace with
the hosts ``10.250.0.1 ...`` and :mod:`runners.emulate.launcher` as its ``ssh``, and removes the
network again when the job ends, fails, times out (``--timeout``: exit 124) or is interrupted
(Ctrl-C, SIGTERM). The command is the per-rank command (what follows ``mpiexec -n P``).

Transport: hydra starts one proxy per node, so ranks of one node are local to each other and talk
through shared memory; ranks of different nodes talk through MPICH's ofi netmod with libfabric's tcp
provider bound to the node's ``emu0`` (``MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp FI_TCP_IFACE=emu0``).
Every rank gets ``SPARSE_DIST_NETWORK``, a JSON description of the network that ``train`` copies into
its results' environment record.

Only MPICH's hydra ``mpiexec`` is driven. Open MPI would be driven the same way: ``mpirun --host
10.250.0.1:R,... --mca plm_rsh_agent WRAPPER --mca btl self,vader,tcp --mca btl_tcp_if_include emu0
--mca oob_tcp_if_include emu0`` (``vader``/``sm`` inside a node, ``tcp`` between nodes); not built,
and refused with that sentence.

Where the machine cannot do it (not root, no pyroute2, no namespaces, bridge, veth, ``tbf`` or, with
``--latency``, ``netem``), the command refuses in one sentence and exit status 2 before anything is
launched. ``--cleanup`` removes what a killed ``emulate`` left (every start does too).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from runners.emulate.network import (HEAD_ADDRESS, MAX_NODES, NODE_INTERFACE, EmulatedCluster, EmulationUnavailable,
                                     LinkSpec, check_privileges, leftovers, node_address, parse_bandwidth,
                                     PREFIX, owner_alive, parse_latency, prefix_of, remove_namespaces)
from runners.launcher_path import find_mpiexec

TIMEOUT_STATUS = 124
MAX_RATE_BITS = 8 * (2 ** 32 - 1)  # tbf's 32-bit rate field, in bytes per second
_LAUNCHERS = {"mpiexec", "mpirun", "mpiexec.hydra", "srun"}

EPILOG = """\
examples:
  sparse-dist emulate --nodes 2 --bandwidth 1gbit -- sparse-dist bench network --repeats 5
  sparse-dist emulate --nodes 4 --ranks-per-node 1 --bandwidth 200mbit --timeout 600 -- \\
      sparse-dist train --data data_prepared/cora --out results/cora-200mbit.jsonl
  sparse-dist emulate --cleanup        # remove what an emulate killed by SIGKILL left behind
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, help=f"emulated nodes, each a network namespace (1 .. {MAX_NODES})")
    parser.add_argument("--ranks-per-node", type=int, default=1,
                        help="ranks on each node; they share memory, other nodes are reached over TCP (default 1)")
    parser.add_argument("--bandwidth", help="every node's link rate, each direction: e.g. 100mbit, 1gbit, 10gbit "
                                            "(decimal, as tc), or 'unlimited' (TCP, no cap)")
    parser.add_argument("--latency", help="one-way delay added between nodes, e.g. 50us (needs the netem qdisc)")
    parser.add_argument("--timeout", type=float, help="seconds before the job is killed (exit 124)")
    parser.add_argument("--no-pin", action="store_true",
                        help="let every node use every core (default: each node gets an equal share)")
    parser.add_argument("--report", help="write the links' byte counters as JSON to this file")
    parser.add_argument("--cleanup", action="store_true",
                        help="remove the namespaces of emulate runs that were killed, then exit")
    parser.add_argument("job", nargs=argparse.REMAINDER, metavar="command",
                        help="-- then the per-rank command (what would follow `mpiexec -n P`)")


def _command_words(args: argparse.Namespace) -> list[str]:
    words = list(args.job)
    return words[1:] if words[:1] == ["--"] else words


def check_arguments(args: argparse.Namespace) -> str | None:
    """Flag problems, before anything is built."""
    if args.cleanup:
        return "--cleanup takes no other flag and no command" if _command_words(args) else None
    if args.nodes is None or args.bandwidth is None:
        return "--nodes and --bandwidth are required (or --cleanup)"
    if not 1 <= args.nodes <= MAX_NODES:
        return f"--nodes: expected 1 .. {MAX_NODES}, found {args.nodes}"
    if args.ranks_per_node < 1:
        return f"--ranks-per-node: expected at least 1, found {args.ranks_per_node}"
    try:
        rate = parse_bandwidth(args.bandwidth)
        if args.latency is not None:
            parse_latency(args.latency)
    except ValueError as exc:
        return str(exc)
    if rate is not None and rate > MAX_RATE_BITS:
        return f"--bandwidth {args.bandwidth}: at most {MAX_RATE_BITS / 1e9:.0f}gbit (tbf's 32-bit rate field)"
    if args.timeout is not None and args.timeout <= 0:
        return f"--timeout: expected a positive number of seconds, found {args.timeout:g}"
    words = _command_words(args)
    if not words:
        return "give the per-rank command after --, e.g. -- sparse-dist train --data DIR"
    if os.path.basename(words[0]) in _LAUNCHERS:
        return (f"give the per-rank command, not {os.path.basename(words[0])}: emulate runs mpiexec itself "
                f"with --nodes x --ranks-per-node ranks")
    return None


def hydra_mpiexec() -> str:
    """The hydra ``mpiexec`` beside this Python (or on PATH); :class:`EmulationUnavailable` if there is none."""
    found = find_mpiexec()
    if found is None:
        raise EmulationUnavailable("emulate needs MPICH's mpiexec (hydra) and found no mpiexec beside "
                                   "the Python interpreter or on PATH; pip install mpich")
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        version = ""
    if "HYDRA" not in version:
        raise EmulationUnavailable(f"emulate drives MPICH's hydra mpiexec and {found} is not one (Open MPI's "
                                   f"btl tcp would need its own launcher, see docs/guide/emulate.md)")
    return found


def network_record(args: argparse.Namespace, link: LinkSpec) -> dict[str, Any]:
    """What ``SPARSE_DIST_NETWORK`` says: the runs' results keep it beside their environment."""
    return {"emulated": True, "nodes": args.nodes, "ranks_per_node": args.ranks_per_node, **link.describe(),
            "transport": "MPICH ofi/tcp between nodes, shared memory inside one",
            "qdisc": ("netem (node egress) + " if link.latency else "")
            + ("tbf both directions" if link.rate_bits is not None else "no cap"),
            "pinned": not args.no_pin}


def mpiexec_command(mpiexec: str, wrapper: Path, args: argparse.Namespace) -> list[str]:
    hosts = ",".join(node_address(i) for i in range(args.nodes))
    return [mpiexec, "-n", str(args.nodes * args.ranks_per_node), "-ppn", str(args.ranks_per_node),
            "-hosts", hosts, "-localhost", HEAD_ADDRESS, "-launcher", "ssh", "-launcher-exec", str(wrapper),
            *_command_words(args)]


def _stop(process: subprocess.Popen[bytes], grace: float = 3.0) -> None:
    """SIGTERM the job's process group (hydra passes it on to the ranks), SIGKILL what is left after ``grace``;
    Ctrl-C and SIGTERM wait until it is done."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        _stop_group(process, grace)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _stop_group(process: subprocess.Popen[bytes], grace: float) -> None:
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _summary(cluster: EmulatedCluster, rows: list[dict[str, int]]) -> str:
    parts = [f"node{row['node']} sent {row['tx_bytes'] / 1e6:.2f} MB, received {row['rx_bytes'] / 1e6:.2f} MB"
             for row in rows]
    return (f"sparse-dist emulate: {cluster.nodes} node(s), {cluster.link.bandwidth} links; "
            + "; ".join(parts))


def _write_report(path: str, record: dict[str, Any]) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        temporary.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def _owner_only_signals() -> None:
    """Ctrl-C and SIGTERM end this process through its ``finally`` blocks (tear-down), but a child pyroute2
    forks for a netlink socket in a namespace exits at once: unwinding through our frames, it would tear
    down the network under our feet."""
    owner = os.getpid()

    def handler(signum: int, frame: object) -> None:
        if os.getpid() != owner:
            os._exit(128 + signum)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def run(args: argparse.Namespace) -> int:
    """Build, run, report, tear down; the command's exit status (124 on timeout)."""
    check_privileges()
    mpiexec = hydra_mpiexec()
    stale = leftovers()
    scratch = _remove_stale_scratch()
    remove_namespaces(stale)
    if stale or scratch:
        print(f"sparse-dist emulate: removed {len(stale)} namespace(s) and {len(scratch)} scratch directory(ies) "
              f"killed runs left: {' '.join(stale + scratch)}", file=sys.stderr)
    link = LinkSpec(args.bandwidth, args.latency)
    prefix = prefix_of(os.getpid())
    with EmulatedCluster(args.nodes, link, prefix) as cluster, \
            tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        from runners.emulate.launcher import write_wrapper

        wrapper = write_wrapper(Path(scratch), prefix, args.nodes, pin=not args.no_pin)
        env = dict(os.environ, MPIR_CVAR_CH4_NETMOD="ofi", FI_PROVIDER="tcp", FI_TCP_IFACE=NODE_INTERFACE,
                   SPARSE_DIST_NETWORK=json.dumps(network_record(args, link)))
        command = [sys.executable, "-m", "runners.emulate.launcher", prefix, "--head",
                   *mpiexec_command(mpiexec, wrapper, args)]
        process = subprocess.Popen(command, env=env, start_new_session=True)
        try:
            rc = process.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            _stop(process)
            print(f"sparse-dist emulate: killed the job after --timeout {args.timeout:g} s", file=sys.stderr)
            rc = TIMEOUT_STATUS
        finally:
            _stop(process)
        rows = cluster.counters()
        print(_summary(cluster, rows), file=sys.stderr, flush=True)
        if args.report:
            _write_report(args.report, {"network": network_record(args, link), "exit_status": rc, "links": rows})
    return rc


def _is_wrapper(path: Path) -> bool:
    """Whether ``path`` is a launcher wrapper :func:`runners.emulate.launcher.write_wrapper` wrote (a plain file,
    not a symbolic link, running this package's launcher)."""
    if path.is_symlink() or not path.is_file() or path.stat().st_size > 4096:
        return False
    text = path.read_bytes()
    return text.startswith(b"#!/bin/sh\nexec ") and b" -m runners.emulate.launcher " in text


def _remove_stale_scratch() -> list[str]:
    """Remove the scratch directories (``TMPDIR/sdemu-PID-*`` holding only the launcher wrapper ``ssh``) of runs
    whose ``emulate`` no longer runs: a SIGKILLed run cannot remove its own. Anything else there (another
    file, a symbolic link, a wrapper that is not ours) is left alone."""
    removed = []
    for directory in Path(tempfile.gettempdir()).glob(f"{PREFIX}*"):
        match = re.fullmatch(re.escape(PREFIX) + r"(\d+)-.*", directory.name)
        if (not match or not directory.is_dir() or directory.is_symlink() or owner_alive(int(match.group(1)))
                or sorted(p.name for p in directory.iterdir()) != ["ssh"] or not _is_wrapper(directory / "ssh")):
            continue
        (directory / "ssh").unlink()
        directory.rmdir()
        removed.append(str(directory))
    return removed


def main(comm: object, args: argparse.Namespace) -> int:
    _owner_only_signals()
    try:
        if args.cleanup:
            check_privileges()
            stale = leftovers()
            remove_namespaces(stale)
            scratch = _remove_stale_scratch()
            print(f"sparse-dist emulate: removed {len(stale)} namespace(s) and {len(scratch)} scratch "
                  f"directory(ies) left by killed runs" + (f": {' '.join(stale + scratch)}" if stale or scratch else ""))
            return 0
        return run(args)
    except EmulationUnavailable as exc:
        print(f"sparse-dist emulate: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sparse-dist emulate: interrupted; the job and its network are gone", file=sys.stderr)
        return 130
    except SystemExit as exc:  # SIGTERM, after tear-down: said here, once (returned, so no one says it again)
        if exc.code != 128 + signal.SIGTERM:
            raise
        print("sparse-dist emulate: terminated (SIGTERM); the job and its network are gone", file=sys.stderr)
        return 128 + signal.SIGTERM
