"""Row layouts: who owns which rows, in 1D and on the 1.5D grid.

Rows are owned in contiguous ranges: part ``i`` owns ``[offsets[i],
offsets[i+1])``. A part may be empty. On the 1.5D grid (DESIGN section 3)
``P = G x c``: ``G = P / c`` row groups, each replicated on ``c`` ranks.
World rank ``g * c + r`` is replica ``r`` of row group ``g``, so the
replicas of one block row are neighbouring ranks (usually one node) and the
row-group allreduce stays local while broadcasts run in replica columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RowLayout:
    """Contiguous ownership ranges of ``n_rows`` rows over ``parts`` parts."""

    offsets: tuple[int, ...]

    def __post_init__(self) -> None:
        offsets = np.asarray(self.offsets, dtype=np.int64)
        if offsets.ndim != 1 or offsets.size < 2:
            raise ValueError(f"RowLayout.offsets needs at least 2 entries, got {self.offsets!r}")
        if offsets[0] != 0 or np.any(np.diff(offsets) < 0):
            raise ValueError(f"RowLayout.offsets must start at 0 and never decrease, got {self.offsets!r}")

    @classmethod
    def balanced(cls, n_rows: int, parts: int) -> "RowLayout":
        """The first ``n_rows % parts`` parts get one row more; parts beyond ``n_rows`` are empty."""
        if parts < 1 or n_rows < 0:
            raise ValueError(f"balanced layout needs parts >= 1 and n_rows >= 0, got {parts=} {n_rows=}")
        base, extra = divmod(n_rows, parts)
        counts = [base + (1 if i < extra else 0) for i in range(parts)]
        return cls.from_counts(counts)

    @classmethod
    def from_counts(cls, counts: list[int] | np.ndarray) -> "RowLayout":
        counts_arr = np.asarray(counts, dtype=np.int64)
        if np.any(counts_arr < 0):
            raise ValueError(f"row counts must be >= 0, got {list(counts_arr)}")
        return cls(tuple(int(x) for x in np.concatenate(([0], np.cumsum(counts_arr)))))

    @property
    def n_rows(self) -> int:
        return self.offsets[-1]

    @property
    def parts(self) -> int:
        return len(self.offsets) - 1

    def count(self, part: int) -> int:
        return self.offsets[part + 1] - self.offsets[part]

    def counts(self) -> np.ndarray:
        return np.diff(np.asarray(self.offsets, dtype=np.int64))

    def row_range(self, part: int) -> tuple[int, int]:
        return self.offsets[part], self.offsets[part + 1]

    def owner_of(self, rows: np.ndarray) -> np.ndarray:
        """The part owning each global row id (vectorised); ids must lie in ``[0, n_rows)``."""
        rows = np.asarray(rows)
        if rows.size and (rows.min() < 0 or rows.max() >= self.n_rows):
            raise IndexError(f"row ids must lie in [0, {self.n_rows}), got range [{rows.min()}, {rows.max()}]")
        return np.searchsorted(np.asarray(self.offsets[1:], dtype=np.int64), rows, side="right")


@dataclass(frozen=True)
class Grid:
    """The 1.5D process grid: ``world_size = groups * replication``.

    ``replication == 1`` is the 1D layout (every rank its own row group).
    """

    world_size: int
    replication: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world size must be >= 1, got {self.world_size}")
        if self.replication < 1 or self.world_size % self.replication != 0:
            raise ValueError(f"replication factor c={self.replication} must divide the number of ranks "
                             f"P={self.world_size}")

    @property
    def groups(self) -> int:
        """``G = P / c`` block rows."""
        return self.world_size // self.replication

    def group_of(self, rank: int) -> int:
        return rank // self.replication

    def replica_of(self, rank: int) -> int:
        return rank % self.replication

    def rank_of(self, group: int, replica: int) -> int:
        return group * self.replication + replica

    def column_share(self, replica: int) -> list[int]:
        """Column blocks (row groups) whose partial sums replica ``replica`` computes: ``j % c == replica``."""
        return [j for j in range(self.groups) if j % self.replication == replica]

    def replica_for_block(self, block: int) -> int:
        """The replica index that handles column block ``block``."""
        return block % self.replication
