"""Assembly of one training run: the distributed operator, the model, the policies' strategy and per-epoch
work, layer 0's input, the labels and the optimiser, in the order every rank builds them.

Layer 0's input: with ``input_exchange`` resolved to ``once`` (:mod:`algorithms.static_input`) the run fetches
its halo rows of ``X`` here (:class:`~sparse_dist.halo.StaticHalo`) and layer 0 never exchanges again; a
policy that feeds layer 0 itself (``feeds_layer0``, e.g. ``psc`` with a feature cache) gets per-epoch layer-0
exchanges and supplies the input through its :class:`~algorithms.policies.base.EpochWork`.
``receiver_dropout`` makes exchanges carry pre-dropout rows.

Collective: construction (communicator splits, normalisation, ``DistCSR``, the counts of the splits, the
halo or the policy's cache), every rank in the same order.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
import torch

from algorithms.dropout import load_compiled_passes
from algorithms.layers import layer_type
from algorithms.model import GraphModel
from algorithms.optim import Adam
from algorithms.policies.base import EpochWork
from algorithms.static_input import (HaloBudgetError, choose_input_exchange, evaluations, model_exchange_widths,
                                     receiver_side)
from algorithms.training.bit_widths import BitWidthWork
from algorithms.training.config import PROGRESS_MODES, TrainConfig, evaluation_plan_refusal
from algorithms.training.field_evaluation import FieldEvaluation
from algorithms.training.graph import LocalGraph, scaled_features, wire_rows
from algorithms.training.guard import Guard
from algorithms.training.steering import EvaluationSteering
from algorithms.training.tighten import ActivePolicies, install
from algorithms.training.metrics import SPLITS, moved_since
from sparse_dist.comm import Communicator, ProgressThread, said_once, spans_nodes, threads_may_call_mpi
from sparse_dist.compress import Codec
from sparse_dist.dcsr import DistCSR, split_grid
from sparse_dist.halo import StaticHalo
from sparse_dist.layout import Grid
from sparse_dist.lossless_wire import WireRows, agree_wire_dtype
from sparse_dist.spmm import DistSpMM

_log = logging.getLogger(__name__)


class TrainingRun:
    """What one rank builds for a run (see the module docstring); :class:`~algorithms.training.trainer.Trainer`
    adds the epoch loop. ``work``: the policies' per-epoch work, in axis order (sampling, staleness)."""

    def __init__(self, comm: Communicator, graph: LocalGraph, config: TrainConfig,
                 device: str | torch.device = "cpu") -> None:
        self.comm, self.config, self.graph = comm, config, graph
        self.device = torch.device(device)
        built_from = comm.stats.snapshot()
        self.dtype = {"float32": torch.float32, "float64": torch.float64}[config.dtype]
        self.epoch = 0
        sampler, rule = config.sample.build(seed=config.seed), config.stale.build()  # the run's own policies
        dims = self._operator(sampler, rule)
        self._data()
        self._layer_input(sampler, dims)
        self.work: list[EpochWork] = []
        self.build_work(((config.sample, sampler), (config.stale, rule)))
        self.optimizer = self._optimizer()
        self.policies = ActivePolicies(config.sample, config.stale, config.compress)  # the guard may tighten them
        self.guard = Guard(config.guard_settings(), comm, active=not self.policies.is_exact,
                           validation_size=self.global_counts["val"], audit_every=config.audit_every,
                           epochs=config.epochs)
        self.steering = (EvaluationSteering(config.eval_every, config.epochs, config.target_acc,
                                            self.global_counts["val"], config.guard_drop, config.guard_warmup,
                                            self.graph.multilabel)
                         if config.steer_evaluation else None)
        # evaluations (and, with dropout, the exact references the guard's bias signal and the audit read) from the
        # receptive field held here (evaluation_plan "field"): gathered once, collective
        references = config.dropout > 0 and (config.audit_every > 0 or self.guard.reads_references)
        self.field = (FieldEvaluation(self.spmm.plan, graph, self.normalized, self.model, self.features, self.halo,
                                      self.wire_rows(), references=references)
                      if config.evaluation_plan == "field" else None)
        self.setup_bytes = moved_since(comm, built_from)  # what building this run moved: set-up and halo
        self.eval_bytes: dict[str, dict[str, int]] = {}

    def restore_kept(self, kept: dict[str, Any]) -> None:
        """Load the weights the guard kept of the best evaluation (replicated: local)."""
        self.model.load_state_dict(kept["model"])

    def fresh_moments(self) -> None:
        """Start Adam's moments afresh (the guard's tightening)."""
        self.optimizer.reset_moments()

    def install_policies(self, policies: ActivePolicies) -> None:
        """Train with ``policies`` from the next step on (collective: :func:`~algorithms.training.tighten.install`)."""
        install(self, policies)

    def build_work(self, axes: tuple[tuple[Any, Any], ...]) -> None:
        """The policies' per-epoch work from ``(spec, policy)`` per axis, replacing what there was (collective
        where a work says so: psc's feature cache); a work may change how layer 0 gets its input."""
        self.work = []
        for spec, policy in axes:
            work = policy.epoch_work(self) if policy is not None else None
            if work is not None:
                self.input_exchange = work.input_exchange(self.input_exchange, str(spec), self.config.input_exchange)
                self.work.append(work)
        if self.codec is not None and self.codec.adapts:  # its widths agreed between steps
            self.work.append(BitWidthWork(self.codec, self.comm, self.config.layers))

    def _operator(self, sampler: Any, rule: Any) -> list[int]:
        """Grid, normalised matrix, model, the strategy and the SpMM; returns the layers' widths."""
        comm, config, graph = self.comm, self.config, self.graph
        replication = config.replication
        self.group = comm.rank // replication
        self.first_row = graph.layout.offsets[self.group]
        grid_comms = split_grid(comm, Grid(comm.size, replication))
        self.col_comm = grid_comms[1]  # the G ranks holding distinct rows: losses, counts, gradients
        # the evaluation beside a step posts on its own duplicate of the column (ExchangePlan.posting_on)
        self.evaluation_comm = (self.col_comm.split(0, self.col_comm.rank) if config.overlap_evaluation
                                else self.col_comm)
        self.normalized = layer_type(config.model).normalize_adjacency(self.col_comm, graph.layout, graph.rows,
                                                                       self.group)  # collective for GCN
        self.matrix = DistCSR(comm, graph.layout, self.normalized, replication=replication, name=graph.name,
                              grid_comms=grid_comms)
        dims = [graph.features.shape[1]] + [config.hidden] * (config.layers - 1) + [graph.num_classes]
        self.model = GraphModel(config.model, dims, dropout=config.dropout, seed=config.seed, dtype=self.dtype,
                                options=config.layer_options()).to(self.device)
        self.feeds_layer0 = sampler is not None and sampler.feeds_layer0  # layer 0 exchanges per epoch
        self.receiver_dropout = receiver_side(config.dropout_side, config.dropout, config.stale, model_exchange_widths(
            self.model.layers, "per-epoch" if self.feeds_layer0 else config.input_exchange))
        self.codec = Codec.parse(config.compress, seed=config.seed)
        self.spmm = DistSpMM(self.matrix, config.plan, dtype=self.dtype, device=self.device, sampler=sampler,
                             staleness=rule, row_masks=self.receiver_dropout or self.model.needs_source_ids,
                             codec=self.codec)
        self.evaluation_spmm = self._evaluation_operator()
        if config.progress not in PROGRESS_MODES:
            raise ValueError(f"progress must be one of {PROGRESS_MODES}, got {config.progress!r}")
        if config.overlap_evaluation and not threads_may_call_mpi():  # the same answer on every rank
            raise ValueError("overlap_evaluation runs the evaluation's exchanges from a second thread, which needs "
                             "MPI_THREAD_MULTIPLE; this MPI does not give it")
        # pipelined flights, and an evaluation beside a step (overlap_evaluation), stay in flight while it computes
        lifecycle = self.spmm.lifecycle
        all_at_once = lifecycle.posts_all_at_once  # a pipelined strategy posts every part at once
        progress = (resolve_progress(comm, config.progress) if all_at_once or config.overlap_evaluation
                    else "none")  # collective for auto: resolved once
        self.progress_mode = progress if all_at_once else "none"
        lifecycle.test_progress(self.progress_mode != "none")
        self._evaluation_in_flight: Callable[[], bool] = lambda: False
        self.progress_thread = (ProgressThread(comm, lambda: lifecycle.in_flight() or self._evaluation_in_flight())
                                if progress == "thread" else None)
        return dims

    def _evaluation_operator(self) -> DistSpMM:
        """What exact evaluations multiply with: the training operator, or (``evaluation_plan`` cover where the run
        trains on another plan) an exact cover-plan operator over the same matrix, built here (collective over
        the replica column: the covers' set-up). Its evaluations move the cover's rows, never more than p2p's;
        training, its policies and its bytes stay the training plan's. (``field`` evaluations multiply locally,
        :class:`~algorithms.training.field_evaluation.FieldEvaluation`.)"""
        config = self.config
        attention = self.model.needs_source_ids or any(layer.takes_operator for layer in self.model.layers)
        problem = evaluation_plan_refusal(config.evaluation_plan, config.model, attention)
        if problem:
            raise ValueError(problem)
        if config.evaluation_plan in ("same", "field", config.plan):  # field: no operator, see FieldEvaluation
            return self.spmm
        return DistSpMM(self.matrix, config.evaluation_plan, dtype=self.dtype, device=self.device)

    @property
    def plan_setup_seconds(self) -> float | None:
        """This rank's seconds building the exchange plan, where the plan times its set-up (the cover's), else None."""
        return self.spmm.plan.setup_seconds

    @property
    def evaluation_plan_setup_seconds(self) -> float | None:
        """This rank's seconds building the evaluations' own plan (``evaluation_plan``: the cover's, or gathering
        the receptive field), None without one."""
        if self.field is not None:
            return self.field.setup_seconds
        return self.evaluation_spmm.plan.setup_seconds if self.evaluation_spmm is not self.spmm else None

    def evaluation_memory(self) -> dict[str, int] | None:
        """What this rank keeps for exact evaluations beyond training's (the receptive field's rows and bytes,
        :meth:`FieldEvaluation.memory`), or None where evaluations keep nothing of their own."""
        return self.field.memory() if self.field is not None else None

    def _data(self) -> None:
        """Labels, split masks, the training rows and the global count of each split (collective)."""
        graph = self.graph
        self.labels = torch.from_numpy(graph.labels).to(self.device)
        if graph.multilabel:
            self.labels = self.labels.to(self.dtype)
        self.masks = {split: torch.from_numpy(graph.masks[split].astype(bool)).to(self.device) for split in SPLITS}
        self.train_rows = torch.nonzero(self.masks["train"]).flatten()
        self.train_labels = self.labels.index_select(0, self.train_rows)
        local_counts = np.array([int(graph.masks[s].sum()) for s in SPLITS], dtype=np.int64)
        self.global_counts = dict(zip(SPLITS, self.col_comm.allgather_array(local_counts).sum(axis=0).tolist()))
        if self.global_counts["train"] == 0:
            raise ValueError(f"{graph.name}: the training split is empty")

    def _layer_input(self, sampler: Any, dims: list[int]) -> None:
        """Layer 0's input: features scaled, the input exchange chosen, the halo fetched where ``once``."""
        config, graph = self.config, self.graph
        features = scaled_features(graph.features, config.feature_norm)
        features_tensor = torch.from_numpy(features).to(self.dtype).to(self.device)
        requested = "per-epoch" if self.feeds_layer0 else config.input_exchange
        # the loaded rows travel, narrowed where every rank's fit bitwise; each receiver scales its own
        self.wire_dtype = agree_wire_dtype(self.comm, graph.features)  # collective
        try:
            self.input_exchange = choose_input_exchange(
                requested, grid=self.matrix.grid, layout=graph.layout, boundary_counts=self.matrix.boundary_counts,
                union_sizes=self.matrix.union_sizes, plan=config.plan, f_in=dims[0], f_out=dims[1],
                itemsize=features_tensor.element_size(), epochs=config.epochs,
                # steered: counted as evaluated every epoch, so that layer 0's exchange (and so the training) is
                # the one a run evaluated after every step would choose; steering only changes when it looks
                evaluations=evaluations(config.epochs, 1 if config.steer_evaluation else config.eval_every),
                sample_p=float(sampler.p) if sampler is not None else 1.0, receiver=self.receiver_dropout,
                budget=config.halo_budget, layer0=self.model.layers[0].exchange_shape(self.receiver_dropout),
                pair_counts=self.spmm.plan.pair_counts, wire=self.wire_dtype)
        except HaloBudgetError as exc:
            raise said_once(exc) from None  # decided from global metadata
        self.halo = (StaticHalo(self.spmm.plan, graph.layout, self.normalized, features_tensor,
                                self.matrix.boundary_counts, self.wire_rows())
                     if self.input_exchange.mode == "once" else None)  # collective over the replica column
        self.features = self.halo.own_values if self.halo is not None else features_tensor
        self.layer_input = self.halo.values if self.halo is not None else features_tensor
        if config.dropout > 0.0:  # the largest pass: layer 0's input, or a hidden layer's over the same rows
            largest = self.layer_input.shape[0] * max(dims[:-1])
            seconds = load_compiled_passes(largest, self.device, self.dtype, config.epochs)
            if seconds:
                _log.info("loaded the compiled dropout passes in %.2f s", seconds)

    def wire_rows(self) -> WireRows | None:
        """This rank's feature rows as they travel to others (:func:`algorithms.training.graph.wire_rows`)."""
        return wire_rows(self.graph.features, self.wire_dtype, self.config.feature_norm, self.dtype, self.device)

    def _optimizer(self) -> Adam:
        return make_optimizer(self.model, self.config)


