"""The mini-batch loader: seeds, the distributed sampler and the feature store, apart from the trainer.

PyG's split (a loader cutting seeds into batches, a sampler, a feature store): :class:`BatchLoader` cuts each
epoch's seeds into steps, samples their blocks (:class:`~sparse_dist.sampling.DistributedSampler`) and pulls
their input rows (:class:`~sparse_dist.fetch.FeatureFetcher`), and hands the trainer :class:`Batch` objects in
step order; with prefetch a worker thread (:class:`Prefetcher`) makes them ahead on its own communicator.
What each step does and why: :mod:`algorithms.minibatch.trainer`.

Collective: construction, :meth:`BatchLoader.make_batches`, :meth:`BatchLoader.batches` and
:meth:`BatchLoader.close`, every rank in the same order.
"""

from __future__ import annotations

import copy
import math
import queue
import threading
import time
from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp
import torch

from algorithms.minibatch.config import MinibatchConfig
from algorithms.training.metrics import counters_since
from sparse_dist.accounting import CommStats
from sparse_dist.comm import CollectiveError, Communicator, threads_may_call_mpi
from sparse_dist.fetch import FeatureFetcher, inclusion_estimate
from sparse_dist.layout import RowLayout
from sparse_dist.lossless_wire import WireRows
from sparse_dist.sampling import DistributedSampler, SampledBlock

__all__ = ["Batch", "BatchLoader", "Prefetcher", "step_groups"]


def step_groups(steps: int, size: int) -> list[list[int]]:
    """Steps ``0 .. steps-1`` in groups of ``size`` sampled together (the last may be shorter)."""
    return [list(range(first, min(first + size, steps))) for first in range(0, steps, size)]


class Batch:
    """One step's sampled blocks (layer order) and input rows, with the seconds making them took."""

    def __init__(self, step: int, seeds: np.ndarray, global_count: int, blocks: list[SampledBlock],
                 inputs: torch.Tensor, seconds: dict[str, float], cache: tuple[int, int]) -> None:
        self.step, self.seeds, self.global_count = step, seeds, global_count
        self.blocks, self.inputs, self.seconds, self.cache = blocks, inputs, seconds, cache
        self.moved: dict[str, dict[str, float]] | None = None  # counters of a prefetch worker's group


