"""The epoch loop of full-graph distributed training: forward, loss, one flat gradient allreduce, Adam, and
exact evaluation.

A rank holds the rows of its row group (``LocalGraph``). The loss is summed
over the rank's local training rows and divided by the GLOBAL number of
training rows, so the gradients summed over ranks equal the single-process
gradient. Weight gradients (and the loss, for logging) travel in one flat
buffer, allreduced once per step over the replica column (the ``G`` ranks
holding distinct rows; on the 1.5D grid the ``c`` replicas of a group hold
identical contributions, so summing over all ``P`` ranks would count them
``c`` times). Adam updates the replicated weights identically everywhere.
Policies with per-epoch work (``dgs``, ``psc``'s feature cache) hook in
through :class:`~algorithms.policies.base.EpochWork`; the loop names none.

Collective: construction, :meth:`Trainer.train_epoch`, :meth:`Trainer.evaluate`
and :meth:`Trainer.predictions` are entered by every rank in the same order.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from algorithms.attention_structure import cached_structure_bytes
from algorithms.training.alongside import AlongsideEvaluation, EvaluationShare
from algorithms.training import bias, state as checkpoint_state
from algorithms.training.assembly import TrainingRun
from algorithms.training.audit import Audit
from algorithms.training.config import TrainConfig
from algorithms.training.graph import LocalGraph
from algorithms.training.metrics import (TIMED_PARTS, counters_since, local_loss_sum, moved_since, split_metrics,
                                         step_breakdown)
from algorithms.training.tighten import tighten
from sparse_dist.comm import Communicator
from sparse_dist.hostmem import keep_freed_memory


class Trainer(checkpoint_state.CheckpointState, TrainingRun):
    """Owns the distributed operator, the model and the optimiser of one run (built by :class:`TrainingRun`)
    and runs its epochs and evaluations; its checkpoint state comes with
    :class:`~algorithms.training.state.CheckpointState`."""

    def __init__(self, comm: Communicator, graph: LocalGraph, config: TrainConfig,
                 device: str | torch.device = "cpu") -> None:
        super().__init__(comm, graph, config, device)
        keep_freed_memory()  # where the user asked: set-up is done, epochs allocate the same sizes again
        self.audit = Audit(config.audit_every, comm, self.col_comm,
                           lambda trace: self.forward(training=True, bypass_policy=True, trace=trace))
        self._evaluated: dict[str, float] | None = None  # the evaluation a step ended with (see train_epoch)
        self._evaluation_seconds = 0.0  # this rank's seconds in the latest exact evaluation (prices the reference)

    def forward(self, training: bool, *, bypass_policy: bool = False,
                trace: list[torch.Tensor] | None = None) -> torch.Tensor:
        """This rank's logits for the current epoch (collective); see :meth:`GraphModel.forward`."""
        field = self.field
        if field is not None and (not training or (bypass_policy and field.takes_references)):
            return field.logits(self.model, self.epoch, training, trace)  # from the field held here: no exchange
        halo, layer_input = self.halo, self.layer_input
        if training and not bypass_policy:
            for work in self.work:  # e.g. psc's cached rows of X (collective), dgs' feature columns
                halo, layer_input = work.layer_input(self.epoch, halo, layer_input)
        spmm = self.spmm if training else self.evaluation_spmm  # an evaluation may exchange on a plan of its own
        return self.model(layer_input, spmm, first_row=self.first_row, epoch=self.epoch, training=training,
                          timer=self.spmm.timer if training else None, halo=halo,
                          receiver_dropout=self.receiver_dropout, bypass_policy=bypass_policy, trace=trace)

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def train_epoch(self, evaluation_follows: bool = False, evaluate_alongside: bool = False,
                    steered: bool = False) -> dict[str, Any]:
        """One full-graph step; returns the global loss and this rank's time breakdown (collective).

        ``evaluation_follows``: the caller evaluates the weights after this step next (:meth:`evaluate`). The
        step then ends with that evaluation's exact forward and counts (kept for :meth:`evaluate`, which returns
        them without another forward; their bytes in :attr:`eval_bytes`, their time and bytes left out of the
        step's), and only then are the gradient flights a pipelined strategy held posted: over TCP an evaluation
        posted behind them waits for them on the same connections, while posted after it they travel during the
        next step's forward (:mod:`sparse_dist.lifecycle`). Their bytes are this step's: the record is built
        after they are posted, so its bytes are final when it is returned. Every rank passes the same value.

        ``evaluate_alongside`` (needs ``overlap_evaluation`` in the config): the exact evaluation of the weights
        this step starts from runs in turns beside the step (:mod:`algorithms.training.alongside`); the
        record's ``evaluation`` holds its metrics (what :meth:`evaluate` would have given before the step),
        ``evaluation_seconds`` the wall time of its turns, and :attr:`eval_bytes` its bytes. The step's own
        time, compute and bytes leave the evaluation's out.

        Every ``audit_every`` epochs the record also holds ``audit``: per layer, the relative error of
        the layer outputs this step computed under its policy against an exact forward with the same
        weights and masks, and that forward's own seconds and bytes (kept out of the step's figures). Where the
        guard's bias signal reads that forward (:meth:`Guard.reference_due`; the audit's epochs, or its own), the
        record holds ``guard_reference``: the two forwards' training losses and validation metrics, its strikes,
        and the forward's seconds and bytes; the guard counts it before it agrees at this step's evaluation.

        Where the run steers its evaluations (``steer_evaluation``), the record holds ``steering``: the step's own
        validation signal and why an exact evaluation follows it (None: none does;
        :mod:`algorithms.training.steering`), the same on every rank. ``steered``: the caller evaluates after
        this step when ``steering`` says so (not beside the next step), so the step then ends with that
        evaluation as with ``evaluation_follows``.
        """
        self._evaluated = None  # an evaluation computed with an earlier step that nobody asked for
        guarded = tighten(self) if self.guard.due else None  # agreed at the last evaluation: collective
        audited, referenced = self.audit.due(self.epoch), self.guard.reference_due(self.epoch + 1)
        audit = self.audit.begin() if audited or referenced else None  # the same on every rank
        stats_before = self.comm.stats.snapshot()
        self.spmm.reset_compute()
        start = time.perf_counter()
        extra: dict[str, Any] = {}
        for work in self.work:  # e.g. dgs' explanation when due (collective)
            extra.update(work.before_epoch(self.epoch))
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        alongside = self._alongside() if evaluate_alongside else None
        if alongside is not None:
            alongside.turn()  # its layer 0, its first exchange posted: it travels during the forward
        used: list[torch.Tensor] | None = [] if audit is not None else None
        logits = self.forward(training=True, trace=used)
        loss = local_loss_sum(logits, self.train_rows, self.train_labels, self.graph.multilabel,
                              self.graph.num_classes) / self.global_counts["train"]
        if alongside is not None:
            alongside.turn()  # and its next one during the backward
        loss.backward()
        if alongside is not None:
            extra["evaluation"] = alongside.finish()  # before the optimiser changes the weights
            self.eval_bytes, self._evaluation_seconds = alongside.share.bytes(), alongside.share.wall
            self.guard.note_metrics(self.epoch, extra["evaluation"], self._kept_state)  # the weights it saw
            if self.steering is not None:
                self.steering.observe_metrics(self.epoch, extra["evaluation"])
        flat = self.allreduce_gradients(loss)
        self.guard.observe_loss(self.epoch + 1, float(flat[-1]))
        if self.steering is not None:  # collective: the signal's own allreduce
            steering = self.steering.after_step(self.epoch + 1, logits, self.labels, self.masks["val"], self.col_comm)
            extra["steering"] = steering
            evaluation_follows = evaluation_follows or (steered and steering["due"] is not None)
        self.spmm.lifecycle.after_step(evaluation_follows)  # pipe: its gradient flights, behind the allreduce
        with self.spmm.timer.measure("optimizer", self.device):
            self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # the epoch's wall time includes its kernels
        wall = time.perf_counter() - start
        computed = dict(self.spmm.compute_seconds())
        exchange = self.spmm.lifecycle.step_record(self.epoch)
        self.epoch += 1
        if alongside is not None:
            stats_before, wall = alongside.share.excluded_from(stats_before, wall)
            extra["evaluation_seconds"] = alongside.share.wall
        self.guard.note_step(wall)  # the steps' own seconds: the bias reference's budget is a share of them
        if evaluation_follows:
            stats_before = self._evaluate_after_step(stats_before)
        for work in self.work:  # e.g. adaptive bit widths' agreement (collective): its bytes are the step's
            extra.update(work.end_of_step())
        booked = TIMED_PARTS + tuple(part for work in self.work for part in work.booked)
        record = {"epoch": self.epoch, "loss": float(flat[-1]),
                  **step_breakdown(self.comm, stats_before, wall, computed, booked), **exchange, **extra}
        for work in self.work:  # e.g. psc's feature-cache hits
            record.update(work.after_epoch())
        if guarded is not None:
            record["guard"] = guarded
        if audit is not None:  # before the guard agrees: the bias signal's reading counts at this evaluation
            assert used is not None
            sums = bias.local_sums(logits.detach(), audit["exact"][-1], self) if referenced else None
            checked = self.audit.end(audit, used, sums)
            if audited:
                record["audit"] = {key: checked[key] for key in ("layer_error", "seconds", "bytes")}
            if referenced:
                seen = bias.reading(checked["sums"], self.global_counts["val"])
                record["guard_reference"] = {**self.guard.observe_reference(self.epoch, seen, checked["seconds"]),
                                             "bytes": checked["bytes"]}
        if alongside is not None:  # after the record: the guard's agreement is neither the step's nor the evaluation's
            self.guard.agree()
            self.guard.price_reference(self.epoch - 1, self._evaluation_seconds)  # it saw the weights before it
        return record

    def _alongside(self) -> AlongsideEvaluation:
        if not self.config.overlap_evaluation:
            raise ValueError("evaluate_alongside needs overlap_evaluation in the config (its progress is set up "
                             "with the run)")
        alongside = AlongsideEvaluation(self.comm, self.spmm.timer, self.device, self._exact_metrics,
                                        self.evaluation_spmm.plan, self.evaluation_comm)
        self._evaluation_in_flight = lambda: alongside.in_flight
        return alongside

    def _evaluate_after_step(self, stats_before: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        """The evaluation that follows a step, run before its record is built: the metrics kept for
        :meth:`evaluate`, then the gradient flights the step held posted (collective). Returns the step's
        ``stats_before`` with the evaluation's counters taken out (the held flights' stay in: the step's)."""
        before = self.comm.stats.snapshot()
        self._evaluated = self.measured_evaluation()
        share = EvaluationShare()
        share.add(0.0, counters_since(self.comm, before))
        self.spmm.lifecycle.after_evaluation()
        return share.excluded_from(stats_before, 0.0)[0]

    def allreduce_gradients(self, loss: torch.Tensor) -> torch.Tensor:
        """Clip (where on), then sum the weight gradients and the loss in one flat allreduce over the replica
        column; returns the flat buffer (its last entry the global loss). Collective; the mini-batch trainer
        steps through it too."""
        params = self.parameters()
        if self.config.clip > 0:
            # Each of the G row groups clips its local gradient to clip / sqrt(G) (SANCUS' scaling), so the
            # summed gradient stays near the global bound.
            torch.nn.utils.clip_grad_norm_(params, self.config.clip / math.sqrt(self.col_comm.size))
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)])
        self.col_comm.allreduce_(flat, "grad_allreduce")
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return flat

    # ----------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, float]:
        """Exact forward (no dropout); accuracy (micro-F1 for multi-label) per split, global (collective).

        The bytes it moved (its forward exchanges, and the count gathers) are left in :attr:`eval_bytes`.
        After a step told ``evaluation_follows`` it returns the evaluation that step ended with (the same
        weights), without another forward.
        """
        metrics, self._evaluated = self._evaluated, None
        if metrics is None:
            metrics = self.measured_evaluation()
        self.guard.observe_metrics(self.epoch, metrics, self._kept_state)  # collective: agrees on a fall
        self.guard.price_reference(self.epoch, self._evaluation_seconds)  # collective where it chooses
        if self.steering is not None:
            self.steering.observe_metrics(self.epoch, metrics)
        return metrics

    @torch.no_grad()
    def measured_evaluation(self) -> dict[str, float]:
        """The exact metrics of the current weights; their bytes in :attr:`eval_bytes` (collective)."""
        before, start = self.comm.stats.snapshot(), time.perf_counter()
        self.model.eval()
        metrics = self._exact_metrics()
        self.eval_bytes, self._evaluation_seconds = moved_since(self.comm, before), time.perf_counter() - start
        return metrics

    def _kept_state(self) -> dict[str, Any]:
        """What the guard keeps of the best evaluation: the replicated weights (Adam's moments start afresh at a
        tightening, so they are not kept)."""
        return {"model": self.model.state_dict()}

    def _exact_metrics(self) -> dict[str, float]:
        """Accuracy per split from an exact forward without dropout (collective)."""
        logits = self.forward(training=False)
        return split_metrics(logits, self.labels, self.masks, self.graph.multilabel, self.global_counts,
                             self.col_comm)

    @torch.no_grad()
    def predictions(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """This rank's (global row ids, predicted classes or 0/1 matrix) of ``split`` from an exact forward."""
        self.model.eval()
        logits = self.forward(training=False)
        mask = self.masks[split]
        rows = torch.nonzero(mask).flatten() + self.first_row
        predicted = (logits[mask] > 0).to(torch.int64) if self.graph.multilabel else logits[mask].argmax(dim=1)
        return rows.cpu().numpy(), predicted.cpu().numpy()

    # ------------------------------------------------------------ resources
    def attention_bytes(self) -> int:
        """Bytes of the attention structures (GAT) this rank keeps cached with its operators (0 otherwise)."""
        return cached_structure_bytes(self.spmm, self.halo)

    def memory(self) -> dict[str, int]:
        """What this rank keeps for its layer-0 halo or a policy's layer-0 cache (zeros without one)."""
        if self.halo is not None:
            return self.halo.memory()
        for work in self.work:
            kept = work.memory()
            if kept is not None:
                return kept
        return {"halo_rows": 0, "halo_bytes": 0, "matrix_bytes": 0}

    def close(self) -> None:
        """End the run's exchanges (collective over the plan's column; idempotent): complete the pipelined
        flights still outstanding, so none is pending when its buffers go or MPI is finalised, and stop the
        progress thread. Training may go on afterwards (kept flights stay, completed)."""
        self.spmm.lifecycle.close()
        if self.evaluation_spmm is not self.spmm:
            self.evaluation_spmm.lifecycle.close()
        if self.progress_thread is not None:
            self.progress_thread.stop()
            self.progress_thread = None
