"""Sampled mini-batch training over the same shards (DESIGN section 10; DistDGL's synchronous SGD).

Decisions (docs/guide/minibatch.md says the same for users):

* Seeds: the global ids of every training node, sorted, are permuted by a generator seeded with
  ``(seed, epoch)``; the permutation is cut into global batches of ``P * batch_size``. Rank ``r`` trains, in
  step ``s``, on the seeds of global batch ``s`` that it owns (possibly none: it still joins every
  collective). Every rank knows the global count, so all agree on ``ceil(n_train / (P * batch_size))``
  steps per epoch without talking. The same global batch size gives the same batches whatever ``P``.
* Loss: summed over the rank's seeds and divided by the global batch's size; one flat allreduce of the
  gradients (and the loss) per step; Adam updates the replicated weights alike everywhere.
* Model: the full-graph :class:`algorithms.model.GraphModel` and its layers; each layer multiplies its
  sampled block (:mod:`sparse_dist.sampling`) instead of the distributed SpMM. Dropout masks are drawn per
  global row (:mod:`algorithms.dropout`) with ``epoch * steps_per_epoch + step`` as their epoch, so one
  batch per epoch at epoch 0 uses the full-graph epoch-0 masks. GAT is refused (its attention needs the
  exchanged rows' structure, which the sampled blocks do not carry).
* Evaluation: exact and full-graph, by the full-graph :class:`algorithms.train.Trainer` sharing the
  weights (so time-to-accuracy compares like with like). Building it costs what a full-graph run's set-up
  costs (normalisation, plans, perhaps a layer-0 halo).
* Sampling kernel (``minibatch.sampler``): the compiled per-row one (numba) unless ``numpy`` is asked for or
  numba is missing; compiled when the trainer is built (or loaded from numba's cache), on torch's thread
  count of that moment (the train command's ``--threads``). Both kernels draw the same blocks, bitwise.
* Step breakdown (seconds, summed over the epoch's steps): ``sample``, ``fetch``, ``compute`` (forward,
  backward, optimiser), ``allreduce`` (gradient allreduce), ``wait`` (0 without prefetch).
* Prefetch (``prefetch = N > 0``; ByteGNN's overlap of sampling with training): a worker thread
  (:class:`Prefetcher`) samples and fetches batches in order on its own duplicate of the communicator
  (``MPI_THREAD_MULTIPLE``), into a queue of at most ``N`` finished batches, while the main thread trains;
  ``wait`` is the main thread's time blocked on the queue, and ``sample``/``fetch`` are the worker's seconds
  (overlapped). It runs across epoch boundaries: when epoch ``e`` starts, the worker is granted the rest of
  ``e`` and the first ``ceil(N / K)`` groups of ``e + 1`` (if the run trains ``e + 1``), so the next epoch's
  first batches are made while this epoch's last ones train and while the run evaluates (on the main
  communicator, beside the worker's). Grants are given at the same point on every rank, so every worker
  runs the same collectives; :meth:`close` drains what was granted. The worker's communicator has its own
  counters and each group's bytes travel with its first batch to the epoch that trains it, so each epoch's
  bytes are its own batches' and an evaluation's are its own. Batches are pure functions of (seed, epoch,
  step), so the run is bitwise the unpipelined one. Of ByteGNN's two-level scheduling it keeps only the
  coarse level with a fixed depth (how many batches may be ready ahead); no DAG of sub-tasks, no
  adaptive launch score.
* Bulk sampling (``sample_batches = K``; DistDGL's and ByteGNN's k-batch step): the epoch's steps are
  sampled in groups of ``K`` (the last group may be shorter), one request round per hop for the whole group
  (:meth:`DistributedSampler.sample_many`), then ONE feature pull for the group: the distinct input rows of
  all ``K`` batches (a row two batches need travels once), each batch's rows copied out of it. Batches are
  bitwise those of ``K = 1``; each batch's ``sample`` and ``fetch`` seconds are the group's share (1 / K);
  the epoch record's ``feature_cache`` counts a group's distinct remote rows once. With prefetch the worker
  makes a group at once, so up to ``K`` batches are made ahead of the queue's ``N``.

Collective: construction, :meth:`MinibatchTrainer.train_epoch`, :meth:`MinibatchTrainer.evaluate` and
:meth:`MinibatchTrainer.step_gradients`, every rank in the same order.
"""

