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
  costs (normalisation, plans, perhaps a layer-0 halo); its normalised adjacency is the one the sampler
  draws from (normalised once).
* Batches: made by a :class:`~algorithms.minibatch.loader.BatchLoader` apart from the trainer (seeds,
  sampler, feature store: PyG's loader / sampler / store split); the trainer steps on what it hands over.
* Sampling kernel (``minibatch.sampler``): the compiled per-row one (numba) unless ``numpy`` is asked for or
  numba is missing; compiled when the trainer is built (or loaded from numba's cache), on torch's thread
  count of that moment (the train command's ``--threads``). Both kernels draw the same blocks, bitwise.
* Step breakdown (seconds, summed over the epoch's steps): ``sample``, ``fetch``, ``compute`` (forward,
  backward, optimiser), ``allreduce`` (the rank's own seconds in the gradient allreduce), ``allreduce_wait``
  (its seconds in it waiting for late ranks; "Waits" in :mod:`sparse_dist.comm`), ``wait`` (on the prefetch
  queue; 0 without prefetch). ``sample`` and ``fetch`` are wall seconds, their exchanges' waits included.
* Prefetch (``prefetch = N > 0``; ByteGNN's overlap of sampling with training): a worker thread
  (:class:`~algorithms.minibatch.loader.Prefetcher`) samples and fetches batches in order on its own duplicate of the communicator
  (``MPI_THREAD_MULTIPLE``), into a queue of at most ``N`` finished batches, while the main thread trains;
  ``wait`` is the main thread's time blocked on the queue, and ``sample``/``fetch`` are the worker's seconds
  (overlapped). It runs across epoch boundaries: when epoch ``e`` starts, the worker is granted the rest of
  ``e`` and the first ``ceil(N / K)`` groups of ``e + 1`` (if the run trains ``e + 1``), so the next epoch's
  first batches are made while this epoch's last ones train and while the run evaluates (on the main
  communicator, beside the worker's). Grants are given at the same point on every rank, so every worker
  runs the same collectives; :meth:`MinibatchTrainer.close` drains what was granted. The worker's communicator has its own
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

import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from algorithms.dropout import GlobalRowDropout
from algorithms.layers import layer_type
from algorithms.minibatch.config import MinibatchConfig
from algorithms.minibatch.loader import Batch, BatchLoader, Prefetcher, step_groups
from algorithms.train import LocalGraph, TrainConfig, Trainer, bytes_by_phase
from sparse_dist.comm import Communicator
from sparse_dist.compress import Codec
from sparse_dist.exchange import ExchangeContext
from sparse_dist.fetch import FeatureFetcher
from sparse_dist.sampling import DistributedSampler

__all__ = ["Batch", "MinibatchTrainer", "minibatch_problem", "step_groups"]


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
    if not (config.sample.is_none and config.stale.is_none):
        return "--mode minibatch exchanges no boundary rows: --sample and --stale must stay none"
    if Codec.parse(config.compress) is not None:
        return "--mode minibatch does not compress (its gradients travel exactly): leave --compress none"
    return None


class MinibatchTrainer:
    """Mini-batch training of the :class:`GraphModel` of a full-graph :class:`Trainer` it holds (see the module
    docstring): the trainer steps on the :class:`Batch` objects its :class:`BatchLoader` makes.

    What it holds of the full-graph machinery, by name: ``full`` (exact evaluation, checkpoint state, the
    gradient allreduce), its ``model``, ``optimizer``, ``device``, ``dtype``, labels and normalised adjacency
    (the loader samples it: normalised once, for both), and the records the train command reads of a run
    (the properties at the end of this class).
    """

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
        self.first_row = int(graph.layout.offsets[comm.rank])
        self.loader = BatchLoader(comm, graph.layout, self.full.normalized, self.full.features, graph.masks["train"],
                                  config.seed, config.epochs, minibatch, self.full.wire_rows())
        self.epoch = 0
        self.setup_bytes = bytes_by_phase({phase: {k: v - built_from[phase][k] for k, v in counters.items()}
                                           for phase, counters in comm.stats.snapshot().items()})

    # ------------------------------------------------- the loader's parts (tests and bench minibatch read them)
    @property
    def sampler(self) -> DistributedSampler:
        return self.loader.sampler

    @property
    def fetcher(self) -> FeatureFetcher:
        return self.loader.fetcher

    @property
    def steps_per_epoch(self) -> int:
        return self.loader.steps_per_epoch

    @property
    def train_ids(self) -> np.ndarray:
        return self.loader.train_ids

    @property
    def _prefetcher(self) -> Prefetcher | None:
        return self.loader.prefetcher

    def make_batch(self, epoch: int, step: int) -> Batch:
        """:meth:`BatchLoader.make_batch` (collective)."""
        return self.loader.make_batch(epoch, step)

    def make_batches(self, epoch: int, steps: list[int]) -> list[Batch]:
        """:meth:`BatchLoader.make_batches` (collective)."""
        return self.loader.make_batches(epoch, steps)

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
        parts = {"sample": 0.0, "fetch": 0.0, "compute": 0.0, "allreduce": 0.0, "allreduce_wait": 0.0, "wait": 0.0}
        weighted_loss, needed, hits = 0.0, 0, 0
        waited = [0.0]
        worker_counters: list[dict[str, dict[str, float]]] = []
        for batch in self.loader.batches(self.epoch, waited):
            step = batch.step
            if batch.moved is not None:
                worker_counters.append(batch.moved)
            for key, seconds in batch.seconds.items():
                parts[key] += seconds
            needed, hits = needed + batch.cache[0], hits + batch.cache[1]
            reduce_before = self.comm.stats.counter("grad_allreduce")
            seconds_before, waited_before = reduce_before.seconds, reduce_before.wait_seconds
            compute_start = time.perf_counter()
            loss = self.step_gradients(batch, self.epoch * self.steps_per_epoch + step)
            self.optimizer.step()
            reduce = self.comm.stats.counter("grad_allreduce")
            reduce_seconds, reduce_waited = reduce.seconds - seconds_before, reduce.wait_seconds - waited_before
            parts["allreduce"] += reduce_seconds - reduce_waited  # own; the wait for late ranks apart
            parts["allreduce_wait"] += reduce_waited
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
                "cache_bytes": self.loader.cache_bytes(),
                "feature_cache": {"needed": needed, "hits": hits}, "steps": self.steps_per_epoch}

    # ------------------------------------------------------------ evaluation and checkpoints (the full trainer's)
    def evaluate(self) -> dict[str, float]:
        """Exact full-graph evaluation of the shared weights (collective; :meth:`Trainer.evaluate`)."""
        return self.full.evaluate()

    @property
    def eval_bytes(self) -> dict[str, dict[str, int]]:
        return self.full.eval_bytes

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
        """End the run (collective): the loader's prefetch worker drained (its bytes joined to the run's
        totals) and its communicator freed, then the full-graph trainer's exchanges."""
        self.loader.close()
        self.full.close()

    # ------------------------------------------- what the train command reads of a run (the evaluating trainer's)
    @property
    def input_exchange(self) -> Any:
        """How the evaluation's layer 0 gets its input (:class:`algorithms.static_input.InputExchange`)."""
        return self.full.input_exchange

    @property
    def receiver_dropout(self) -> bool:
        return self.full.receiver_dropout

    @property
    def progress_mode(self) -> str:
        return self.full.progress_mode

    @property
    def labels(self) -> torch.Tensor:
        return self.full.labels

    @property
    def masks(self) -> dict[str, torch.Tensor]:
        return self.full.masks

    @property
    def guard(self) -> Any:
        """The accuracy guard (off: a mini-batch run has no policy to tighten)."""
        return self.full.guard

    @property
    def policies(self) -> Any:
        return self.full.policies

    @property
    def plan_setup_seconds(self) -> float | None:
        """The evaluation trainer's plan set-up seconds (:attr:`Trainer.plan_setup_seconds`)."""
        return self.full.plan_setup_seconds

    @property
    def evaluation_plan_setup_seconds(self) -> float | None:
        """The evaluation trainer's own evaluation plan's set-up seconds (None: it evaluates on its plan)."""
        return self.full.evaluation_plan_setup_seconds

    def memory(self) -> dict[str, int]:
        """What the evaluation keeps for layer 0 (:meth:`Trainer.memory`)."""
        return self.full.memory()

    def evaluation_memory(self) -> dict[str, int] | None:
        """What the evaluation trainer keeps of its own for evaluations (:meth:`TrainingRun.evaluation_memory`)."""
        return self.full.evaluation_memory()

    def predictions(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The exact model's predictions of ``split``'s rows (:meth:`Trainer.predictions`)."""
        return self.full.predictions(split)

    def attention_bytes(self) -> int:
        return self.full.attention_bytes()
