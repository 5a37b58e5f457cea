"""Communicator facade (see :mod:`sparse_dist.comm.communicator`); the split into rooms follows."""

from sparse_dist.comm.communicator import *  # noqa: F401,F403
from sparse_dist.comm.communicator import _reduce_segment_setting, _segments  # noqa: F401 (tests import them)
