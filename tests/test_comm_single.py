"""The communicator facade on one process (COMM_WORLD of size 1): accounting and checks."""

import numpy as np
import pytest
import torch

from sparse_dist.accounting import CommStats
from sparse_dist.comm import CollectiveError, _ring_allreduce_bytes, world


@pytest.fixture(scope="module")
def comm():
    communicator = world(gpu_aware="off")
    yield communicator
    communicator.free()


def test_ring_allreduce_bytes_use_array_split_chunks() -> None:
    assert _ring_allreduce_bytes(10, 3, 0, 4) == 2 * (10 - 4) * 4
    assert _ring_allreduce_bytes(10, 3, 2, 4) == 2 * (10 - 3) * 4
    assert _ring_allreduce_bytes(10, 1, 0, 4) == 0


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


def test_raise_if_any_names_the_failing_rank(comm) -> None:
    comm.raise_if_any(None)
    with pytest.raises(CollectiveError, match="rank 0: broken shard"):
        comm.raise_if_any("broken shard")


def test_unknown_phase_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown communication phase 'fwd'"):
        CommStats().add_bytes("fwd", 1, 1)


def test_allgather_array_shape(comm) -> None:
    out = comm.allgather_array(np.array([3, 4], dtype=np.int64))
    assert out.shape == (1, 2) and out.tolist() == [[3, 4]]
