"""The communicator facade on one process (COMM_WORLD of size 1): accounting and checks."""

import numpy as np
import pytest
import torch

from sparse_dist.accounting import CommStats, ring_allreduce_bytes
from sparse_dist.comm import (DEFAULT_REDUCE_SEGMENT_BYTES, CollectiveError, StagingPool, _reduce_segment_setting,
                              _segments, rank_ranges, ranked_messages, world)


@pytest.fixture(scope="module")
def comm():
    communicator = world(gpu_aware="off")
    yield communicator
    communicator.free()


def test_ring_allreduce_bytes_use_array_split_chunks() -> None:
    assert ring_allreduce_bytes(10, 3, 0, 4) == 2 * (10 - 4) * 4
    assert ring_allreduce_bytes(10, 3, 2, 4) == 2 * (10 - 3) * 4
    assert ring_allreduce_bytes(10, 1, 0, 4) == 0


def test_single_rank_collectives_move_no_bytes(comm) -> None:
    comm.stats.reset()
    t = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    comm.allreduce_(t, "grad_allreduce")
    comm.bcast_(t, root=0, phase="forward")
    assert t.tolist() == [[0, 1], [2, 3], [4, 5]]
    snap = comm.stats.snapshot()
    assert snap["grad_allreduce"]["bytes_sent"] == 0 and snap["forward"]["bytes_recv"] == 0
    assert snap["grad_allreduce"]["calls"] == 1 and snap["forward"]["calls"] == 1


def test_staging_path_round_trips_the_data() -> None:
    staged = world(gpu_aware="off", force_host_staging=True)
    send = torch.arange(8, dtype=torch.float64).reshape(4, 2)
    recv = torch.zeros_like(send)
    staged.alltoallv(send, [4], recv, [4], phase="other")
    assert torch.equal(recv, send)
    staged.free()


def test_alltoallv_rejects_counts_that_do_not_match_buffers(comm) -> None:
    with pytest.raises(ValueError, match="do not match the buffers"):
        comm.alltoallv(torch.zeros(3, 2), [2], torch.zeros(2, 2), [2], phase="other")


def test_unsupported_dtype_and_layout_are_named(comm) -> None:
    with pytest.raises(TypeError, match="bfloat16"):
        comm.bcast_(torch.zeros(2, dtype=torch.bfloat16), root=0, phase="forward")
    with pytest.raises(ValueError, match="contiguous"):
        comm.bcast_(torch.zeros(4, 4).t(), root=0, phase="forward")


def test_raise_if_any_says_the_message_and_marks_it_said_by_every_rank(comm) -> None:
    comm.raise_if_any(None)
    with pytest.raises(CollectiveError) as info:
        comm.raise_if_any("broken shard")
    assert str(info.value) == "broken shard"  # one rank: no rank list
    assert info.value.every_rank  # type: ignore[attr-defined]


def test_rank_ranges_are_compact() -> None:
    assert rank_ranges([3]) == "rank 3"
    assert rank_ranges([7, 0, 1, 2, 5, 8]) == "ranks 0-2, 5, 7-8"
    assert rank_ranges(range(1024)) == "ranks 0-1023"


def test_distinct_messages_are_said_once_each_with_their_ranks_and_capped() -> None:
    same = [(rank, "4 parts cannot be split over 8 row groups") for rank in range(8)]
    assert ranked_messages(same, 8) == "ranks 0-7: 4 parts cannot be split over 8 row groups"
    mixed = [(0, "a"), (1, "b"), (2, "a"), (3, "a")]
    assert ranked_messages(mixed, 4) == "ranks 0, 2-3: a; rank 1: b"
    many = [(rank, f"part {rank % 8} damaged") for rank in range(16)]
    assert ranked_messages(many, 16) == ("ranks 0, 8: part 0 damaged; ranks 1, 9: part 1 damaged; ranks 2, 10: part 2 "
                                         "damaged; ranks 3, 11: part 3 damaged; ranks 4, 12: part 4 damaged; and 3 "
                                         "more distinct messages (ranks 5-7, 13-15)")
    assert ranked_messages([(0, "x")], 1) == "x"


def test_unknown_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown communication phase 'fwd'"):
        CommStats().add_bytes("fwd", 1, 1)


def test_allgather_array_shape(comm) -> None:
    out = comm.allgather_array(np.array([3, 4], dtype=np.int64))
    assert out.shape == (1, 2) and out.tolist() == [[3, 4]]


def test_staging_pool_lends_each_buffer_once_and_reuses_it() -> None:
    pool = StagingPool()
    first = pool.acquire(6, torch.float32, pinned=False)
    second = pool.acquire(6, torch.float32, pinned=False)  # the first is still lent: a second buffer
    assert first.tensor.data_ptr() != second.tensor.data_ptr() and pool.allocations == 2
    pool.release(first)
    again = pool.acquire(6, torch.float32, pinned=False)
    assert again is first and pool.allocations == 2
    other = pool.acquire(6, torch.float64, pinned=False)  # another dtype is another key
    assert other is not second and pool.allocations == 3


