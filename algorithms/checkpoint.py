"""Checkpoint files: written atomically, verified by a SHA-256 of their payload.

Layout of a file: one header line ``SPARSE_DIST_CHECKPOINT 1 <sha256>\\n``
followed by the ``torch.save`` payload. Writing goes to a temporary name in
the same directory, then ``os.replace``; a reader refuses a file whose
header or digest does not match.
"""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path
from typing import Any

import torch

MAGIC = b"SPARSE_DIST_CHECKPOINT"
VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that is damaged, of another format, or of another run."""


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    path = Path(path)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    header = b"%s %d %s\n" % (MAGIC, VERSION, hashlib.sha256(payload).hexdigest().encode())
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temporary, "wb") as handle:
        handle.write(header)
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no checkpoint file")
    data = path.read_bytes()
    header, _, payload = data.partition(b"\n")
    fields = header.split(b" ")
    if len(fields) != 3 or fields[0] != MAGIC:
        raise CheckpointError(f"{path}: not a sparse_dist checkpoint (header {header[:40]!r})")
    if fields[1] != str(VERSION).encode():
        raise CheckpointError(f"{path}: checkpoint format {fields[1].decode()}, expected {VERSION}")
    digest = hashlib.sha256(payload).hexdigest().encode()
    if digest != fields[2]:
        raise CheckpointError(f"{path}: checksum mismatch (file damaged): sha256 {digest.decode()[:16]}..., "
                              f"header says {fields[2].decode()[:16]}...")
    try:
        return torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - refused types (pickle.UnpicklingError), a damaged archive, ...
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        reason = next((line for line in lines if "unsupported" in line.lower()), lines[0])  # torch: the refused type
        reason = reason.split(". ")[0].rstrip(".")
        raise CheckpointError(f"{path}: refused: not a checkpoint this version can read safely ({reason})") from None
