"""MPICH segments left by killed jobs are named, never removed, and a segment some process maps is not one."""

import mmap
from pathlib import Path

from runners.shm_leftovers import leftover_note, unmapped_segments


def test_only_segments_no_process_maps_are_named_and_none_is_removed(tmp_path: Path) -> None:
    left, used, other = tmp_path / "mpich_shm_dead_0", tmp_path / "mpich_shm_live_0", tmp_path / "not_mpich"
    for path in (left, used, other):
        path.write_bytes(b"\0" * 4096)
    with open(used, "r+b") as handle, mmap.mmap(handle.fileno(), 4096) as mapped:  # as a running rank maps it
        assert mapped[0] == 0
        assert unmapped_segments(tmp_path) == [left]
        note = leftover_note("train", tmp_path)
    assert note is not None and note.startswith("sparse-dist train: note: 1 MPICH shared-memory segment(s)")
    assert note.endswith(f"rm -f {left}") and str(used) not in note
    assert left.exists() and used.exists() and other.exists()  # named, not removed
    assert leftover_note("train", tmp_path / "empty") is None