class BatchLoader:
    """This rank's batches of a mini-batch run (module docstring).

    ``rows``: this rank's rows of the normalised adjacency (global column ids; the full-graph run's, not
    normalised again); ``features``: its rows of ``X`` (``n_own x F``, the model's dtype and device);
    ``train``: its training mask; ``epochs``: how many epochs the run trains (the prefetch worker makes the
    next epoch's first batches only where there is one); ``wire``: the feature rows as they travel, where a
    narrower dtype holds them bitwise (:class:`~sparse_dist.fetch.FeatureFetcher`). Collective construction:
    the sampler, the training ids gathered, the feature cache pulled, the worker's communicator split.
    """

    def __init__(self, comm: Communicator, layout: RowLayout, rows: sp.csr_matrix, features: torch.Tensor,
                 train: np.ndarray, seed: int, epochs: int, minibatch: MinibatchConfig,
                 wire: WireRows | None = None) -> None:
        self.comm, self.layout, self.seed, self.epochs, self.minibatch = comm, layout, seed, epochs, minibatch
        self.first_row = int(layout.offsets[comm.rank])
        self.sampler = DistributedSampler(comm, layout, comm.rank, rows, minibatch.fanouts, seed,
                                          kernel=minibatch.sampler)  # compiled here: no JIT in a timed epoch
        own_train = np.flatnonzero(train).astype(np.int64) + self.first_row
        self.train_ids = np.sort(np.concatenate(comm.allgather_object(own_train)))
        self.global_batch = comm.size * minibatch.batch_size
        self.steps_per_epoch = max(1, math.ceil(self.train_ids.size / self.global_batch))
        self._order: tuple[int, np.ndarray] = (-1, np.zeros(0, dtype=np.int64))
        self.fetcher = FeatureFetcher(comm, layout, comm.rank, features, self._cache_choice(rows, own_train),
                                      wire=wire)
        self.worker_comm: Communicator | None = None
        self.prefetcher: Prefetcher | None = None
        if minibatch.prefetch > 0:
            if not threads_may_call_mpi():  # the same answer on every rank (one MPI library)
                raise CollectiveError("--prefetch needs an MPI library with MPI_THREAD_MULTIPLE")
            self.worker_comm = comm.split(0, comm.rank)  # collective
            self.worker_comm.stats = CommStats()  # its own counters: its bytes reach the epoch through its batches

    @property
    def groups(self) -> list[list[int]]:
        """An epoch's steps in the groups sampled together (``sample_batches`` each)."""
        return step_groups(self.steps_per_epoch, self.minibatch.sample_batches)

    def _cache_choice(self, rows: sp.csr_matrix, own_train: np.ndarray) -> np.ndarray:
        """The ``feature_cache`` remote rows most likely to be input rows of this rank's batches."""
        size = self.minibatch.feature_cache
        if size == 0:
            return np.zeros(0, dtype=np.int64)
        seed_p = np.zeros(rows.shape[0])
        seed_p[own_train - self.first_row] = min(1.0, self.global_batch / max(self.train_ids.size, 1))
        ids, probability = inclusion_estimate(rows, self.first_row, seed_p, self.minibatch.fanouts)
        last = self.first_row + rows.shape[0]
        remote = (ids < self.first_row) | (ids >= last)
        ids, probability = ids[remote], probability[remote]
        order = np.lexsort((ids, -probability))
        return ids[order[:size]]

    def batch_seeds(self, epoch: int, step: int) -> tuple[np.ndarray, int]:
        """This rank's seeds of global batch ``step`` of ``epoch`` (global ids) and the global batch's size."""
        if self._order[0] != epoch:  # one permutation per epoch (steps ask in order)
            self._order = (epoch, np.random.default_rng([self.seed, epoch, 0x6D62]).permutation(self.train_ids.size))
        order = self._order[1]
        batch = self.train_ids[order[step * self.global_batch:(step + 1) * self.global_batch]]
        last = self.first_row + self.layout.count(self.comm.rank)
        return batch[(batch >= self.first_row) & (batch < last)], int(batch.size)

    def make_batch(self, epoch: int, step: int) -> Batch:
        """Sample the blocks of one step and pull its input rows (collective)."""
        return self.make_batches(epoch, [step])[0]

    def make_batches(self, epoch: int, steps: list[int], sampler: DistributedSampler | None = None,
                     fetcher: FeatureFetcher | None = None) -> list[Batch]:
        """The batches of ``steps``, sampled together (one request round per hop for all of them), then ONE
        pull of their input rows. Each batch's ``sample`` and ``fetch`` seconds are the group's share (1 / K),
        so an epoch's sum is the time. Collective over the sampler's and fetcher's communicator (by default
        this loader's own; ``steps`` alike on every rank)."""
        sampler, fetcher = sampler or self.sampler, fetcher or self.fetcher
        seeds = [self.batch_seeds(epoch, step) for step in steps]
        start = time.perf_counter()
        blocks = sampler.sample_many([mine for mine, _ in seeds], epoch, steps)
        share = (time.perf_counter() - start) / len(steps)
        start = time.perf_counter()
        inputs = self._fetch_inputs(fetcher, [batch_blocks[0].src for batch_blocks in blocks])
        fetch_share = (time.perf_counter() - start) / len(steps)
        cache = [(fetcher.last_needed, fetcher.last_hits)] + [(0, 0)] * (len(steps) - 1)  # the group's, once
        return [Batch(step, mine, global_count, batch_blocks, rows, {"sample": share, "fetch": fetch_share}, hits)
                for step, (mine, global_count), batch_blocks, rows, hits in zip(steps, seeds, blocks, inputs, cache)]

    @staticmethod
    def _fetch_inputs(fetcher: FeatureFetcher, sources: list[np.ndarray]) -> list[torch.Tensor]:
        """The input rows of each batch (``sources[b]``: its layer-0 source ids): ONE pull for the group, of
        the distinct ids of all of them (collective). Each batch's rows are copied out of the group's, so
        they are bitwise what a pull of its own would give."""
        if len(sources) == 1:
            return [fetcher.fetch(sources[0])]
        distinct = np.unique(np.concatenate(sources))
        rows = fetcher.fetch(distinct)
        return [rows.index_select(0, torch.from_numpy(np.searchsorted(distinct, src)).to(rows.device))
                for src in sources]

    def batches(self, epoch: int, waited: list[float]) -> Iterator[Batch]:
        """The epoch's batches in step order; with prefetch, made ahead by a worker thread that runs on into
        the next epoch's first batches (collective). ``waited[0]`` gathers the seconds blocked on its queue."""
        if self.worker_comm is None:
            for group in self.groups:
                yield from self.make_batches(epoch, group)
            return
        if self.prefetcher is None:
            self.prefetcher = Prefetcher(self, self.worker_comm)
        yield from self.prefetcher.epoch(epoch, waited)

    def cache_bytes(self) -> int:
        """Bytes of the feature cache's rows."""
        values = self.fetcher.cache_values
        return int(values.numel() * values.element_size())

    def close(self) -> None:
        """Drain the prefetch worker and free its communicator, its counters added to the loader's (so the
        run's totals hold its bytes, a prefix made but left untrained too). Collective."""
        if self.prefetcher is not None:
            self.prefetcher.close()
            self.prefetcher = None
        if self.worker_comm is None:
            return
        self.comm.stats.absorb(self.worker_comm.stats)
        self.worker_comm.stats = CommStats()
        self.worker_comm.free()
        self.worker_comm = None