def make_optimizer(model: GraphModel, config: TrainConfig,
                   parameters_of: Callable[[int], list[torch.Tensor]] | None = None) -> Adam:
    """Adam over ``model``'s parameters, or over what ``parameters_of(layer)`` gives in their place (the grid's
    blocks of them, in the same order: the state numbers them alike); weight decay on the first layer only
    (Kipf & Welling) or on every weight (``weight_decay_scope``). The 1D and the grid trainer build it alike."""
    parameters_of = parameters_of or model.layer_parameters
    first = parameters_of(0)
    rest = [p for layer in range(1, model.num_layers) for p in parameters_of(layer)]
    if config.weight_decay_scope == "first":
        groups = [{"params": first, "weight_decay": config.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    elif config.weight_decay_scope == "all":
        groups = [{"params": first + rest, "weight_decay": config.weight_decay}]
    else:
        raise ValueError(f"weight_decay_scope must be 'first' or 'all', got {config.weight_decay_scope!r}")
    return Adam([g for g in groups if g["params"]], lr=config.lr)  # torch's arithmetic, no torch._dynamo


def resolve_progress(comm: Communicator, mode: str) -> str:
    """``auto`` -> ``thread`` where some rank of ``comm`` is on another node and MPI gave
    ``MPI_THREAD_MULTIPLE``, else ``test``; other modes unchanged. Collective over ``comm`` for ``auto``.

    Why: between nodes MPICH's ofi/tcp (and Open MPI's tcp) move a posted transfer only inside MPI calls.
    Testing at each layer's exchange leaves the socket idle while a layer computes, so the transfer ends
    inside the next blocking collective (measured, 200k synthetic, P = 2, 1 Gbit/s: the gradient allreduce
    waited 0.88 s of a 1.70 s epoch with ``test``, 0.32 s of 1.28 s with ``thread``). Within one node the
    shared-memory copy costs the same core either way, and ``test`` spares the thread.
    """
    if mode != "auto":
        return mode
    return "thread" if spans_nodes(comm) and threads_may_call_mpi() else "test"