from __future__ import annotations

import copy
import math
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from algorithms.dropout import GlobalRowDropout
from algorithms.layers import layer_type
from algorithms.minibatch.config import MinibatchConfig
from algorithms.train import LocalGraph, TrainConfig, Trainer, bytes_by_phase
from algorithms.training.metrics import counters_since
from sparse_dist.accounting import CommStats
from sparse_dist.comm import CollectiveError, Communicator, threads_may_call_mpi
from sparse_dist.exchange import ExchangeContext
from sparse_dist.fetch import FeatureFetcher, inclusion_estimate
from sparse_dist.sampling import DistributedSampler, SampledBlock

__all__ = ["Batch", "MinibatchTrainer", "minibatch_problem"]


def minibatch_problem(config: TrainConfig, minibatch: MinibatchConfig) -> str | None:
    """Why this configuration cannot train in mini-batches, or None (decided from flags alone)."""
    if layer_type(config.model).takes_operator:
        return (f"--mode minibatch trains GCN and SAGE; --model {config.model} needs the exchanged rows' "
                f"structure, which sampled blocks do not carry")
    if len(minibatch.fanouts) != config.layers:
        return (f"--fanouts gives {len(minibatch.fanouts)} hop(s) but --layers is {config.layers}: give one "
                f"fanout per layer")
    if config.replication != 1:
        return f"--mode minibatch samples from row owners: it needs --replication 1, got {config.replication}"
    if str(config.sample) != "none" or str(config.stale) != "none":
        return "--mode minibatch exchanges no boundary rows: --sample and --stale must stay none"
    if config.compress != "none":
        return "--mode minibatch does not compress (its gradients travel exactly): leave --compress none"
    return None


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


