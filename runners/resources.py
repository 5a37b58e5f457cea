"""Memory and disk a command will need, estimated from ``meta.json`` counts and the flags before any work."""

from __future__ import annotations


class ResourceError(ValueError):
    """The estimated memory or disk need exceeds what the machine has; the message names the flag that helps."""
