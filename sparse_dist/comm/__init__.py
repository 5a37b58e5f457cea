"""Communicator facade: the only package of the project that imports mpi4py.

A :class:`Communicator` wraps a ``Dup`` of an MPI communicator (so library
messages never meet user messages) and offers the handful of collectives the
project uses, on torch tensors, each counting its bytes and time under a
phase name (:mod:`sparse_dist.accounting`).

Byte convention (logical volume, independent of the algorithm the MPI
library picks, so that counts can be predicted exactly from the layout):

* ``bcast`` of ``n`` bytes in a group of ``g`` ranks: the root sends
  ``n * (g - 1)``, every other rank receives ``n``.
* ``reduce`` (the transpose of a broadcast): every non-root rank sends ``n``,
  the root receives ``n * (g - 1)``. A reduce split into segments (below)
  counts as one call with the same totals.
* ``alltoallv``: the bytes addressed to / arriving from other ranks (the
  rank's own segment is never counted).
* ``allreduce`` of ``m`` elements: ring reduce-scatter plus allgather with
  chunks ``numpy.array_split(m, g)``; rank ``k`` sends and receives
  ``2 * (m - chunk_k) * itemsize``.

Time: the seconds a rank spends inside MPI calls (posting, starting and
waiting), i.e. the exchange time not hidden behind local work.

Waits: of those seconds, the part a rank spends waiting for partners that have not posted the exchange yet
is booked apart (``wait_seconds`` in :mod:`sparse_dist.accounting`), so that load imbalance and the transfer
itself are told apart. Every non-blocking exchange (and the blocking ones built on them: ``bcast_``,
``alltoallv``, ``allreduce_``) is preceded, on the same communicator, by a one-element herald with the
exchange's own pattern (:mod:`~sparse_dist.comm.heralds`), started right before the exchange (after its device
copies). ``wait`` waits for the herald first: those seconds are the wait, the rest (posting, copies, the
transfer after the last partner arrived) the rank's own. A ``test`` that finds the herald complete books no
wait: the partners posted while the rank computed. No extra blocking call: the herald is waited for only where
the exchange is, and, posted just before the exchange's own messages, it arrives no later than they do. Limits:
the wait includes one small message's latency (its floor on a balanced run; over a slow link with high latency
that latency shows as wait); it follows the exchange's logical pattern, so where the MPI library's algorithm
makes a rank also depend on others (MPICH's large-message broadcast at 8 ranks or more is a scatter then an
allgather among all ranks, its large reduce a reduce-scatter then a gather), a late non-root shows in the
others' own time; in a tree (small broadcasts, reduces) a late inner rank's lateness is its subtree's wait.
Blocking metadata gathers (``allgather_array``, ``allgather_object``, ``barrier``) are not split.

Initialisation: importing this package does not start MPI; the first
:func:`world` (or anything else that needs the world) does, with
``MPI_THREAD_MULTIPLE`` as mpi4py would, and mpi4py finalises it at exit.
So the single-process tools (``sparse-dist sweep``, ``plot``, ``model``),
which import the library, never become MPI singletons, and the ``mpiexec``
or ``srun`` jobs they launch inherit no MPI state.

Devices (``gpu_aware``): CPU tensors go to MPI as numpy views. CUDA tensors
are handed to MPI as device buffers when ``gpu_aware`` is ``'auto'`` and the
library reports CUDA support, ``'on'`` (which refuses, with
:class:`GpuAwareError` before any collective, a library that reports none)
or ``'force'`` (no check); MPI starts only after an event recorded on the
producing stream has completed. Otherwise (``'off'``, or ``'auto'`` without
support) they are staged through host memory:

* Host buffers come from a :class:`StagingPool` shared by a communicator and
  its ``split`` children: allocated once per ``(numel, dtype, pinned)`` and
  reused, pinned for CUDA sources. A buffer is lent to one exchange and
  returns when that exchange completes, so outstanding requests never share.
* The device-to-host copy of a buffer MPI reads runs ``non_blocking`` on a
  side stream (one per communicator and device, created lazily) that waits
  on an event recorded on the producer's current stream; MPI waits for that
  copy's event only, never for the whole device. Received data goes back
  ``non_blocking`` on the side stream after completion, the current stream
  waits on that copy's event, and the pool synchronises the event before it
  lends the host buffer again.
* Deferred starts: a staged exchange is not started in MPI when it is
  posted, so the copy overlaps the caller's next kernel (the plans post an
  exchange, then multiply the local block). It starts at the next call into
  any communicator of this process (a post, a blocking collective, or
  ``wait``/``test`` of any :class:`Pending`), after every exchange posted
  before it: one process-wide FIFO keeps starts in post order, which is the
  same on every rank, as MPI requires for collectives; being process-wide,
  a deferred start can never sit behind a blocking call on another
  communicator. Unstaged exchanges start at once (after that FIFO).

``force_host_staging=True`` (or the environment switch
``SPARSE_DIST_FORCE_HOST_STAGING=1``, read when a world communicator is
made, e.g. to benchmark the fallback with ``sparse-dist bench``) sends CPU
tensors through the same staging path (ordinary host memory, synchronous
copies, same pool, deferral and write-back), which is how the fallback is
tested on machines without a GPU.

Segmented reduce: :meth:`Communicator.ireduce` of more than
``reduce_segment_bytes`` (default :data:`DEFAULT_REDUCE_SEGMENT_BYTES`,
environment ``SPARSE_DIST_REDUCE_SEGMENT_BYTES``; 0 turns it off) posts one
``Ireduce`` per contiguous slice of the flat buffer, all in flight at once,
behind one :class:`Pending`: MPICH reduces a large message far more slowly
than the same bytes as a few MiB pieces. The setting must be the same on
every rank (a world communicator checks this when it is made).

Rooms (the public names above are re-exported here, so callers import them
from ``sparse_dist.comm``): :mod:`~sparse_dist.comm.startup` (starting MPI,
the library's identity), :mod:`~sparse_dist.comm.cuda_aware` (CUDA-aware
detection and the ``gpu_aware`` decision), :mod:`~sparse_dist.comm.staging`
(the host staging pool), :mod:`~sparse_dist.comm.requests` (:class:`Pending`
and the deferred starts), :mod:`~sparse_dist.comm.heralds` (the heralds of "Waits"),
:mod:`~sparse_dist.comm.buffers` (tensors as MPI buffers: datatypes, host staging, copy streams),
:mod:`~sparse_dist.comm.layouts` (collective argument checks, alltoallv counts, reduce segments),
:mod:`~sparse_dist.comm.communicator`
(:class:`Communicator`, :func:`world`), :mod:`~sparse_dist.comm.progress`
(:class:`ProgressThread`), :mod:`~sparse_dist.comm.node` (ranks per node,
the default thread count) and :mod:`~sparse_dist.comm.abort`
(:func:`run_or_abort`, user errors, rank ranges).
"""