class Prefetcher:
    """A worker thread that makes batches ahead (sample and fetch) on its own communicator, across epochs.

    The worker does only what it is granted, in order, and a grant is given on every rank at the same point
    (deterministic), so every rank's worker runs the same collectives and none can wait for another that
    stopped: when epoch ``e`` begins, the rest of ``e`` and the first ``ceil(N / K)`` groups (about ``N``
    batches, ``N`` = ``--prefetch``) of ``e + 1`` are granted, the latter only if ``e + 1`` is an epoch the
    run will train. So the next epoch's first batches are sampled and fetched while the last ones of this
    epoch train and while the run evaluates. :meth:`close` grants nothing more and drains the queue until the
    worker has finished what it was granted (a run that stops early loses at most the granted prefix).

    Bytes: the worker's communicator keeps its own counters (so an evaluation beside it counts only its own
    bytes); the bytes of each group are handed to the epoch that trains its batches (``Batch.moved``, on the
    group's first batch), so an epoch's bytes are those of its own batches, as without prefetch.
    """

    def __init__(self, loader: BatchLoader, comm: Communicator) -> None:
        self.loader, self.comm = loader, comm
        self.sampler, self.fetcher = copy.copy(loader.sampler), copy.copy(loader.fetcher)
        self.sampler.comm = self.fetcher.comm = comm
        self.ready: queue.Queue[Batch | BaseException] = queue.Queue(maxsize=loader.minibatch.prefetch)
        self.grants: queue.Queue[tuple[int, list[list[int]]] | None] = queue.Queue()
        self.granted: dict[int, int] = {}  # epoch -> groups granted so far
        self.failed = False
        self.thread = threading.Thread(target=self._work, name="minibatch-prefetch", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        try:
            while (grant := self.grants.get()) is not None:
                epoch, groups = grant
                for group in groups:
                    before = self.comm.stats.snapshot()
                    made = self.loader.make_batches(epoch, group, self.sampler, self.fetcher)
                    made[0].moved = counters_since(self.comm, before)
                    for batch in made:
                        self.ready.put(batch)
        except BaseException as exc:  # handed to the main thread, which raises it
            self.failed = True
            self.ready.put(exc)

    def _grant(self, epoch: int, up_to: int) -> None:
        done = self.granted.get(epoch, 0)
        if up_to > done:
            self.grants.put((epoch, self.loader.groups[done:up_to]))
            self.granted[epoch] = up_to

    def epoch(self, epoch: int, waited: list[float]) -> Iterator[Batch]:
        """The batches of ``epoch`` in step order (collective, through the worker)."""
        loader = self.loader
        groups = len(loader.groups)
        self._grant(epoch, groups)
        if epoch + 1 < loader.epochs:
            self._grant(epoch + 1, min(groups, -(-loader.minibatch.prefetch // loader.minibatch.sample_batches)))
        for _ in range(loader.steps_per_epoch):
            start = time.perf_counter()
            item = self.ready.get()
            waited[0] += time.perf_counter() - start
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Grant nothing more; take what the worker still makes until it has done its grants; join it."""
        self.grants.put(None)
        while self.thread.is_alive() or not self.ready.empty():
            try:
                self.ready.get(timeout=0.05)
            except queue.Empty:
                pass
        self.thread.join()
