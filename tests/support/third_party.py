"""A third party's layer and staleness rule, written as docs/design/extending.md says and registered from this
module alone (no project file names them): importing it registers the ``gin-like`` layer kind and the
``every-third`` rule in this process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import scipy.sparse as sp
import torch

from algorithms.layers import GraphLayer, LayerOptions, glorot, register_layer
from algorithms.policies import PolicyBase, register_staleness


@register_layer
class GinLike(GraphLayer):
    """GIN's sum with a two-layer MLP: ``H' = relu((H + A H) W_1) W_2 + b``; parameters ``[W_1, W_2, b]``.

    ``A`` is the raw adjacency (a sum over in-neighbours), so the layer aggregates ``F_in`` columns before any
    weight: its exchange carries ``H`` whatever the widths.
    """

    kind = "gin-like"

    def __init__(self, fan_in: int, fan_out: int, *, generator: torch.Generator,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__(fan_in, fan_out)
        self.weight = torch.nn.Parameter(glorot(generator, fan_in, fan_out).to(dtype))
        self.inner_weight = torch.nn.Parameter(glorot(generator, fan_out, fan_out).to(dtype))
        self.bias = torch.nn.Parameter(torch.zeros(fan_out, dtype=dtype))

    @classmethod
    def normalize_adjacency(cls, comm, layout, rows, group):
        return sp.csr_matrix(rows, dtype=np.float64)  # the sum needs no degrees: local

    @classmethod
    def parameter_count(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions) -> int:
        return fan_in * fan_out + fan_out * fan_out + fan_out

    @classmethod
    def dense_work(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions) -> int:
        return fan_in * fan_out + fan_out * fan_out

    @classmethod
    def exchange_columns(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions,
                         receiver: bool) -> tuple[int, bool]:
        return fan_in, False  # H travels (the MLP is not linear); layer 0's input needs no gradient

    def forward(self, h, spmm, context, weight_scale=1.0):
        summed = context.self_rows(h) + spmm(h, context)  # linear in h: the dropout scale rides on W_1
        return torch.relu(summed @ (self.weight * weight_scale)) @ self.inner_weight + self.bias


@dataclass(frozen=True)
class EveryThird(PolicyBase):
    """Owners send in every third epoch; in the others receivers reuse their cached blocks. It declares only what
    differs from :class:`PolicyBase`'s defaults (no gap, gradients every epoch, not pipelined, no agreement)."""

    name: ClassVar[str] = "every-third"
    caches: ClassVar[bool] = True

    def scheduled_share(self) -> float:
        return 1.0 / 3.0

    def decide(self, view, comm) -> np.ndarray:
        return (view.versions < 0) | (view.epoch % 3 == 0)


register_staleness("every-third", lambda **params: EveryThird(), {}, "every-third")
