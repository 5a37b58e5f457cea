"""What a launched process (:mod:`sitecustomize`) and a zygote (:mod:`zygote`) both read: the command a Python
command line runs, and whole messages from a socket. Standard library only."""

from __future__ import annotations

import socket


def parse_command(orig_argv: list[str]) -> dict | None:
    """What ``python [-u] SCRIPT ARGS`` or ``python [-u] -m MODULE ARGS`` runs: ``kind`` (``path`` or
    ``module``), ``target``, the ``argv`` the program sees and ``unbuffered``; None for anything else (``-c``,
    other interpreter options, an interactive interpreter)."""
    rest, unbuffered = list(orig_argv[1:]), False
    while rest and rest[0] == "-u":
        rest.pop(0)
        unbuffered = True
    if rest and rest[0] == "-m" and len(rest) >= 2:
        return {"kind": "module", "target": rest[1], "argv": rest[1:], "unbuffered": unbuffered}
    if rest and not rest[0].startswith("-"):
        return {"kind": "path", "target": rest[0], "argv": rest, "unbuffered": unbuffered}
    return None


def receive_exactly(link: socket.socket, count: int) -> bytes | None:
    """``count`` bytes from ``link``, or None where the other end closed first."""
    data = b""
    while len(data) < count:
        piece = link.recv(count - len(data))
        if not piece:
            return None
        data += piece
    return data
