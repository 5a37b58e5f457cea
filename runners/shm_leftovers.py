"""MPICH's shared-memory segments that killed jobs left in ``/dev/shm``: found and named, never removed.

MPICH unlinks its ``/dev/shm/mpich_shm_*`` segments in ``MPI_Finalize``; a rank killed with ``kill -9`` leaves
them (about 2 MB each) until the node reboots. Their names do not say which job made them, and they are MPICH's
files, not the project's, so nothing here removes one: :func:`unmapped_segments` lists the segments of this user
that no process of this user maps (the running jobs' own segments are mapped by their ranks), and ``train``'s
rank 0 names them in one line with the command that removes them.
"""

from __future__ import annotations

import os
from pathlib import Path

SHM = Path("/dev/shm")
PATTERN = "mpich_shm_*"


def _mapped_paths(uid: int, directory: Path) -> set[str]:
    """Every file path in ``directory`` some process of ``uid`` maps (the processes this user may read)."""
    prefix = f"{directory}/"
    mapped: set[str] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            with open(entry / "maps", encoding="utf-8", errors="replace") as maps:
                mapped.update(line.split(None, 5)[5].strip() for line in maps if prefix in line)
        except (OSError, IndexError):
            continue  # a process that ended meanwhile, or one we may not read
    return mapped


def unmapped_segments(shm: Path = SHM) -> list[Path]:
    """This user's ``mpich_shm_*`` segments in ``shm`` that no process of this user maps (sorted)."""
    uid = os.getuid()
    try:
        mine = [path for path in shm.glob(PATTERN) if path.is_file() and not path.is_symlink()
                and path.stat().st_uid == uid]
    except OSError:
        return []
    if not mine:
        return []
    mapped = _mapped_paths(uid, shm)
    return sorted(path for path in mine if str(path) not in mapped)


def leftover_note(command: str, shm: Path = SHM) -> str | None:
    """One line naming the unmapped segments and how to remove them, or None when there are none."""
    found = unmapped_segments(shm)
    if not found:
        return None
    size = sum(path.stat().st_size for path in found if path.exists())
    return (f"sparse-dist {command}: note: {len(found)} MPICH shared-memory segment(s) in {shm} no process maps "
            f"({size / 2**20:.1f} MiB), left by killed MPI jobs; remove them with: rm -f "
            + " ".join(str(path) for path in found))
