"""Whether this machine can run ``sparse-dist emulate`` (root, pyroute2, network namespaces): the skip
reason the emulated tests share."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CLONE_NEWNET = 0x40000000


def namespaces_unavailable() -> str | None:
    """Why this machine cannot make network namespaces (None if it can), probed in a throwaway process."""
    if os.geteuid() != 0:
        return f"not root (uid {os.geteuid()}): emulate needs root for network namespaces"
    try:
        import pyroute2  # noqa: F401
    except ImportError:
        return "pyroute2 is not installed (pip install 'sparse-dist[emulate]')"
    probe = "import ctypes, sys; sys.exit(ctypes.CDLL(None, use_errno=True).unshare(%d) != 0)" % CLONE_NEWNET
    if subprocess.run([sys.executable, "-c", probe], timeout=30).returncode != 0:
        return "this machine refuses unshare(CLONE_NEWNET)"
    return None


NO_NAMESPACES = namespaces_unavailable()
needs_namespaces = pytest.mark.skipif(NO_NAMESPACES is not None, reason=str(NO_NAMESPACES))