from sparse_dist.comm.abort import (ABORT_GRACE_SECONDS, DISTINCT_MESSAGES_SHOWN, SIGNAL_GRACE_SECONDS,
                                    USER_ERROR_STATUS, CollectiveError, rank_ranges, ranked_messages, run_or_abort,
                                    said_once)
# _reduce_segment_setting and _segments are private; tests/unit/sparse_dist/test_comm_single.py imports them from here.
from sparse_dist.comm.communicator import (DEFAULT_REDUCE_SEGMENT_BYTES, REDUCE_SEGMENT_ENV, Communicator,  # noqa: F401
                                           _reduce_segment_setting, world)
from sparse_dist.comm.layouts import _segments  # noqa: F401
from sparse_dist.comm.cuda_aware import (GPU_AWARE_SETTINGS, CudaAwareness, GpuAwareError, detect_cuda_aware_mpi,
                                         gpu_path_report)
from sparse_dist.comm.node import default_threads_per_rank, ranks_on_this_node, spans_nodes
from sparse_dist.comm.progress import ProgressThread
from sparse_dist.comm.requests import Pending
from sparse_dist.comm.staging import FORCE_HOST_STAGING_ENV, STAGING_IDLE_LIMIT_BYTES, StagingPool
from sparse_dist.comm.startup import (mpi_library_version, mpi_vendor_details, separate_endpoints,
                                     threads_may_call_mpi, world_rank)

__all__ = [
    "ABORT_GRACE_SECONDS", "DEFAULT_REDUCE_SEGMENT_BYTES", "DISTINCT_MESSAGES_SHOWN", "FORCE_HOST_STAGING_ENV",
    "GPU_AWARE_SETTINGS", "REDUCE_SEGMENT_ENV", "SIGNAL_GRACE_SECONDS", "STAGING_IDLE_LIMIT_BYTES",
    "USER_ERROR_STATUS", "CollectiveError", "Communicator", "CudaAwareness", "GpuAwareError", "Pending",
    "ProgressThread", "StagingPool", "default_threads_per_rank", "detect_cuda_aware_mpi", "gpu_path_report",
    "mpi_library_version", "mpi_vendor_details", "rank_ranges", "ranked_messages", "said_once", "ranks_on_this_node",
    "run_or_abort", "separate_endpoints", "spans_nodes", "threads_may_call_mpi", "world", "world_rank",
]
