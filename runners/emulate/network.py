"""The emulated cluster's network: one namespace per node, veth links to a bridge, every link capped.

Layout, for a cluster made by process ``PID`` (every object is named ``sdemu-PID-...``)::

    sdemu-PID-sw     the switch: bridge ``br0``, one port per node (``n0``, ``n1``, ...) and ``head``
    sdemu-PID-n<i>   node i: interface ``emu0`` = 10.250.0.<i+1>/24, veth peer of the switch port ``n<i>``
    sdemu-PID-head   where ``mpiexec`` runs: ``emu0`` = 10.250.0.254/24, uncapped (control traffic only)

Both directions of every node's link are capped: a token bucket (``tbf``) on the node's egress
(``emu0`` in the node) caps what the node sends and one on the switch port's egress caps what it
receives, as a full-duplex NIC on a non-blocking switch does (so that three senders to one node
share that node's link instead of getting three links' worth). ``unlimited`` leaves the qdiscs out:
the same TCP path, no cap. Latency (``netem``) goes on the node's egress only, so a message between
two nodes is delayed once by ``--latency``; the cap is then a ``tbf`` under the ``netem`` root.

Every object lives inside namespaces this module created; the root namespace gets no interface, no
address and no route, so the 10.250.0.0/24 addresses are never seen outside. Deleting a namespace
deletes its interfaces (and their veth peers), so tear-down is: kill the processes still inside our
namespaces, then remove the namespaces. A cluster whose maker died (SIGKILL) is found by its name
(:func:`leftovers`: the PID is gone) and removed by ``sparse-dist emulate --cleanup`` or by the next
``emulate``.

Everything goes through pyroute2 (netlink), not the ``ip``/``tc`` binaries: no string building, no
parsing of their output, and the errors are errno values.

Token bucket sizes: ``burst`` is max(128 KiB, 1 ms at the rate), so that a 64 KiB GSO packet always
fits (below that ``tbf`` splits GSO packets in software, which costs CPU) and high rates are not
held back by timer granularity; the queue holds ``QUEUE_SECONDS`` at the rate (TCP's small-queue
limit keeps it far from full; a short queue would drop and make TCP back off below the cap).
"""

from __future__ import annotations

import errno
import os
import re
import signal
import time
from dataclasses import dataclass
from typing import Any

PREFIX = "sdemu-"
SUBNET = "10.250.0"
PREFIX_LENGTH = 24
HEAD_ADDRESS = f"{SUBNET}.254"
NODE_INTERFACE = "emu0"
MAX_NODES = 253
QUEUE_SECONDS = 0.1
MIN_BURST_BYTES = 128 * 1024
NETNS_DIR = "/run/netns"

_BANDWIDTH = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)bit\s*$", re.IGNORECASE)
_LATENCY = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(us|ms|s)\s*$", re.IGNORECASE)
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


class EmulationUnavailable(RuntimeError):
    """This machine cannot build the emulated network; the message is one sentence that says why."""


def parse_bandwidth(text: str) -> float | None:
    """``"1gbit"`` -> 1e9 bits/s (decimal units, as ``tc``); ``"unlimited"`` -> None."""
    if text.strip().lower() == "unlimited":
        return None
    match = _BANDWIDTH.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"bandwidth {text!r}: expected a rate such as 100mbit, 1gbit, 10gbit, or 'unlimited'")
    return float(match.group(1)) * _SCALE[match.group(2).lower()]


def parse_latency(text: str) -> float:
    """``"50us"`` -> 5e-5 seconds."""
    match = _LATENCY.match(text)
    if not match:
        raise ValueError(f"latency {text!r}: expected a delay such as 50us, 0.2ms or 1ms")
    return float(match.group(1)) * _SECONDS[match.group(2).lower()]


@dataclass(frozen=True)
class LinkSpec:
    """What every node's link gets: a rate (None: uncapped) and a one-way latency (None: none added)."""

    bandwidth: str
    latency: str | None = None

    @property
    def rate_bits(self) -> float | None:
        return parse_bandwidth(self.bandwidth)

    @property
    def latency_seconds(self) -> float | None:
        return parse_latency(self.latency) if self.latency else None

    def describe(self) -> dict[str, Any]:
        """The network as a run's results record it."""
        return {"bandwidth": self.bandwidth, "bandwidth_bits_per_s": self.rate_bits,
                "latency": self.latency, "latency_s": self.latency_seconds}


def prefix_of(pid: int) -> str:
    return f"{PREFIX}{pid}-"


def node_namespace(prefix: str, node: int) -> str:
    return f"{prefix}n{node}"


def head_namespace(prefix: str) -> str:
    return f"{prefix}head"


def switch_namespace(prefix: str) -> str:
    return f"{prefix}sw"


def node_address(node: int) -> str:
    return f"{SUBNET}.{node + 1}"


