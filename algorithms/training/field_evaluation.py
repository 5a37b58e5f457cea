"""Exact evaluations from the receptive field each rank holds (``evaluation_plan="field"``): no exchange per
evaluation.

At set-up every rank gathers the rows of ``Â`` and ``X`` its own rows' outputs depend on through the model's
layers (:class:`~sparse_dist.receptive_field.ReceptiveField`); an evaluation then computes its own rows' logits
from them with the replicated weights (:meth:`GraphModel.forward_on_field`), so it moves nothing but the
accuracy counts' allreduce. The logits are an exact forward's (the same products, partial sums added in another
order: equal to rounding), so every metric a run reports is an exact evaluation's. The price is compute on the
field's outer rings, every evaluation, and the field's memory (:meth:`FieldEvaluation.memory`).

Where a layer sees its input only through ``Â X`` (GCN), layer 0's product over the field is made once here and
kept instead of ``X``'s rows (an evaluation's layer 0 is one GEMM), as the static input's halo does for the
exchanging evaluation (:meth:`StaticHalo.aggregate`). Where the run reads exact references of its training
forward (the guard's bias signal, the audit: the same weights and dropout masks, every exchange exact), they come
from the field too, with each row's mask drawn by its global id as its owner draws it; ``X``'s rows are then
kept as well. Priced from an evaluation's seconds, such a reference must cost what an evaluation costs: an
exchanged one over a slow link cost 6.4 s where the field's evaluation took 0.3 s (200k synthetic, P = 2,
200 Mbit/s).

Collective: construction (the field's pulls, over the replica column).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import scipy.sparse as sp
import torch

from sparse_dist.receptive_field import ReceptiveField

if TYPE_CHECKING:
    from algorithms.model import GraphModel
    from algorithms.training.graph import LocalGraph
    from sparse_dist.exchange_plan import ExchangePlan
    from sparse_dist.halo import StaticHalo
    from sparse_dist.lossless_wire import WireRows

_log = logging.getLogger(__name__)


class FieldEvaluation:
    """This rank's receptive field and what an evaluation reads of it (module docstring)."""

    def __init__(self, plan: ExchangePlan, graph: LocalGraph, normalized: sp.csr_matrix, model: GraphModel,
                 features: torch.Tensor, halo: StaticHalo | None, wire: WireRows | None, *,
                 references: bool = False) -> None:
        """Gather the field (collective over ``plan.col_comm``). ``normalized``: this row group's rows of ``Â``
        (global columns); ``features``: its rows of layer 0's input; ``halo``: the static input's halo where the
        run keeps one (its rows of ``X`` are not pulled again); ``wire``: the own rows as they travel.
        ``references``: exact forwards with training's dropout masks are read from the field too (the guard's
        bias reference, the audit), so ``X``'s rows are kept beside layer 0's product."""
        start = time.perf_counter()
        self.first_row, self.takes_references = graph.layout.offsets[plan.group], references
        held = (halo.halo_ids, halo.values[halo.own_count:]) if halo is not None else None
        self.field = ReceptiveField(plan.col_comm, graph.layout, plan.group, normalized, model.num_layers, features,
                                    plan.products, held=held, wire=wire)
        self.first_product: torch.Tensor | None = None
        if model.layers[0].input_only_through_product:
            with torch.no_grad():
                self.first_product = self.field.multiply(0, self.field.inputs)
            if not references:
                self.field.drop_inputs()
        self.setup_seconds = time.perf_counter() - start
        _log.info("receptive field: %s rows per layer input (own %d), gathered in %.2f s",
                  self.field.sizes, self.field.sizes[-1], self.setup_seconds)

    @torch.no_grad()
    def logits(self, model: GraphModel, epoch: int, training: bool = False,
               trace: list[torch.Tensor] | None = None) -> torch.Tensor:
        """This rank's exact logits (``n_g x C``) of ``model``'s current weights (local). ``training``: with
        ``epoch``'s dropout masks, as an exact reference forward of a training step (needs ``takes_references``);
        ``trace``: each layer's own output rows appended, as :meth:`GraphModel.forward`'s."""
        if training and not self.takes_references:
            raise ValueError("this receptive field keeps no rows of X: it evaluates, it reads no training reference")
        return model.forward_on_field(self.field, first_row=self.first_row, epoch=epoch, training=training,
                                      first_product=self.first_product, trace=trace)

    def memory(self) -> dict[str, int]:
        """Rows and bytes the field keeps on this rank (:meth:`ReceptiveField.memory`, with layer 0's kept product)."""
        kept = self.field.memory()
        if self.first_product is not None:
            kept["input_bytes"] += self.first_product.numel() * self.first_product.element_size()
        return kept
