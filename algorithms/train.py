"""Full-graph distributed training: loss, one flat gradient allreduce, Adam, exact evaluation.

A rank holds the rows of its row group (``LocalGraph``). The loss is summed
over the rank's local training rows and divided by the GLOBAL number of
training rows, so the gradients summed over ranks equal the single-process
gradient. Weight gradients (and the loss, for logging) travel in one flat
buffer, allreduced once per step over the replica column (the ``G`` ranks
holding distinct rows; on the 1.5D grid the ``c`` replicas of a group hold
identical contributions, so summing over all ``P`` ranks would count them
``c`` times). Adam updates the replicated weights identically everywhere.

Collective: construction, :meth:`Trainer.train_epoch` and
:meth:`Trainer.evaluate` are entered by every rank in the same order.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from algorithms.checkpoint import checkpoint_mismatch
from algorithms.dgs import Explainer, MaskedHalo
from algorithms.attention_structure import cached_structure_bytes
from algorithms.model import GraphModel
from algorithms.layers import LayerOptions, layer_type
from algorithms.policies import AxisSpec
from algorithms.static_input import (HaloBudgetError, choose_input_exchange, evaluations, model_exchange_widths,
                                     receiver_side)
from sparse_dist.comm import Communicator, ProgressThread, said_once
from sparse_dist.compress import Codec
from sparse_dist.dcsr import DistCSR, split_grid
from sparse_dist.factory import make_strategy
from sparse_dist.halo import CachedInput, StaticHalo
from sparse_dist.layout import Grid, RowLayout
from sparse_dist.spmm import DistSpMM

SPLITS = ("train", "val", "test")
PROGRESS_MODES: tuple[str, ...] = ("test", "thread", "none")
"""How outstanding pipelined exchanges progress while the rank computes (see :class:`TrainConfig.progress`)."""


@dataclass
class TrainConfig:
    """Hyper-parameters of one run; defaults are Kipf & Welling's GCN on Cora."""

    model: str = "gcn"
    hidden: int = 16
    layers: int = 2
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 5e-4
    weight_decay_scope: str = "first"  # "first": first layer only (Kipf & Welling), "all"
    epochs: int = 200
    eval_every: int = 1
    seed: int = 0
    plan: str = "p2p"
    replication: int = 1
    feature_norm: str = "row"  # "row": divide each feature row by its sum; "none"
    dtype: str = "float32"
    sample: AxisSpec = AxisSpec("sample")  # boundary sampling policy, e.g. "bns:p=0.1" (text is parsed here)
    stale: AxisSpec = AxisSpec("stale")    # staleness policy, e.g. "sancus-h:eps=0.02"
    clip: float = 0.0     # global gradient-norm bound; 0 = off (local threshold clip / sqrt(G), as SANCUS)
    input_exchange: str = "auto"   # layer 0: "once" (X's boundary rows kept by receivers), "per-epoch", "auto"
    dropout_side: str = "auto"     # "owner", "receiver" (exchanges carry pre-dropout rows), "auto"
    halo_budget: int | None = None  # bytes of halo rows a rank may keep under "once" (None: unlimited)
    audit_every: int = 0           # every k epochs, one exact forward beside the policy's (0: never)
    progress: str = "test"         # pipelined exchanges: "test" (at every layer), "thread" (and a probe thread), "none"
    compress: str = "none"         # exchanged rows and gradients: "none", "fp16", "bf16", "int8[:stochastic]", ",feedback"
    heads: int = 1                 # GAT: attention heads of each hidden layer (concatenated)
    output_heads: int = 1          # GAT: attention heads of the output layer (averaged)
    attention_dropout: float = 0.0  # GAT: dropout on the attention weights

    def __post_init__(self) -> None:
        for axis in ("sample", "stale"):
            value = getattr(self, axis)
            if not isinstance(value, AxisSpec):
                object.__setattr__(self, axis, AxisSpec.parse(axis, str(value)))

    def record(self) -> dict[str, Any]:
        """Every field as plain JSON values (policies as their text)."""
        fields = {key: getattr(self, key) for key in self.__dataclass_fields__}
        return {key: str(value) if isinstance(value, AxisSpec) else value for key, value in fields.items()}

    def layer_options(self) -> LayerOptions:
        """The options only some layer kinds take (attention heads, attention dropout)."""
        return LayerOptions(self.heads, self.output_heads, self.attention_dropout)

    def fingerprint(self) -> dict[str, Any]:
        """The fields a checkpoint must agree with (P, plan and c change no math of the replicated weights and
        Adam state, so a checkpoint resumes at any of them; attention options where set)."""
        keep = ("model", "hidden", "layers", "dropout", "lr", "weight_decay", "weight_decay_scope", "seed",
                "feature_norm", "dtype", "sample", "stale", "clip", "dropout_side", "compress")
        if not self.layer_options().is_default():
            keep += ("heads", "output_heads", "attention_dropout")
        return {key: value for key, value in self.record().items() if key in keep}


