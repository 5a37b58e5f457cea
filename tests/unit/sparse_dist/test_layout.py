import numpy as np
import pytest

from sparse_dist.layout import Grid, RowLayout


def test_balanced_layout_gives_remainder_to_first_parts() -> None:
    layout = RowLayout.balanced(10, 4)
    assert layout.offsets == (0, 3, 6, 8, 10)
    assert layout.counts().tolist() == [3, 3, 2, 2]


def test_more_parts_than_rows_leaves_empty_parts() -> None:
    layout = RowLayout.balanced(2, 4)
    assert layout.counts().tolist() == [1, 1, 0, 0]
    assert layout.owner_of(np.array([0, 1])).tolist() == [0, 1]


def test_owner_of_skips_empty_parts() -> None:
    layout = RowLayout.from_counts([3, 0, 2, 0])
    assert layout.owner_of(np.arange(5)).tolist() == [0, 0, 0, 2, 2]


def test_owner_of_rejects_rows_outside_the_matrix() -> None:
    with pytest.raises(IndexError, match=r"\[0, 5\)"):
        RowLayout.from_counts([3, 2]).owner_of(np.array([5]))


@pytest.mark.parametrize("offsets", [(1, 3), (0, 4, 2), (0,)])
def test_invalid_offsets_are_refused(offsets: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="offsets"):
        RowLayout(offsets)


def test_grid_places_replicas_of_a_group_on_neighbouring_ranks() -> None:
    grid = Grid(6, 2)
    assert grid.groups == 3
    assert [grid.group_of(r) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [grid.replica_of(r) for r in range(6)] == [0, 1, 0, 1, 0, 1]
    assert grid.rank_of(2, 1) == 5
    assert grid.column_share(0) == [0, 2] and grid.column_share(1) == [1]
    # every column block is handled by exactly one replica
    assert sorted(grid.column_share(0) + grid.column_share(1)) == [0, 1, 2]


def test_replication_must_divide_world_size() -> None:
    with pytest.raises(ValueError, match="must divide"):
        Grid(6, 4)