def node_of_address(address: str) -> int:
    """The node whose ``emu0`` has ``address`` (the host names hydra hands the launcher)."""
    match = re.fullmatch(re.escape(SUBNET) + r"\.(\d+)", address)
    if not match or not 1 <= int(match.group(1)) <= MAX_NODES:
        raise ValueError(f"{address!r} is not an emulated node's address ({SUBNET}.1 .. {SUBNET}.{MAX_NODES})")
    return int(match.group(1)) - 1


def check_privileges() -> None:
    """Refuse (one sentence) where namespaces cannot be made at all: not root, or no pyroute2."""
    if os.geteuid() != 0:
        raise EmulationUnavailable("emulate needs root to create network namespaces, veth links and qdiscs "
                                   f"(running as uid {os.geteuid()}); run it as root or launch with plain mpiexec")
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        raise EmulationUnavailable("emulate needs pyroute2 to speak netlink; install it with "
                                   "pip install 'sparse-dist[emulate]'") from None


def _netlink_error_code(exc: BaseException) -> int | None:
    return getattr(exc, "code", None) or getattr(exc, "errno", None)


class EmulatedCluster:
    """``nodes`` namespaces joined through capped veth links to one bridge; :meth:`build`, then :meth:`teardown`.

    Use as a context manager: the namespaces exist inside the ``with`` and are gone after it, also when
    the body raises (KeyboardInterrupt and SystemExit included).
    """

    def __init__(self, nodes: int, link: LinkSpec, prefix: str | None = None) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes: expected 1 .. {MAX_NODES}, found {nodes}")
        self.nodes, self.link = nodes, link
        self.prefix = prefix or prefix_of(os.getpid())
        self.created: list[str] = []

    @property
    def namespaces(self) -> list[str]:
        return [switch_namespace(self.prefix), head_namespace(self.prefix),
                *(node_namespace(self.prefix, i) for i in range(self.nodes))]

    def __enter__(self) -> "EmulatedCluster":
        try:
            self.build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def build(self) -> None:
        """Create the namespaces, links, addresses and qdiscs; :class:`EmulationUnavailable` if the kernel
        lacks one of them (nothing is launched before this returns)."""
        from pyroute2 import NetNS, netns

        for name in self.namespaces:
            try:
                netns.create(name)
            except OSError as exc:
                raise EmulationUnavailable(f"emulate cannot create network namespace {name} "
                                           f"({os.strerror(exc.errno) if exc.errno else exc})") from None
            self.created.append(name)
        with NetNS(switch_namespace(self.prefix)) as switch:
            self._up(switch, "lo")
            try:
                switch.link("add", ifname="br0", kind="bridge")
            except Exception as exc:  # NetlinkError: the kernel has no bridge
                raise EmulationUnavailable(f"emulate cannot create a bridge on this kernel "
                                           f"({os.strerror(_netlink_error_code(exc) or errno.EINVAL)})") from None
            bridge = self._up(switch, "br0")
            ports = {"head": head_namespace(self.prefix)}
            ports.update({f"n{i}": node_namespace(self.prefix, i) for i in range(self.nodes)})
            for port, namespace in ports.items():
                try:
                    switch.link("add", ifname=port, kind="veth",
                                peer={"ifname": NODE_INTERFACE, "net_ns_fd": namespace})
                except Exception as exc:
                    raise EmulationUnavailable(f"emulate cannot create a veth pair on this kernel "
                                               f"({os.strerror(_netlink_error_code(exc) or errno.EINVAL)})") from None
                index = switch.link_lookup(ifname=port)[0]
                switch.link("set", index=index, master=bridge, state="up")
                if port != "head":
                    self._shape(switch, index, delay=False)
        self._configure(head_namespace(self.prefix), HEAD_ADDRESS, shaped=False)
        for i in range(self.nodes):
            self._configure(node_namespace(self.prefix, i), node_address(i), shaped=True)

    def _up(self, ipr: Any, ifname: str) -> int:
        index = ipr.link_lookup(ifname=ifname)[0]
        ipr.link("set", index=index, state="up")
        return index

    def _configure(self, namespace: str, address: str, shaped: bool) -> None:
        from pyroute2 import NetNS

        with NetNS(namespace) as ipr:
            self._up(ipr, "lo")
            index = self._up(ipr, NODE_INTERFACE)
            ipr.addr("add", index=index, address=address, prefixlen=PREFIX_LENGTH)
            if shaped:
                self._shape(ipr, index, delay=True)

    def _shape(self, ipr: Any, index: int, delay: bool) -> None:
        """Cap the egress of interface ``index``; with ``delay``, add the latency (netem) in front."""
        rate = self.link.rate_bits
        latency = self.link.latency_seconds if delay else None
        parent: dict[str, Any] = {}
        if latency:
            try:
                ipr.tc("add", "netem", index=index, handle="1:", delay=max(1, round(latency * 1e6)))
            except Exception as exc:
                if _netlink_error_code(exc) in (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL):
                    raise EmulationUnavailable("this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), which "
                                               "--latency needs; leave --latency out to emulate bandwidth "
                                               "only") from None
                raise
            parent = {"parent": 0x10001, "handle": "10:"}
        if rate is None:
            return
        burst = max(MIN_BURST_BYTES, int(rate / 8 * 1e-3))
        limit = burst + int(rate / 8 * QUEUE_SECONDS)
        try:
            ipr.tc("add", "tbf", index=index, **(parent or {"handle": "1:"}), rate=int(rate / 8), burst=burst,
                   limit=limit)
        except Exception as exc:
            if _netlink_error_code(exc) in (errno.ENOENT, errno.EOPNOTSUPP):
                raise EmulationUnavailable("this kernel has no tbf qdisc (CONFIG_NET_SCH_TBF), which caps "
                                           "the bandwidth; use --bandwidth unlimited or a kernel with "
                                           "tbf") from None
            raise

    def counters(self) -> list[dict[str, int]]:
        """Per node, the bytes its ``emu0`` sent and received and what its two token buckets passed and
        dropped (``sent_capped``: the node's egress qdisc; ``received_capped``: its switch port's)."""
        from pyroute2 import NetNS

        def qdisc_bytes(ipr: Any, index: int) -> tuple[int, int]:
            passed = dropped = 0
            for qdisc in ipr.get_qdiscs(index=index):
                if qdisc.get_attr("TCA_KIND") == "tbf":
                    stats = qdisc.get_attr("TCA_STATS2").get_attr("TCA_STATS_BASIC")
                    queue = qdisc.get_attr("TCA_STATS2").get_attr("TCA_STATS_QUEUE")
                    passed, dropped = int(stats["bytes"]), int(queue["drops"])
            return passed, dropped

        rows = []
        with NetNS(switch_namespace(self.prefix)) as switch:
            ports = {i: switch.link_lookup(ifname=f"n{i}")[0] for i in range(self.nodes)}
            received = {i: qdisc_bytes(switch, ports[i]) for i in range(self.nodes)}
        for i in range(self.nodes):
            with NetNS(node_namespace(self.prefix, i)) as ipr:
                index = ipr.link_lookup(ifname=NODE_INTERFACE)[0]
                stats = ipr.get_links(index)[0].get_attr("IFLA_STATS64")
                sent = qdisc_bytes(ipr, index)
            rows.append({"node": i, "tx_bytes": int(stats["tx_bytes"]), "rx_bytes": int(stats["rx_bytes"]),
                         "sent_capped_bytes": sent[0], "sent_dropped_packets": sent[1],
                         "received_capped_bytes": received[i][0], "received_dropped_packets": received[i][1]})
        return rows

    def teardown(self) -> None:
        """Kill what still runs in our namespaces and remove them (idempotent); Ctrl-C and SIGTERM wait
        until it is done."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            _kill_children()  # a helper pyroute2 forked may still be creating a namespace (interrupted build)
            names = os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []
            remove_namespaces(sorted({*self.created, *(name for name in names if name.startswith(self.prefix))}))
            self.created.clear()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _kill_children() -> None:
    """SIGKILL and reap this process's children still running (by then only pyroute2's helpers)."""
    me = str(os.getpid())
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = handle.read().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            continue
        if parent == me:
            try:
                os.kill(int(entry), signal.SIGKILL)
                os.waitpid(int(entry), 0)
            except (ProcessLookupError, ChildProcessError):
                pass


def kill_inside(names: list[str]) -> None:
    """SIGKILL every process whose network namespace is one of ``names`` (ours only: matched by inode)."""
    from pyroute2.netns import ns_pids

    wanted = set(names)
    for _ in range(50):
        pids = [pid for name, members in ns_pids().items() if name in wanted for pid in members]
        pids = [pid for pid in pids if pid != os.getpid()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def remove_namespaces(names: list[str]) -> None:
    """Kill the processes inside ``names``, then remove the namespaces (their interfaces go with them)."""
    from pyroute2 import netns

    present = [name for name in names if name in netns.listnetns()]
    if not present:
        return
    kill_inside(present)
    for name in present:
        try:
            netns.remove(name)
        except FileNotFoundError:
            pass


def owner_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"emulate" in handle.read()
    except OSError:
        return False


def leftovers() -> list[str]:
    """Namespaces named ``sdemu-PID-...`` whose PID no longer runs an ``emulate``: left by a killed run."""
    names = os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []
    found = []
    for name in names:
        match = re.fullmatch(re.escape(PREFIX) + r"(\d+)-.*", name)
        if match and not owner_alive(int(match.group(1))):
            found.append(name)
    return sorted(found)