@dataclass
class LocalGraph:
    """What one rank holds: its row group's raw adjacency rows and node data."""

    layout: RowLayout              # G row groups over new (partitioned) node ids
    rows: sp.csr_matrix            # n_g x N raw adjacency, global column ids
    features: np.ndarray           # n_g x F
    labels: np.ndarray             # n_g (class ids) or n_g x C (multi-label 0/1)
    masks: dict[str, np.ndarray]   # split -> bool n_g
    num_classes: int
    multilabel: bool
    name: str = "graph"
    extra: dict[str, Any] = field(default_factory=dict)


def bytes_by_phase(counters: dict[str, dict[str, float]]) -> dict[str, dict[str, int]]:
    """Bytes per phase (``sent``, ``recv``) from :meth:`CommStats.snapshot` counters (or their difference)."""
    return {phase: {"sent": int(d["bytes_sent"]), "recv": int(d["bytes_recv"])} for phase, d in counters.items()}


def _counters_since(comm: Communicator, before: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """This rank's communication counters (bytes, seconds, calls per phase) since they read ``before``."""
    after = comm.stats.snapshot()
    return {phase: {key: after[phase][key] - before[phase][key] for key in after[phase]} for phase in after}


def _moved_since(comm: Communicator, before: dict[str, dict[str, float]]) -> dict[str, dict[str, int]]:
    """Bytes per phase this rank moved since the counters read ``before``."""
    return bytes_by_phase(_counters_since(comm, before))


def row_normalize_features(features: np.ndarray) -> np.ndarray:
    """Divide each row by its sum (rows summing to 0 stay 0), as Kipf & Welling do."""
    sums = features.sum(axis=1, keepdims=True)
    return np.divide(features, sums, out=np.zeros_like(features, dtype=np.float64), where=sums != 0)


class Trainer:
    """Owns the distributed operator, the model and the optimiser of one run.

    Layer 0's input: with ``input_exchange`` resolved to ``once`` (:mod:`algorithms.static_input`) the
    trainer fetches its halo rows of ``X`` at construction (:class:`~sparse_dist.halo.StaticHalo`) and
    layer 0 never exchanges again; ``receiver_dropout`` makes exchanges carry pre-dropout rows.

    Collective: construction (communicator splits, normalisation, ``DistCSR``), :meth:`train_epoch`,
    :meth:`evaluate` and :meth:`predictions`, every rank in the same order.
    """

    def __init__(self, comm: Communicator, graph: LocalGraph, config: TrainConfig,
                 device: str | torch.device = "cpu") -> None:
        self.comm = comm
        self.config = config
        self.device = torch.device(device)
        built_from = comm.stats.snapshot()
        self.dtype = {"float32": torch.float32, "float64": torch.float64}[config.dtype]
        self.graph = graph
        replication = config.replication
        self.group = comm.rank // replication
        self.first_row = graph.layout.offsets[self.group]
        grid_comms = split_grid(comm, Grid(comm.size, replication))
        self.column_comm = grid_comms[1]  # the G ranks holding distinct rows: losses, counts, gradients
        normalized = layer_type(config.model).normalize_adjacency(self.column_comm, graph.layout, graph.rows,
                                                                  self.group)  # collective for GCN
        self.matrix = DistCSR(comm, graph.layout, normalized, replication=replication, name=graph.name,
                              grid_comms=grid_comms)
        sampler = config.sample.build(seed=config.seed)
        strategy = make_strategy(sampler, config.stale.build())
        dims = [graph.features.shape[1]] + [config.hidden] * (config.layers - 1) + [graph.num_classes]
        self.model = GraphModel(config.model, dims, dropout=config.dropout, seed=config.seed, dtype=self.dtype,
                                options=config.layer_options()).to(self.device)
        caching = sampler is not None and getattr(sampler, "cache", -1.0) >= 0  # psc's feature cache feeds layer 0
        self.receiver_dropout = receiver_side(config.dropout_side, config.dropout, config.stale, model_exchange_widths(
            self.model.layers, "per-epoch" if caching else config.input_exchange))
        self.codec = Codec.parse(config.compress, seed=config.seed)
        self.spmm = DistSpMM(self.matrix, config.plan, dtype=self.dtype, device=self.device, strategy=strategy,
                             row_masks=self.receiver_dropout or self.model.needs_source_ids, codec=self.codec)
        if config.progress not in PROGRESS_MODES:
            raise ValueError(f"progress must be one of {PROGRESS_MODES}, got {config.progress!r}")
        strategy.tests_progress = config.progress != "none"
        self.progress_thread = (ProgressThread(comm, lambda: strategy.outstanding() > 0)
                                if config.progress == "thread" and strategy.posts_ahead is None else None)

        features = graph.features.astype(np.float64)
        if config.feature_norm == "row":
            features = row_normalize_features(features)
        elif config.feature_norm != "none":
            raise ValueError(f"feature_norm must be 'row' or 'none', got {config.feature_norm!r}")
        features_tensor = torch.from_numpy(features).to(self.dtype).to(self.device)
        self.labels = torch.from_numpy(graph.labels).to(self.device)
        if graph.multilabel:
            self.labels = self.labels.to(self.dtype)
        self.masks = {split: torch.from_numpy(graph.masks[split].astype(bool)).to(self.device) for split in SPLITS}
        self.train_rows = torch.nonzero(self.masks["train"]).flatten()
        self.train_labels = self.labels.index_select(0, self.train_rows)
        local_counts = np.array([int(graph.masks[s].sum()) for s in SPLITS], dtype=np.int64)
        self.global_counts = dict(zip(SPLITS, self.column_comm.allgather_array(local_counts).sum(axis=0).tolist()))
        if self.global_counts["train"] == 0:
            raise ValueError(f"{graph.name}: the training split is empty")

        try:
            self.input_exchange = choose_input_exchange(
                "per-epoch" if caching else config.input_exchange, grid=self.matrix.grid, layout=graph.layout,
                boundary_counts=self.matrix.boundary_counts, union_sizes=self.matrix.union_sizes, plan=config.plan,
                f_in=dims[0], f_out=dims[1], itemsize=features_tensor.element_size(), epochs=config.epochs,
                evaluations=evaluations(config.epochs, config.eval_every),
                sample_p=float(sampler.p) if sampler is not None else 1.0, receiver=self.receiver_dropout,
                budget=config.halo_budget, layer0=self.model.layers[0].exchange_shape(self.receiver_dropout))
        except HaloBudgetError as exc:
            raise said_once(exc) from None  # decided from global metadata
        self.halo = (StaticHalo(self.spmm.plan, graph.layout, normalized, features_tensor, self.matrix.boundary_counts)
                     if self.input_exchange.mode == "once" else None)  # collective over the replica column
        self.cached_input = None
        if caching:
            self.input_exchange = replace(self.input_exchange, mode="cache", requested=config.input_exchange,
                                          reason=f"{config.sample}: the share {sampler.cache} of boundary rows of "
                                                 f"highest inclusion probability kept, the others fetched when sampled")
            self.cached_input = CachedInput(self.spmm.plan, getattr(strategy, "inner", strategy), features_tensor)
        self.features = self.halo.own_values if self.halo is not None else features_tensor
        self._input = self.halo.values if self.halo is not None else features_tensor
        first = self.model.layer_parameters(0)
        rest = [p for layer in range(1, self.model.num_layers) for p in self.model.layer_parameters(layer)]
        if config.weight_decay_scope == "first":
            groups = [{"params": first, "weight_decay": config.weight_decay}, {"params": rest, "weight_decay": 0.0}]
        elif config.weight_decay_scope == "all":
            groups = [{"params": first + rest, "weight_decay": config.weight_decay}]
        else:
            raise ValueError(f"weight_decay_scope must be 'first' or 'all', got {config.weight_decay_scope!r}")
        self.optimizer = torch.optim.Adam([g for g in groups if g["params"]], lr=config.lr)
        self.sampler = sampler
        self.explainer = self._explainer(strategy) if getattr(sampler, "explains", False) else None
        self.epoch = 0
        self.setup_bytes = _moved_since(comm, built_from)  # what building this trainer moved: set-up and halo
        self.eval_bytes: dict[str, dict[str, int]] = {}

    def forward(self, training: bool, *, exact_exchange: bool = False,
                trace: list[torch.Tensor] | None = None) -> torch.Tensor:
        """This rank's logits for the current epoch (collective); see :meth:`GraphModel.forward`."""
        halo, layer_input = self.halo, self._input
        if self.cached_input is not None and training and not exact_exchange:
            self.cached_input.load(self.epoch)  # collective: the rows of X this epoch's sample needs
            halo, layer_input = self.cached_input, self.cached_input.values
        if self.explainer is not None and training and not exact_exchange:  # dgs: this epoch's feature columns
            scale = self.sampler.feature_scale(self.epoch, layer_input.shape[1])
            layer_input = layer_input * torch.from_numpy(scale).to(layer_input.dtype).to(layer_input.device)
        return self.model(layer_input, self.spmm, first_row=self.first_row, epoch=self.epoch, training=training,
                          timer=self.spmm.timer if training else None, halo=halo,
                          receiver_dropout=self.receiver_dropout, exact_exchange=exact_exchange, trace=trace)

    def _explainer(self, strategy: Any) -> Explainer:
        """DGS's explanation over this rank's rows (:mod:`algorithms.dgs`): the model in evaluation mode with its
        remote rows and input columns masked, layer 0 from the halo where there is one."""
        importance = getattr(strategy, "inner", strategy)
        plan = self.spmm.plan

        def forward(features: torch.Tensor, spmm: Any, nodes: torch.Tensor) -> torch.Tensor:
            halo = MaskedHalo(self.halo, nodes) if self.halo is not None else None
            return self.model(self._input * features, spmm, first_row=self.first_row, epoch=self.epoch,
                              training=False, halo=halo)

        return Explainer(self.sampler, forward, plan.local_block, plan.exact_pairs.remote_block,
                         importance.last_rows, int(sum(plan.exact_pairs.recv_rows)), self.column_comm)

    # ---------------------------------------------------------------- audit
    def _audit_due(self) -> bool:
        every = self.config.audit_every
        return every > 0 and (self.epoch + 1) % every == 0

    def _audit_begin(self) -> dict[str, Any]:
        """The audit's exact forward: this epoch's weights and dropout masks, every exchange exact.

        Runs before the timed step (its compute is cleared with the step's timers), so neither its
        time nor its bytes count as training. Collective.
        """
        before, start = self.comm.stats.snapshot(), time.perf_counter()
        exact: list[torch.Tensor] = []
        with torch.no_grad():
            self.forward(training=True, exact_exchange=True, trace=exact)
        return {"exact": exact, "seconds": time.perf_counter() - start, "bytes": _moved_since(self.comm, before)}

    def _audit_end(self, audit: dict[str, Any], used: list[torch.Tensor]) -> dict[str, Any]:
        """Per layer, ``||H_policy - H_exact||_F / ||H_exact||_F`` over all rows (one allreduce; collective)."""
        before, start = self.comm.stats.snapshot(), time.perf_counter()
        sums = torch.stack([torch.stack([(mine.double() - exact.double()).square().sum(), exact.double().square().sum()])
                            for mine, exact in zip(used, audit["exact"])]).reshape(-1).contiguous()
        self.column_comm.allreduce_(sums, "other")
        totals = sums.view(-1, 2).cpu().numpy()
        errors = [float(np.sqrt(gap / size)) if size > 0 else (0.0 if gap == 0 else float("inf"))
                  for gap, size in totals]
        moved = _moved_since(self.comm, before)
        traffic = {phase: {key: audit["bytes"][phase][key] + moved[phase][key] for key in moved[phase]}
                   for phase in moved}
        return {"layer_error": errors, "seconds": audit["seconds"] + time.perf_counter() - start, "bytes": traffic}

    def attention_bytes(self) -> int:
        """Bytes of the attention structures (GAT) this rank keeps cached with its operators (0 otherwise)."""
        return cached_structure_bytes(self.spmm, self.halo)

    def close(self) -> None:
        """End the run's exchanges (collective over the plan's column; idempotent): complete the pipelined
        flights still outstanding, so none is pending when its buffers go or MPI is finalised, and stop the
        progress thread. Training may go on afterwards (kept flights stay, completed)."""
        self.spmm.strategy.complete_outstanding()
        if self.progress_thread is not None:
            self.progress_thread.stop()
            self.progress_thread = None

    def memory(self) -> dict[str, int]:
        """What this rank keeps for its layer-0 halo (zeros without one)."""
        keeper = self.halo if self.halo is not None else self.cached_input
        return keeper.memory() if keeper is not None else {"halo_rows": 0, "halo_bytes": 0, "matrix_bytes": 0}

    # ----------------------------------------------------------------- loss
    def _local_loss_sum(self, logits: torch.Tensor) -> torch.Tensor:
        picked = logits.index_select(0, self.train_rows)  # fixed rows: no mask-to-index search per epoch
        if self.graph.multilabel:
            total = F.binary_cross_entropy_with_logits(picked, self.train_labels, reduction="sum")
            return total / self.graph.num_classes
        return F.cross_entropy(picked, self.train_labels, reduction="sum")

    def parameters(self) -> list[torch.nn.Parameter]:
        return list(self.model.parameters())

    def train_epoch(self) -> dict[str, Any]:
        """One full-graph step; returns the global loss and this rank's time breakdown (collective).

        Every ``audit_every`` epochs the record also holds ``audit``: per layer, the relative error of
        the layer outputs this step computed under its policy against an exact forward with the same
        weights and masks, and that forward's own seconds and bytes (kept out of the step's figures).
        """
        audit = self._audit_begin() if self._audit_due() else None
        stats_before = self.comm.stats.snapshot()
        self.spmm.reset_compute()
        start = time.perf_counter()
        explained = None
        if self.explainer is not None and self.sampler.recomputes(self.epoch):
            with self.spmm.timer.measure("explain", self.device):  # collective: one allreduce of feature masks
                explained = self.explainer.explain(self.features.shape[1])
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        used: list[torch.Tensor] | None = [] if audit is not None else None
        logits = self.forward(training=True, trace=used)
        loss = self._local_loss_sum(logits) / self.global_counts["train"]
        loss.backward()
        params = self.parameters()
        if self.config.clip > 0:
            # Each of the G row groups clips its local gradient to clip / sqrt(G) (SANCUS' scaling), so the
            # summed gradient stays near the global bound.
            torch.nn.utils.clip_grad_norm_(params, self.config.clip / math.sqrt(self.column_comm.size))
        flat = torch.cat([p.grad.reshape(-1) for p in params] + [loss.detach().reshape(1)])
        self.column_comm.allreduce_(flat, "grad_allreduce")
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        with self.spmm.timer.measure("optimizer", self.device):
            self.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # the epoch's wall time includes its kernels
        wall = time.perf_counter() - start
        broadcasts = self.spmm.strategy.decisions(self.epoch)
        self.epoch += 1
        record = {"epoch": self.epoch, "loss": float(flat[-1]), **self._breakdown(stats_before, wall),
                  "broadcasts": broadcasts, "cache_bytes": self.spmm.strategy.cache_bytes()}
        if explained is not None:
            record["explanation"] = explained
        if self.cached_input is not None:  # this rank's boundary rows the epoch's sample needed, and of them cached
            record["feature_cache"] = {"needed": self.cached_input.needed, "hits": self.cached_input.hits}
        if audit is not None:
            assert used is not None
            record["audit"] = self._audit_end(audit, used)
        return record

    def _breakdown(self, before: dict[str, dict[str, float]], wall: float) -> dict[str, Any]:
        delta = _counters_since(self.comm, before)
        computed = self.spmm.compute_seconds()
        booked = ("local_spmm", "masks", "dropout", "optimizer") + (("explain",) if self.explainer is not None else ())
        parts = {key: computed.get(key, 0.0) for key in booked}
        parts["exchange"] = delta["forward"]["seconds"] + delta["backward"]["seconds"]
        parts["allreduce"] = delta["grad_allreduce"]["seconds"]
        return {
            "time": {"total": wall, **parts, "dense": max(wall - sum(parts.values()), 0.0)},
            "bytes": bytes_by_phase(delta),
        }

    # ----------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Exact forward (no dropout); accuracy (micro-F1 for multi-label) per split, global (collective).

        The bytes it moved (its forward exchanges, and the count gathers) are left in :attr:`eval_bytes`.
        """
        before = self.comm.stats.snapshot()
        metrics = self._evaluate()
        self.eval_bytes = _moved_since(self.comm, before)
        return metrics

    def _evaluate(self) -> dict[str, float]:
        self.model.eval()
        logits = self.forward(training=False)
        if self.graph.multilabel:
            predicted = logits > 0
            truth = self.labels > 0.5
            counts = []
            for split in SPLITS:
                mask = self.masks[split]
                p, t = predicted[mask], truth[mask]
                counts += [int((p & t).sum()), int((p & ~t).sum()), int((~p & t).sum())]
            totals = self.column_comm.allgather_array(np.array(counts, dtype=np.int64)).sum(axis=0)
            result = {}
            for k, split in enumerate(SPLITS):
                tp, fp, fn = totals[3 * k:3 * k + 3]
                result[f"{split}_f1"] = float(2 * tp / max(2 * tp + fp + fn, 1))
            return result
        correct = logits.argmax(dim=1) == self.labels
        counts = np.array([int(correct[self.masks[s]].sum()) for s in SPLITS], dtype=np.int64)
        totals = self.column_comm.allgather_array(counts).sum(axis=0)
        return {f"{split}_acc": float(totals[k] / max(self.global_counts[split], 1)) for k, split in enumerate(SPLITS)}

    @torch.no_grad()
    def predictions(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """This rank's (global row ids, predicted classes or 0/1 matrix) of ``split`` from an exact forward."""
        self.model.eval()
        logits = self.forward(training=False)
        mask = self.masks[split]
        rows = torch.nonzero(mask).flatten() + self.first_row
        predicted = (logits[mask] > 0).to(torch.int64) if self.graph.multilabel else logits[mask].argmax(dim=1)
        return rows.cpu().numpy(), predicted.cpu().numpy()

    # ------------------------------------------------------------ checkpoint
    def state(self) -> dict[str, Any]:
        """Everything needed to continue exactly, the same on every rank and at any ``P`` (weights and Adam
        state are replicated, dropout masks and sampling decisions are counter-based per global row): weights,
        optimiser, epoch, RNG, fingerprint, and where it was written."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "epoch": self.epoch,
                "torch_rng": torch.get_rng_state(), "config": self.config.fingerprint(),
                "graph": {"name": self.graph.name, "nodes": self.graph.layout.n_rows},
                "written_at": self.written_at(), "feature_p": self._feature_p()}

    def _feature_p(self) -> torch.Tensor | None:
        """DGS: the feature columns' probabilities of the last explanation (the same on every rank, so they
        belong to the replicated state and survive a resume at another ``P``)."""
        feature_p = getattr(self.sampler, "feature_p", None) if self.explainer is not None else None
        return None if feature_p is None else torch.from_numpy(np.array(feature_p, copy=True))

    def written_at(self) -> dict[str, Any]:
        """What per-rank policy state depends on: world size, replication and plan."""
        return {"world_size": self.comm.size, "replication": self.config.replication, "plan": self.config.plan}

    def load_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.epoch = int(state["epoch"])
        torch.set_rng_state(state["torch_rng"])
        if self.explainer is not None and state.get("feature_p") is not None:
            self.sampler.feature_p = state["feature_p"].numpy().copy()

    @property
    def has_policy_state(self) -> bool:
        """Whether this run keeps per-rank exchange state (caches) that a checkpoint must save.

        Decided by the configuration alone, so it is the same on every rank.
        """
        return self.spmm.strategy.keeps_state or (self.codec is not None and self.codec.feedback)

    def policy_state(self) -> dict[str, Any]:
        """This rank's policy state (caches and versions); per rank, unlike :meth:`state`."""
        return {"rank": self.comm.rank, "world_size": self.comm.size, "epoch": self.epoch,
                "strategy": self.spmm.strategy.state_dict(),
                "codec": self.codec.state_dict() if self.codec is not None else None,
                "explanation": self._explanation_state()}

    def _explanation_state(self) -> dict[str, Any] | None:
        """DGS: this rank's node probabilities and the latest received rows its explanations read."""
        if self.explainer is None:
            return None
        node_p, rows = self.sampler.node_p, getattr(self.spmm.strategy, "inner", self.spmm.strategy).last_rows
        return {"node_p": None if node_p is None else torch.from_numpy(np.array(node_p, copy=True)),
                "last_rows": {layer: values.cpu() for layer, values in rows.items()}}

    def load_policy_state(self, state: dict[str, Any]) -> None:
        self.spmm.strategy.load_state_dict(state["strategy"])
        if self.codec is not None and state.get("codec") is not None:
            self.codec.load_state_dict(state["codec"], self.device)
        explanation = state.get("explanation")
        if self.explainer is not None and explanation is not None:
            self.sampler.node_p = None if explanation["node_p"] is None else explanation["node_p"].numpy().copy()
            rows = getattr(self.spmm.strategy, "inner", self.spmm.strategy).last_rows  # the explainer holds it
            rows.clear()
            rows.update({int(layer): values.to(self.device) for layer, values in explanation["last_rows"].items()})

    def policy_mismatch(self, state: dict[str, Any]) -> str | None:
        expected = (self.comm.rank, self.comm.size, self.epoch)
        found = (state.get("rank"), state.get("world_size"), state.get("epoch"))
        if found != expected:
            return f"policy state is for (rank, world size, epoch) {found}, this run needs {expected}"
        return None

    def mismatch(self, state: dict[str, Any]) -> str | None:
        """Why a checkpoint does not belong to this run (the differing fields, both values), or None."""
        return checkpoint_mismatch(state, self.config.fingerprint(), {"name": self.graph.name,
                                                                       "nodes": self.graph.layout.n_rows})