class Prefetcher:
    """A worker thread that makes batches ahead (sample and fetch) on its own communicator, across epochs.

    The worker does only what it is granted, in order, and a grant is given on every rank at the same point
    (deterministic), so every rank's worker runs the same collectives and none can wait for another that
    stopped: when epoch ``e`` begins, the rest of ``e`` and the first ``ceil(N / K)`` groups (about ``N``
    batches, ``N`` = ``--prefetch``) of ``e + 1`` are granted, the latter only if ``e + 1`` is an epoch the
    run will train (``config.epochs``). So the next epoch's first batches are sampled and fetched while the
    last ones of this epoch train and while the run evaluates. :meth:`close` grants nothing more and drains
    the queue until the worker has finished what it was granted (a run that stops early loses at most the
    granted prefix).

    Bytes: the worker's communicator keeps its own counters (so an evaluation beside it counts only its own
    bytes); the bytes of each group are handed to the epoch that trains its batches (``Batch.moved``, on the
    group's first batch), so an epoch's bytes are those of its own batches, as without prefetch.
    """

    def __init__(self, trainer: "MinibatchTrainer", comm: Communicator) -> None:
        self.trainer, self.comm = trainer, comm
        self.sampler, self.fetcher = copy.copy(trainer.sampler), copy.copy(trainer.fetcher)
        self.sampler.comm = self.fetcher.comm = comm
        self.ready: queue.Queue[Batch | BaseException] = queue.Queue(maxsize=trainer.minibatch.prefetch)
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
                    made = self.trainer.make_batches(epoch, group, self.sampler, self.fetcher)
                    made[0].moved = counters_since(self.comm, before)
                    for batch in made:
                        self.ready.put(batch)
        except BaseException as exc:  # handed to the main thread, which raises it
            self.failed = True
            self.ready.put(exc)

    def _grant(self, epoch: int, up_to: int) -> None:
        groups = step_groups(self.trainer.steps_per_epoch, self.trainer.minibatch.sample_batches)
        done = self.granted.get(epoch, 0)
        if up_to > done:
            self.grants.put((epoch, groups[done:up_to]))
            self.granted[epoch] = up_to

    def epoch(self, epoch: int, waited: list[float]) -> Iterator[Batch]:
        """The batches of ``epoch`` in step order (collective, through the worker)."""
        trainer = self.trainer
        groups = len(step_groups(trainer.steps_per_epoch, trainer.minibatch.sample_batches))
        self._grant(epoch, groups)
        if epoch + 1 < trainer.config.epochs:
            self._grant(epoch + 1, min(groups, -(-trainer.minibatch.prefetch // trainer.minibatch.sample_batches)))
        for _ in range(trainer.steps_per_epoch):
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


class MinibatchTrainer:
    """Mini-batch training of a :class:`GraphModel` shared with a full-graph :class:`Trainer` (evaluation)."""

    def __init__(self, comm: Communicator, graph: LocalGraph, config: TrainConfig, minibatch: MinibatchConfig,
                 device: str | torch.device = "cpu") -> None:
        problem = minibatch_problem(config, minibatch)
        if problem:
            raise ValueError(problem)
        built_from = comm.stats.snapshot()
        self.comm, self.graph, self.config, self.minibatch = comm, graph, config, minibatch
        self.full = Trainer(comm, graph, config, device)  # exact evaluation; its model and optimiser are ours
        self.model, self.optimizer, self.device, self.dtype = (self.full.model, self.full.optimizer,
                                                               self.full.device, self.full.dtype)
        self.group = comm.rank
        self.first_row = int(graph.layout.offsets[self.group])
        normalized = layer_type(config.model).normalize_adjacency(comm, graph.layout, graph.rows, self.group)
        self.sampler = DistributedSampler(comm, graph.layout, self.group, normalized, minibatch.fanouts, config.seed,
                                          kernel=minibatch.sampler)  # compiled here: no JIT in a timed epoch
        own_train = np.flatnonzero(graph.masks["train"]).astype(np.int64) + self.first_row
        self.train_ids = np.sort(np.concatenate(comm.allgather_object(own_train)))
        self.global_batch = comm.size * minibatch.batch_size
        self.steps_per_epoch = max(1, math.ceil(self.train_ids.size / self.global_batch))
        self._order: tuple[int, np.ndarray] = (-1, np.zeros(0, dtype=np.int64))
        self.fetcher = FeatureFetcher(comm, graph.layout, self.group, self.full.features,
                                      self._cache_choice(normalized, own_train))
        self.worker_comm: Communicator | None = None
        self._prefetcher: Prefetcher | None = None
        if minibatch.prefetch > 0:
            if not threads_may_call_mpi():  # the same answer on every rank (one MPI library)
                raise CollectiveError("--prefetch needs an MPI library with MPI_THREAD_MULTIPLE")
            self.worker_comm = comm.split(0, comm.rank)  # collective
            self.worker_comm.stats = CommStats()  # its own counters: its bytes reach the epoch through its batches
        self.epoch = 0
        self.setup_bytes = bytes_by_phase({phase: {k: v - built_from[phase][k] for k, v in counters.items()}
                                           for phase, counters in comm.stats.snapshot().items()})

    # --------------------------------------------------------------- set-up
    def _cache_choice(self, normalized: Any, own_train: np.ndarray) -> np.ndarray:
        """The ``feature_cache`` remote rows most likely to be input rows of this rank's batches."""
        size = self.minibatch.feature_cache
        if size == 0:
            return np.zeros(0, dtype=np.int64)
        seed_p = np.zeros(normalized.shape[0])
        seed_p[own_train - self.first_row] = min(1.0, self.global_batch / max(self.train_ids.size, 1))
        ids, probability = inclusion_estimate(normalized, self.first_row, seed_p, self.minibatch.fanouts)
        last = self.first_row + normalized.shape[0]
        remote = (ids < self.first_row) | (ids >= last)
        ids, probability = ids[remote], probability[remote]
        order = np.lexsort((ids, -probability))
        return ids[order[:size]]

    # ---------------------------------------------------------------- seeds
    def batch_seeds(self, epoch: int, step: int) -> tuple[np.ndarray, int]:
        """This rank's seeds of global batch ``step`` of ``epoch`` (global ids) and the global batch's size."""
        if self._order[0] != epoch:  # one permutation per epoch (steps ask in order)
            self._order = (epoch, np.random.default_rng([self.config.seed, epoch, 0x6D62]).permutation(
                self.train_ids.size))
        order = self._order[1]
        batch = self.train_ids[order[step * self.global_batch:(step + 1) * self.global_batch]]
        last = self.first_row + self.graph.layout.count(self.group)
        return batch[(batch >= self.first_row) & (batch < last)], int(batch.size)

    def make_batch(self, epoch: int, step: int, sampler: DistributedSampler | None = None,
                   fetcher: FeatureFetcher | None = None) -> Batch:
        """Sample the blocks of one step and fetch its input rows (collective over the sampler's and
        fetcher's communicator; by default this trainer's own)."""
        return self.make_batches(epoch, [step], sampler, fetcher)[0]

    def make_batches(self, epoch: int, steps: list[int], sampler: DistributedSampler | None = None,
                     fetcher: FeatureFetcher | None = None) -> list[Batch]:
        """The batches of ``steps``, sampled together (one request round per hop for all of them), then their
        input rows fetched batch by batch. Each batch's ``sample`` seconds are the round's share (1 / K), so an
        epoch's sum is the sampling time. Collective (``steps`` alike on every rank)."""
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
        the next epoch's first batches (collective).

        ``waited[0]`` gathers the seconds the caller spent blocked on the queue.
        """
        if self.worker_comm is None:
            for group in step_groups(self.steps_per_epoch, self.minibatch.sample_batches):
                yield from self.make_batches(epoch, group)
            return
        if self._prefetcher is None:
            self._prefetcher = Prefetcher(self, self.worker_comm)
        yield from self._prefetcher.epoch(epoch, waited)

    # -------------------------------------------------------------- compute
    def forward(self, batch: Batch, dropout_epoch: int, training: bool) -> torch.Tensor:
        """Logits of this rank's seeds (``len(seeds) x C``); local, no communication."""
        p = self.config.dropout
        dropout = GlobalRowDropout(p, self.config.seed, dropout_epoch, 0) if training and p > 0 else None
        scale = dropout.scale if dropout is not None else 1.0
        h = batch.inputs
        for index, (layer, block) in enumerate(zip(self.model.layers, batch.blocks)):
            if index > 0:
                activation = self.model.layers[index - 1].activation
                h = F.elu(h) if activation == "elu" else torch.relu(h)
            if dropout is not None:
                h = h * dropout.rows_mask(index, block.src, h)
            operator = block.operator(self.dtype, self.device)
            context = ExchangeContext(epoch=dropout_epoch, layer=index, training=training,
                                      halo_rows=block.src.size - block.dst.size)
            h = layer(h, lambda values, _context, product=operator: product(values), context, scale)
        return h

    def _loss_sum(self, logits: torch.Tensor, seeds: np.ndarray) -> torch.Tensor:
        rows = torch.from_numpy(seeds - self.first_row).to(self.device)
        labels = self.full.labels.index_select(0, rows)
        if self.graph.multilabel:
            return F.binary_cross_entropy_with_logits(logits, labels, reduction="sum") / self.graph.num_classes
        return F.cross_entropy(logits, labels, reduction="sum")

    def step_gradients(self, batch: Batch, dropout_epoch: int, training: bool = True) -> float:
        """Forward and backward of one batch, gradients allreduced into ``p.grad``; returns the global loss.

        Collective (one allreduce, over the full-graph trainer's replica column: all ranks, as c = 1). The
        optimiser is not stepped (what the exactness tests compare).
        """
        self.model.train(training)
        self.optimizer.zero_grad(set_to_none=False)
        logits = self.forward(batch, dropout_epoch, training)
        loss = self._loss_sum(logits, batch.seeds) / batch.global_count
        loss.backward()
        return float(self.full.allreduce_gradients(loss)[-1])  # the full-graph step's clip and allreduce

    # ---------------------------------------------------------------- epochs
    def train_epoch(self, evaluation_follows: bool = False, evaluate_alongside: bool = False) -> dict[str, Any]:
        """One epoch of ``steps_per_epoch`` synchronous steps; the record the train command writes (collective).
        ``evaluation_follows`` is the full-graph trainer's (it times pipelined flights); a mini-batch step keeps
        none, so it changes nothing here. ``evaluate_alongside`` is full-graph only (the command refuses it)."""
        if evaluate_alongside:
            raise ValueError("an evaluation beside the step is for full-graph training")
        before = self.comm.stats.snapshot()
        start = time.perf_counter()
        parts = {"sample": 0.0, "fetch": 0.0, "compute": 0.0, "allreduce": 0.0, "wait": 0.0}
        weighted_loss, needed, hits = 0.0, 0, 0
        waited = [0.0]
        worker_counters: list[dict[str, dict[str, float]]] = []
        for batch in self.batches(self.epoch, waited):
            step = batch.step
            if batch.moved is not None:
                worker_counters.append(batch.moved)
            for key, seconds in batch.seconds.items():
                parts[key] += seconds
            needed, hits = needed + batch.cache[0], hits + batch.cache[1]
            reduce_before = self.comm.stats.phases["grad_allreduce"].seconds
            compute_start = time.perf_counter()
            loss = self.step_gradients(batch, self.epoch * self.steps_per_epoch + step)
            self.optimizer.step()
            reduce_seconds = self.comm.stats.phases["grad_allreduce"].seconds - reduce_before
            parts["allreduce"] += reduce_seconds
            parts["compute"] += time.perf_counter() - compute_start - reduce_seconds
            weighted_loss += loss * batch.global_count
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        wall = time.perf_counter() - start
        parts["wait"] = waited[0]
        self.epoch += 1
        self.full.epoch = self.epoch
        after = self.comm.stats.snapshot()
        delta = {phase: {key: after[phase][key] - before[phase][key] + sum(moved[phase][key] for moved in
                                                                             worker_counters)
                         for key in after[phase]} for phase in after}
        return {"epoch": self.epoch, "loss": weighted_loss / max(self.train_ids.size, 1),
                "time": {"total": wall, **parts}, "bytes": bytes_by_phase(delta), "broadcasts": None,
                "cache_bytes": int(self.fetcher.cache_values.numel() * self.fetcher.cache_values.element_size()),
                "feature_cache": {"needed": needed, "hits": hits}, "steps": self.steps_per_epoch}

    # ----------------------------------------------- full-graph delegation
    def evaluate(self) -> dict[str, float]:
        """Exact full-graph evaluation of the shared weights (collective; :meth:`Trainer.evaluate`)."""
        return self.full.evaluate()

    @property
    def eval_bytes(self) -> dict[str, dict[str, int]]:
        return self.full.eval_bytes

    def __getattr__(self, name: str) -> Any:
        """What the train command reads of a full-graph trainer and this one does not redefine (input
        exchange of the evaluation, memory, predictions, labels, masks, close, attention bytes)."""
        if name == "full":
            raise AttributeError(name)
        return getattr(self.full, name)

    @property
    def has_policy_state(self) -> bool:
        return False

    def state(self) -> dict[str, Any]:
        """The full-graph trainer's checkpoint state (weights, Adam state, epoch, RNG), its fingerprint
        extended by :meth:`MinibatchConfig.fingerprint`. Checkpoints are written at epoch ends and a batch is
        a pure function of (seed, epoch, step), so nothing of the sampler needs saving: a resume is exact."""
        state = self.full.state()
        state["config"] = {**state["config"], **self.minibatch.fingerprint(self.comm.size)}
        state["epoch"] = self.epoch
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue after the epoch ``state`` was written at (its fingerprint was checked by the caller)."""
        self.full.load_state(state)
        self.epoch = self.full.epoch

    def close(self) -> None:
        """End the run (collective): the prefetch worker drained (its counters added to the communicator's,
        so the run's totals hold its bytes), the full-graph trainer's exchanges, the worker's communicator."""
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        if self.worker_comm is not None:  # the worker's bytes join the run's totals (a prefix left untrained too)
            for name, counter in self.worker_comm.stats.phases.items():
                total = self.comm.stats.counter(name)
                total.bytes_sent += counter.bytes_sent
                total.bytes_recv += counter.bytes_recv
                total.seconds += counter.seconds
                total.calls += counter.calls
            self.worker_comm.stats = CommStats()
        self.full.close()
        if self.worker_comm is not None:
            self.worker_comm.free()
            self.worker_comm = None