def test_staging_pool_drops_oldest_idle_buffers_beyond_its_limit() -> None:
    pool = StagingPool(idle_limit_bytes=100)
    loans = [pool.acquire(n, torch.uint8, pinned=False) for n in (60, 50, 40)]
    for loan in loans:
        pool.release(loan)
    assert pool.idle_buffers == 2  # 60 + 50 > 100: the 60-byte one went first, then 50 + 40 <= 100
    assert pool.acquire(60, torch.uint8, pinned=False) is not loans[0] and pool.allocations == 4


def test_segments_cover_the_buffer_in_order() -> None:
    assert _segments(10, 4, 0) == [(0, 10)]
    assert _segments(10, 4, 40) == [(0, 10)]
    assert _segments(10, 4, 12) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert _segments(3, 8, 1) == [(0, 1), (1, 2), (2, 3)]  # a segment holds at least one element
    assert _segments(0, 8, 16) == [(0, 0)]


def test_reduce_segment_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARSE_DIST_REDUCE_SEGMENT_BYTES", raising=False)
    assert _reduce_segment_setting(None) == DEFAULT_REDUCE_SEGMENT_BYTES
    assert _reduce_segment_setting(123) == 123
    monkeypatch.setenv("SPARSE_DIST_REDUCE_SEGMENT_BYTES", "65536")
    assert _reduce_segment_setting(None) == 65536 and _reduce_segment_setting(0) == 0
    monkeypatch.setenv("SPARSE_DIST_REDUCE_SEGMENT_BYTES", "4M")
    with pytest.raises(ValueError, match="SPARSE_DIST_REDUCE_SEGMENT_BYTES"):
        _reduce_segment_setting(None)


def test_staged_exchange_starts_at_wait_or_test_and_returns_its_buffer() -> None:
    staged = world(gpu_aware="off", force_host_staging=True, reduce_segment_bytes=8)
    try:
        first = torch.arange(5, dtype=torch.float64)
        pending = staged.ibcast_(first, root=0, phase="forward")
        assert not pending._started  # deferred: the copy may overlap the caller's next kernel
        result = torch.full((5,), 2.0, dtype=torch.float64)
        later = staged.ireduce(None, result, root=0, phase="backward")  # 5 segments of one element
        assert pending._started and not later._started  # posting flushed the earlier one, in order
        assert later.test() and torch.equal(result, torch.full((5,), 2.0, dtype=torch.float64))
        pending.wait()
        assert staged.staging_pool.idle_buffers == 2
        snap = staged.stats.snapshot()
        assert snap["backward"]["calls"] == 1 and snap["forward"]["calls"] == 1
    finally:
        staged.free()


def test_split_child_shares_pool_and_settings() -> None:
    parent = world(gpu_aware="off", force_host_staging=True, reduce_segment_bytes=64)
    child = parent.split(0, 0)
    try:
        assert child.staging_pool is parent.staging_pool and child.reduce_segment_bytes == 64
        assert child.force_host_staging and child.gpu_path == parent.gpu_path
    finally:
        child.free()
        parent.free()


def test_waits_are_booked_apart_never_above_the_seconds_and_absorbed_with_the_rest() -> None:
    stats = CommStats()
    stats.add_seconds("forward", 1.0, 0.25)
    stats.add_seconds("forward", 0.1, 0.5)  # a wait cannot exceed the seconds it is part of
    stats.add_bytes("forward", 8, 4)
    counter = stats.counter("forward")
    assert counter.seconds == pytest.approx(1.1) and counter.wait_seconds == pytest.approx(0.35)
    assert stats.snapshot()["forward"]["wait_seconds"] == pytest.approx(0.35)
    total = CommStats()
    total.add_seconds("forward", 2.0, 1.0)
    total.absorb(stats)
    merged = total.counter("forward")
    assert (merged.seconds, merged.wait_seconds, merged.bytes_sent, merged.calls) == pytest.approx((3.1, 1.35, 8, 1))


def test_one_rank_has_no_partner_to_wait_for(comm) -> None:
    from sparse_dist.comm.heralds import (allreduce_herald, alltoallv_herald, bcast_herald, gather_herald,
                                          reduce_herald)
    mpi = comm._comm
    assert bcast_herald(mpi, 0) is reduce_herald(mpi, 0) is gather_herald(mpi, 0) is allreduce_herald(mpi) is None
    assert alltoallv_herald(mpi, np.array([3]), np.array([3])) is None
    comm.stats.reset()
    t = torch.ones(4)
    comm.allreduce_(t, "grad_allreduce")
    comm.ibcast_(t, 0, "forward").wait()
    snap = comm.stats.snapshot()
    assert snap["grad_allreduce"]["wait_seconds"] == snap["forward"]["wait_seconds"] == 0.0
