"""The ``ssh`` that hydra's ``mpiexec`` calls to start a proxy on an emulated node, and the head's entry.

``mpiexec -launcher ssh -launcher-exec WRAPPER -hosts 10.250.0.1,...`` runs ``WRAPPER [-x] HOST
WORD...`` once per node, as it would run ``ssh``; WRAPPER is a two-line script
(:func:`write_wrapper`) that runs ``python -m runners.emulate.launcher PREFIX NODES PIN [-x] HOST
WORD...``. Like ``ssh``, the words are joined with spaces and run by ``sh -c``, here inside node
HOST's namespace (found from its address), so the proxy and the ranks it starts see only that node's
interface. With ``PIN`` = 1 the node also gets its own share of the cores (:func:`node_cpus`), as a
real node has its own: then ``sparse-dist``'s default thread count (cores / ranks on the node) does
not oversubscribe the machine.

``python -m runners.emulate.launcher PREFIX --head COMMAND...`` runs COMMAND inside the head
namespace (where ``mpiexec`` runs) and asks the kernel to SIGTERM it if the ``emulate`` process that
started it dies, so a killed ``emulate`` does not leave a job running.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import sys
from pathlib import Path

from runners.emulate.network import head_namespace, node_namespace, node_of_address

_PR_SET_PDEATHSIG = 1


def node_cpus(node: int, nodes: int) -> set[int]:
    """The cores node ``node`` of ``nodes`` may use: an equal share, round robin when nodes outnumber cores."""
    cores = sorted(os.sched_getaffinity(0))
    share = max(1, len(cores) // nodes)
    start = (node * share) % len(cores)
    return {cores[(start + k) % len(cores)] for k in range(share)}


def write_wrapper(directory: Path, prefix: str, nodes: int, pin: bool) -> Path:
    """The executable hydra gets as ``-launcher-exec``: this module with the cluster's prefix and size."""
    path = directory / "ssh"
    words = [sys.executable, "-m", "runners.emulate.launcher", prefix, str(nodes), "1" if pin else "0"]
    path.write_text("#!/bin/sh\nexec " + " ".join(shlex.quote(word) for word in words) + ' "$@"\n')
    path.chmod(0o700)
    return path


def _enter(namespace: str) -> None:
    from pyroute2 import netns

    netns.setns(namespace, flags=0)


def main(argv: list[str]) -> int:
    prefix = argv[0]
    if argv[1] == "--head":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        _enter(head_namespace(prefix))
        os.execvp(argv[2], argv[2:])
    nodes, pin, words = int(argv[1]), argv[2] == "1", argv[3:]
    while words and words[0].startswith("-"):  # ssh options hydra passes (-x: no X11 forwarding)
        words = words[1:]
    if len(words) < 2:
        print(f"sparse-dist emulate launcher: expected HOST COMMAND..., found {words!r}", file=sys.stderr)
        return 2
    node = node_of_address(words[0])
    _enter(node_namespace(prefix, node))
    if pin:
        os.sched_setaffinity(0, node_cpus(node, nodes))
    os.execvp("sh", ["sh", "-c", " ".join(words[1:])])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
