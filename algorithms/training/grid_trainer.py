"""Full-graph training over a process grid (``train --grid X,Y,Z``): the epoch loop's trainer for the 3D plan of
:mod:`sparse_dist.grid_gcn`, with the same face as the 1D :class:`~algorithms.training.trainer.Trainer` (steps,
exact evaluations, predictions, checkpoint state, the set-up figures), so that the train command's loop, results
file and checkpoints serve both.

Who owns what: a rank keeps, of each weight and bias, the block it multiplies
(:func:`sparse_dist.grid_gcn.weight_block`, :func:`~sparse_dist.grid_gcn.bias_block`; the order a layer kind
takes is its :class:`~algorithms.grid_model.GridForm`) and Adam's moments of that block. The blocks start as
cuts of the 1D model's weights of the same seed; the grid's backward allreduces each block's gradient over the
ranks that hold it (depth), so every holder steps its block alike, and Adam being elementwise, the blocks are
the 1D weights' blocks to rounding. A checkpoint is the 1D trainer's: :meth:`GridTrainer.state` (collective)
puts the blocks of the weights and of both moments back into whole matrices (the ranks at depth 0, and for a
bias inner 0, write theirs, the rest zeros, one allreduce over every rank in phase ``other``: exact, each entry
has one writer), and :meth:`~GridTrainer.load_state` cuts a 1D checkpoint's: either resumes in the other, at
any grid and any ``P``.

Bytes of a step, per rank: the grid's collectives (:func:`sparse_dist.grid_gcn.layer_collectives`, the
loss's; :meth:`GridTrainer.predicted_step_bytes`), nothing else. Layer 0's aggregation ``Â X`` is computed once at set-up (phase ``halo``); a step reuses it without dropout, and an
evaluation always (it has no dropout). With dropout every layer's input is masked by the 1D rule's masks
(:class:`algorithms.grid_dropout.GridDropout`), layer 0 aggregated every step. With ``--compress`` a step's
aggregation and combination allreduces and their gradients' travel coded (:mod:`sparse_dist.grid_links`; the
byte model counts them so), and the guard watches the run and may tighten the codec
(:mod:`algorithms.training.grid_policy`); evaluations stay exact.

Collective: construction, :meth:`GridTrainer.train_epoch`, :meth:`~GridTrainer.evaluate`,
:meth:`~GridTrainer.predictions` and :meth:`~GridTrainer.state` are entered by every rank in the same order.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from algorithms.grid_dropout import GridDropout, load_grid_passes
from algorithms.layers import layer_type
from algorithms.model import GraphModel
from algorithms.training import grid_policy
from algorithms.training.grid_state import GridCheckpointState
from algorithms.training.alongside import EvaluationShare
from algorithms.training.assembly import make_optimizer
from algorithms.training.config import TrainConfig
from algorithms.training.guard import Guard
from algorithms.training.metrics import SPLITS, TIMED_PARTS, moved_since, step_breakdown
from algorithms.training.tighten import ActivePolicies, tighten
from sparse_dist.comm import Communicator, said_once
from sparse_dist.compress import Codec
from sparse_dist.grid import ProcessGrid, roles
from sparse_dist.grid_gcn import (GridCrossEntropy, as_blocks, bias_block, grid_logits, input_bytes,
                                  predicted_classes, step_bytes, weight_block)
from sparse_dist.grid_links import GridLinks

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GridInput:
    """How layer 0 gets its input on the grid: ``Â X`` aggregated once at set-up (``once_bytes`` on this rank,
    phase ``halo``); with dropout a step aggregates its masked input again (``per-epoch``), evaluations reuse it."""

    mode: str
    once_bytes: int

    def record(self) -> dict[str, Any]:
        return {"mode": self.mode, "requested": "auto", "once_bytes": self.once_bytes, "reason": self.reason}

    @property
    def reason(self) -> str:
        return ("the grid aggregates X once; dropout masks layer 0's input anew every step" if self.mode != "once"
                else "the grid aggregates X once")

    def describe(self) -> str:
        return (f"layer-0 input: {self.mode} ({self.reason}): {self.once_bytes / 1e6:.1f} MB on this rank at "
                f"set-up")


class GridTrainer(grid_policy.GridPolicyState, GridCheckpointState):
    """One rank's part of a grid run (module docstring): its blocks of ``Â``, layer 0's aggregation, its output
    rows' labels and masks, its blocks of the weights and their Adam (:attr:`block_optimizer`). ``model`` and
    ``optimizer`` are the whole weights and Adam in the 1D form, filled only to write or read a checkpoint."""

    def __init__(self, comm: Communicator, grid: ProcessGrid, graph: Any, config: TrainConfig,
                 device: torch.device) -> None:
        """``graph``: this rank's blocks as :func:`runners.data.grid_reader.load_grid_graph` reads them for
        ``config.model``'s :class:`~algorithms.grid_model.GridForm` (its adjacency blocks are taken over)."""
        self.comm, self.config, self.device, self.grid = comm, config, torch.device(device), grid
        form = layer_type(config.model).grid_form
        if form is None:  # train's flags refuse it first; a library caller hears the same sentence
            raise ValueError(grid_kind_refusal(config.model))
        self.form, self.shape, self.meta = form, grid.shape, graph.meta
        self.dtype = {"float32": torch.float32, "float64": torch.float64}[config.dtype]
        built_from = comm.stats.snapshot()
        itemsize = torch.tensor([], dtype=self.dtype).element_size()
        dropping = config.dropout > 0.0
        self.blocks = as_blocks(graph.adjacency, self.dtype, self.device)
        self.nonzeros = sum(block.nnz for block in graph.adjacency)
        graph.adjacency = []
        self.nodes, layers = graph.num_nodes, config.layers
        self.dims = [graph.feature_dim] + [config.hidden] * (layers - 1) + [graph.num_classes]
        self.model = GraphModel(config.model, self.dims, dropout=config.dropout, seed=config.seed, dtype=self.dtype,
                                options=config.layer_options()).to(self.device)
        self.optimizer = make_optimizer(self.model, config)  # the checkpoint's form; the blocks' steps
        self._cut = {(index, name): self._cut_of(index, whole.detach()).requires_grad_()
                     for index, layer in enumerate(self.model.layers) for name, whole in layer.named_parameters()}
        self.block_optimizer = make_optimizer(self.model, config, parameters_of=lambda index: [
            self._cut[(index, name)] for name, _ in self.model.layers[index].named_parameters()])
        self.layer_fn = form.layers(self.grid, self.nodes)
        features = torch.from_numpy(graph.features).to(self.device)
        self.first = form.first_aggregation(features, self.blocks[0], self.grid, self.nodes)  # phase halo, once
        self.features = features if dropping else None  # without dropout X is not read again
        if dropping and (seconds := load_grid_passes(self.grid, self.nodes, self.dims, self.device, self.dtype,
                                                        config.epochs)):
            _log.info("loaded the compiled dropout passes in %.2f s", seconds)
        self.input_exchange = GridInput("per-epoch" if dropping else "once",
                                        input_bytes(self.shape, self.grid.coords, self.nodes, self.dims[0], itemsize,
                                                    form.terms))
        self._labels_and_masks(graph)
        self.epoch = 0
        self.policies = ActivePolicies(config.sample, config.stale, config.compress)  # the guard may tighten them
        self.codec = Codec.parse(config.compress, seed=config.seed)  # a step's messages (sparse_dist.grid_links)
        self.guard = Guard(config.guard_settings(), comm, active=not self.policies.is_exact,
                           validation_size=self.global_counts["val"], epochs=config.epochs)
        self.steering, self.work = None, []  # what the 1D state functions ask of a run (none here)
        self.receiver_dropout, self.progress_mode, self.plan_setup_seconds = False, None, None
        self.evaluation_plan_setup_seconds: float | None = None  # evaluations exchange on the grid itself
        self.setup_bytes = moved_since(comm, built_from)
        self.eval_bytes: dict[str, dict[str, int]] = {}

    def _labels_and_masks(self, graph: Any) -> None:
        """The output rows' labels and masks, and the global count of each split: rows are counted by the ranks
        at outer and inner 0 of the last layer (the others hold the same rows' predictions). Collective."""
        outer, inner, _ = roles(self.config.layers - 1)
        self.output_first_row = graph.output_rows[0]
        self.class_lo = self.grid.block(graph.num_classes, outer)[0]
        self.counts_rows = self.grid.coords[outer] == 0 and self.grid.coords[inner] == 0
        self.labels = torch.from_numpy(graph.labels.astype(np.int64)).to(self.device)
        self.masks = {split: torch.from_numpy(graph.masks[split]).to(self.device) for split in SPLITS}
        local = np.array([int(graph.masks[s].sum()) if self.counts_rows else 0 for s in SPLITS], dtype=np.int64)
        self.global_counts = dict(zip(SPLITS, self.comm.allgather_array(local).sum(axis=0).tolist()))
        if self.global_counts["train"] == 0:
            raise said_once(ValueError(f"{self.meta['name']}: the training split is empty"))

    # ---------------------------------------------------------------- steps
    def _cut_of(self, index: int, whole: torch.Tensor) -> torch.Tensor:
        """This rank's block of layer ``index``'s weight (``W[i, o]``) or bias (``b[o]``), a copy."""
        return weight_block(self.grid, index, whole) if whole.dim() == 2 else bias_block(self.grid, index, whole)

    def weight_blocks(self) -> list[tuple[torch.Tensor, ...]]:
        """Each layer's blocks in the grid layer's order (:class:`~algorithms.grid_model.GridForm`)."""
        return [tuple(self._cut[(index, name)] for name in self.form.parameters)
                for index in range(self.config.layers)]

    def forward_logits(self, blocks: list[tuple[torch.Tensor, ...]], dropout: GridDropout | None,
                codec: Codec | None = None) -> torch.Tensor:
        """The last layer's output block ``[d, o]`` (collective over the grid); ``codec``: the layers' messages
        coded (a training step's), else exact."""
        return grid_logits(self.features if dropout is not None else None, blocks, self.blocks, self.grid,
                           first_aggregation=None if dropout is not None else self.first, layer_fn=self.layer_fn,
                           dropout=dropout, links=lambda layer: GridLinks(self.grid, layer, codec, self.epoch))

    def train_epoch(self, evaluation_follows: bool = False, evaluate_alongside: bool = False) -> dict[str, Any]:
        """One full-graph Adam step over the grid; its record (loss, time breakdown, bytes per phase) as the 1D
        trainer's (collective). An evaluation is always its own forward after the step (:meth:`evaluate`), so
        ``evaluation_follows`` changes nothing; ``evaluate_alongside`` is refused by the command's flags."""
        if evaluate_alongside:
            raise ValueError("the grid trainer evaluates after a step, not beside the next one")
        guarded = tighten(self) if self.guard.due else None  # agreed at the last evaluation: collective
        referenced = self.guard.reference_due(self.epoch + 1)  # the same on every rank
        before, start = self.comm.stats.snapshot(), time.perf_counter()
        self.model.train()
        self.block_optimizer.zero_grad(set_to_none=True)
        dropout = (GridDropout(self.config.dropout, self.config.seed, self.epoch, self.grid, self.nodes, self.dims)
                   if self.config.dropout > 0.0 else None)
        logits = self.forward_logits(self.weight_blocks(), dropout, self.codec)
        loss = GridCrossEntropy.apply(logits, self.labels, self.masks["train"], self.class_lo,
                                      self.global_counts["train"], self.grid, self.config.layers - 1)
        loss.backward()  # each block's gradient allreduced over the ranks that hold it
        reference, share = None, EvaluationShare()
        if referenced:  # before the weights move: the exact forward of the same weights and masks, kept apart
            reference = grid_policy.reference_reading(self, logits.detach(), float(loss.detach()), dropout, share)
        began = time.perf_counter()
        self.block_optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        before, wall = share.excluded_from(before, time.perf_counter() - start)
        computed = {"optimizer": time.perf_counter() - began}
        self.epoch += 1
        self.guard.note_step(wall)  # the steps' own seconds: the bias reference's budget
        self.guard.observe_loss(self.epoch, float(loss.detach()))
        record = {"epoch": self.epoch, "loss": float(loss.detach()),
                  **step_breakdown(self.comm, before, wall, computed, TIMED_PARTS), "broadcasts": [], "cache_bytes": 0}
        if guarded is not None:
            record["guard"] = guarded
        if reference is not None:
            record["guard_reference"] = {**self.guard.observe_reference(self.epoch, reference, share.wall),
                                         "bytes": share.bytes()}
        return record

    def predicted_step_bytes(self) -> dict[str, int]:
        """Bytes this rank sends in a step, per phase, from the byte model (module docstring)."""
        return step_bytes(self.shape, self.grid.coords, self.nodes, self.dims, self.first.element_size(),
                          self.form.terms, input_once=self.config.dropout == 0.0, codec=self.codec)

    # ----------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, float]:
        """Exact forward (no dropout); accuracy per split, global (collective); its bytes in :attr:`eval_bytes`."""
        start = time.perf_counter()
        metrics = self.measured_evaluation()
        seconds = time.perf_counter() - start
        self.guard.observe_metrics(self.epoch, metrics, self._kept_state)  # collective: agrees on a fall
        self.guard.price_reference(self.epoch, seconds)  # collective where it chooses the bias signal's interval
        return metrics

    @torch.no_grad()
    def measured_evaluation(self) -> dict[str, float]:
        before = self.comm.stats.snapshot()
        self.model.eval()
        classes = self._classes()
        correct = classes == self.labels
        counts = np.array([int(correct[self.masks[s]].sum()) if self.counts_rows else 0 for s in SPLITS],
                          dtype=np.int64)
        totals = self.comm.allgather_array(counts).sum(axis=0)
        self.eval_bytes = moved_since(self.comm, before)
        return {f"{split}_acc": float(totals[k] / max(self.global_counts[split], 1)) for k, split in enumerate(SPLITS)}

    @torch.no_grad()
    def _classes(self) -> torch.Tensor:
        """Each output row's predicted class from an exact forward (collective)."""
        logits = self.forward_logits([tuple(block.detach() for block in blocks) for blocks in self.weight_blocks()], None)
        return predicted_classes(logits, self.class_lo, self.grid, self.config.layers - 1)

    def predictions(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """This rank's (global row ids, predicted classes) of ``split`` from an exact forward (collective; the
        ranks of one depth block give the same rows)."""
        classes, mask = self._classes(), self.masks[split]
        rows = torch.nonzero(mask).flatten() + self.output_first_row
        return rows.cpu().numpy(), classes[mask].cpu().numpy()

    def evaluation_memory(self) -> None:
        """Evaluations keep nothing of their own on the grid (they exchange on the grid itself)."""
        return None

    def memory(self) -> dict[str, int]:
        """What this rank keeps for layer 0 (its aggregation) and of ``Â`` (its blocks' nonzeros)."""
        itemsize = self.first.element_size()
        return {"halo_rows": int(self.first.shape[0]), "halo_bytes": int(self.first.numel() * itemsize),
                "matrix_bytes": int(self.nonzeros * (itemsize + 4))}

    def attention_bytes(self) -> int:
        return 0

    def close(self) -> None:
        """Nothing stays in flight between steps on the grid."""


def grid_kind_refusal(kind: str) -> str:
    """The sentence that refuses a layer kind the grid does not run."""
    from algorithms.layers import LAYER_TYPES

    runs = " and ".join(name for name, known in LAYER_TYPES.items() if known.grid_form is not None)
    return f"--grid runs {runs} layers, not {kind}; use a 1D plan (--plan p2p) for {kind}"


__all__ = ["GridInput", "GridTrainer", "grid_kind_refusal"]
