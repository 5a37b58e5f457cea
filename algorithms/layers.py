"""Graph layers as modules, and the registry that names them.

A layer is compute only (the PyTorch Geometric manner): given this rank's
rows ``h`` (``n_g x F_in``), the distributed SpMM and the exchange context,
it returns this rank's rows of ``H'`` (``n_g x F_out``). Activation and
dropout belong to the model (:class:`algorithms.model.GraphModel`). Each
layer class declares what the rest of the code needs to know about it:

* ``kind``: its name (``--layer-kind`` on the command line);
* :meth:`GraphLayer.normalize_adjacency`: the adjacency its SpMM multiplies by;
* its constructor: its parameters and how they are drawn from the shared
  ``torch.Generator``.

So nothing switches on the name string, and a new layer type is one class
plus :func:`register_layer`, touching no other layer. Optional declarations
(defaults suit the SpMM layers): ``activation`` (the model's activation after
the layer when it is not the last: ``relu`` or ``elu``), ``takes_operator``
(the layer is handed the operator object itself instead of the SpMM callable:
attention needs the exchange's rows, :mod:`algorithms.gat`), ``takes_options`` and
:meth:`GraphLayer.build` (how a model's :class:`LayerOptions` shape the layer), and the answers
estimators read from the flags alone, before any weight exists (memory and disk estimates, the
performance model, the byte model of layer 0's input): :meth:`GraphLayer.output_width`,
:meth:`GraphLayer.parameter_count`, :meth:`GraphLayer.dense_work`, :meth:`GraphLayer.edge_values` and
:meth:`GraphLayer.exchange_columns` (its built form :meth:`GraphLayer.exchange_shape`).

Layer math (DESIGN section 5):

* GCN: ``H' = Â H W + b``.
* SAGE-mean: ``H' = H W_self + (Ā H) W_neigh + b``.

Both propagate with :func:`propagate`: when the layer shrinks the width
(``F_out < F_in``) it computes ``A (H W)`` so the exchange carries ``F_out``
columns, else ``(A H) W``.

Initial weights: Glorot-uniform, :func:`glorot`, drawn in a fixed order
(GCN: ``W``; SAGE: ``W_self`` then ``W_neigh``); biases zero. Parameters
are registered in the order :meth:`GraphModel.layer_parameters` reports
them (GCN ``[W, b]``; SAGE ``[W_self, W_neigh, b]``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import ClassVar

import scipy.sparse as sp
import torch
from torch import nn

from algorithms.grid_model import GCN_GRID, SAGE_GRID, GridForm
from algorithms.normalize import gcn_normalize, mean_normalize
from sparse_dist.comm import Communicator
from sparse_dist.layout import RowLayout

from sparse_dist.exchange import ExchangeContext

SpMM = Callable[[torch.Tensor, ExchangeContext], torch.Tensor]
"""``spmm(h, context)``: this rank's rows of ``A h`` (autograd-aware, collective)."""

__all__ = ["ExchangeContext", "GCNLayer", "GraphLayer", "LAYER_TYPES", "LayerOptions", "SAGELayer", "SpMM", "glorot",
           "layer_type", "propagate", "register_layer"]

ACTIVATIONS: tuple[str, ...] = ("relu", "elu")


@dataclass(frozen=True)
class LayerOptions:
    """Model-wide options only some layer kinds take (attention: :mod:`algorithms.gat`).

    ``heads``: attention heads of every hidden layer (concatenated); ``output_heads``: of the last
    layer (averaged); ``attention_dropout``: dropout probability on the attention weights.
    """

    heads: int = 1
    output_heads: int = 1
    attention_dropout: float = 0.0

    def is_default(self) -> bool:
        return self == LayerOptions()


def glorot(generator: torch.Generator, fan_in: int, fan_out: int) -> torch.Tensor:
    """Glorot-uniform ``fan_in x fan_out`` float64 matrix: ``(U[0,1) * 2 - 1) * sqrt(6 / (fan_in + fan_out))``."""
    bound = math.sqrt(6.0 / (fan_in + fan_out))
    return (torch.rand(fan_in, fan_out, generator=generator, dtype=torch.float64) * 2 - 1) * bound


def propagate(spmm: SpMM, h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
              context: ExchangeContext) -> torch.Tensor:
    """``A h W (+ b)``, exchanging the narrower of ``h`` and ``h W``.

    Under receiver-side dropout (``context.dropout``) the exchange must carry ``h`` itself (the
    receivers mask its rows before anything multiplies them), so it aggregates first whatever
    the widths. The bias rides on an op that writes a fresh tensor anyway (``addmm``, or in
    place on the SpMM's own output). ``context.unmasked`` (``h`` without its dropout mask, owner side)
    becomes the unmasked value of what travels (``unmasked @ W`` where ``h W`` does). Collective
    (the SpMM is).
    """
    if weight.shape[1] < weight.shape[0] and context.dropout is None:
        unmasked = context.unmasked
        if unmasked is not None:
            context = replace(context, unmasked=lambda: unmasked() @ weight)
        out = spmm(h @ weight, context)
        return out if bias is None else out.add_(bias)
    aggregated = spmm(h, context)
    return aggregated @ weight if bias is None else torch.addmm(bias, aggregated, weight)


def _scaled(weight: torch.Tensor, scale: float) -> torch.Tensor:
    return weight * scale if scale != 1.0 else weight


class GraphLayer(nn.Module, ABC):
    """One graph layer: ``n_g x fan_in`` rows in, ``n_g x fan_out`` rows out.

    Subclasses set ``kind``, implement :meth:`normalize_adjacency` and
    :meth:`forward`, and create their parameters in ``__init__`` from
    ``generator`` (the model passes one generator through every layer in
    order, so the draw order is the layer order, then the order inside the
    layer). Register parameters in the order the optimiser should see them.
    """

    kind: ClassVar[str]
    weight_matrices: ClassVar[int] = 1  # fan_in x fan_out products per row (performance model: work, parameters)
    activation: ClassVar[str] = "relu"  # applied by the model after this layer unless it is the last
    takes_operator: ClassVar[bool] = False  # forward gets the operator (DistSpMM / StaticHalo), not a callable
    takes_options: ClassVar[bool] = False  # builds from non-default LayerOptions (heads, attention dropout)
    # the layer sees its input only through the product A h (no self term, no attention): an evaluation may
    # hand layer 0 the static input's kept product (StaticHalo.aggregate) and an operator that returns it as is
    input_only_through_product: ClassVar[bool] = False
    # how the process grid runs this kind (algorithms.grid_model), or None where it does not (``train --grid``)
    grid_form: ClassVar[GridForm | None] = None

    def __init__(self, fan_in: int, fan_out: int) -> None:
        super().__init__()
        self.fan_in, self.fan_out = fan_in, fan_out

    @classmethod
    def build(cls, fan_in: int, fan_out: int, *, generator: torch.Generator, dtype: torch.dtype, last: bool,
              seed: int, options: LayerOptions) -> "GraphLayer":
        """The model's layer mapping ``fan_in`` columns to ``fan_out`` (``last``: the output layer).

        Layers without options refuse non-default ones; the output width is ``layer.fan_out``.
        """
        if not options.is_default():
            takers = " or ".join(kind for kind, known in LAYER_TYPES.items() if known.takes_options)
            raise ValueError(f"the {cls.kind} layer takes no attention options (heads, output heads, attention "
                             f"dropout), got {options}; they are for --layer-kind {takers or 'a kind that takes them'}")
        return cls(fan_in, fan_out, generator=generator, dtype=dtype)  # type: ignore[call-arg]

    # What estimators (memory and disk, the performance model, bench peers) ask of a layer from the flags alone,
    # before any weight is drawn: ``fan_in`` columns in, ``fan_out`` the model's width for the layer (its ``dims``
    # entry), ``last`` the output layer, ``options`` the model's :class:`LayerOptions`. The defaults describe an
    # SpMM layer with ``weight_matrices`` products of ``fan_in x fan_out`` and one bias (:func:`propagate`).

    @classmethod
    def output_width(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions) -> int:
        """Columns the layer gives the next one (its ``fan_out`` once built)."""
        return fan_out

    @classmethod
    def parameter_count(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions) -> int:
        """Trainable values the layer holds, exactly as built: ``weight_matrices`` weights and one bias."""
        return cls.weight_matrices * fan_in * fan_out + fan_out

    @classmethod
    def dense_work(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions) -> int:
        """Multiply-adds of the layer's dense products per row (the performance model's dense work)."""
        return cls.weight_matrices * fan_in * fan_out

    @classmethod
    def edge_values(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions) -> int:
        """Values per stored entry of the row group the layer keeps for its backward (attention's per-edge
        terms); 0 for an SpMM layer, whose products keep nothing per entry (the memory estimate)."""
        return 0

    @classmethod
    def exchange_columns(cls, fan_in: int, fan_out: int, *, last: bool, options: LayerOptions,
                         receiver: bool) -> tuple[int, bool]:
        """Columns one training exchange of the layer carries, and whether its backward exchanges even where the
        layer input needs no gradient (layer 0). ``receiver``: under receiver-side dropout (the input travels).
        The SpMM rule of :func:`propagate`: ``H W`` where that is narrower (its gradient returns), else ``H``."""
        width = cls.output_width(fan_in, fan_out, last=last, options=options)
        if width < fan_in and not receiver:
            return width, True
        return fan_in, False

    def exchange_shape(self, receiver: bool) -> tuple[int, bool] | None:
        """:meth:`exchange_columns` of this built layer (a layer whose answer depends on ``last`` or its
        options overrides this too, as attention does)."""
        return type(self).exchange_columns(self.fan_in, self.fan_out, last=False, options=LayerOptions(),
                                           receiver=receiver)

    @property
    def needs_source_ids(self) -> bool:
        """Whether training needs the global ids of the rows an exchange brings (beyond receiver-side dropout)."""
        return False

    @classmethod
    @abstractmethod
    def normalize_adjacency(cls, comm: Communicator, layout: RowLayout, rows: sp.csr_matrix,
                            group: int) -> sp.csr_matrix:
        """This row group's normalised adjacency rows (global column ids), float64 CSR.

        ``rows`` are row group ``group``'s raw adjacency rows under ``layout``.
        May be collective over ``comm`` (see the subclass): every rank of
        ``comm`` must call it.
        """

    @abstractmethod
    def forward(self, h: torch.Tensor, spmm: SpMM, context: ExchangeContext,
                weight_scale: float = 1.0) -> torch.Tensor:
        """This rank's rows of ``H'`` (``n_g x fan_out``) from its rows ``h`` (``n_g x fan_in``).

        ``weight_scale``: the inverted-dropout scale, folded into the weights
        (``dropout(h) W = (h m)(s W)``) so the caller passes ``h`` masked but
        unscaled. Two input forms the context announces: ``context.halo_rows`` extra
        halo rows after the own rows (``spmm`` is then local), and ``context.dropout``
        (``h`` is pre-dropout; ``spmm`` masks what it multiplies). A term that uses
        the layer's own rows directly takes them from ``context.self_rows(h)``.
        Collective: ``spmm`` is, so every rank calls it in the same order.
        """

    def extra_repr(self) -> str:
        return f"{self.fan_in}, {self.fan_out}"


LAYER_TYPES: dict[str, type[GraphLayer]] = {}
"""Layer classes by ``kind``; fill with :func:`register_layer`."""


def register_layer(cls: type[GraphLayer]) -> type[GraphLayer]:
    """Make ``cls`` buildable as ``GraphModel(cls.kind, ...)``; usable as a class decorator."""
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"layer class {cls.__name__} needs a non-empty string 'kind', found {kind!r}")
    known = LAYER_TYPES.get(kind)
    if known is not None and known is not cls:
        raise ValueError(f"layer kind {kind!r} is already registered to {known.__name__}, "
                         f"cannot register {cls.__name__}")
    LAYER_TYPES[kind] = cls
    return cls


def layer_type(kind: str) -> type[GraphLayer]:
    """The layer class registered as ``kind``; ``ValueError`` naming the known kinds otherwise."""
    try:
        return LAYER_TYPES[kind]
    except KeyError:
        raise ValueError(f"unknown model {kind!r}; expected one of {tuple(LAYER_TYPES)}") from None


@register_layer
class GCNLayer(GraphLayer):
    """GCN (Kipf & Welling): ``H' = Â H W + b``; parameters ``[weight, bias]``."""

    kind = "gcn"
    input_only_through_product = True
    grid_form = GCN_GRID

    def __init__(self, fan_in: int, fan_out: int, *, generator: torch.Generator,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__(fan_in, fan_out)
        self.weight = nn.Parameter(glorot(generator, fan_in, fan_out).to(dtype))
        self.bias = nn.Parameter(torch.zeros(fan_out, dtype=dtype))

    @classmethod
    def normalize_adjacency(cls, comm: Communicator, layout: RowLayout, rows: sp.csr_matrix,
                            group: int) -> sp.csr_matrix:
        """``Â = D^-1/2 (A + I) D^-1/2`` rows. Collective over ``comm`` (fetches neighbours' degrees)."""
        return gcn_normalize(comm, layout, rows, group)

    def forward(self, h: torch.Tensor, spmm: SpMM, context: ExchangeContext,
                weight_scale: float = 1.0) -> torch.Tensor:
        return propagate(spmm, h, _scaled(self.weight, weight_scale), self.bias, context)


@register_layer
class SAGELayer(GraphLayer):
    """GraphSAGE-mean: ``H' = H W_self + (Ā H) W_neigh + b``; parameters ``[weight, neighbour_weight, bias]``."""

    kind = "sage"
    weight_matrices = 2
    grid_form = SAGE_GRID

    def __init__(self, fan_in: int, fan_out: int, *, generator: torch.Generator,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__(fan_in, fan_out)
        self.weight = nn.Parameter(glorot(generator, fan_in, fan_out).to(dtype))
        self.neighbour_weight = nn.Parameter(glorot(generator, fan_in, fan_out).to(dtype))
        self.bias = nn.Parameter(torch.zeros(fan_out, dtype=dtype))

    @classmethod
    def normalize_adjacency(cls, comm: Communicator, layout: RowLayout, rows: sp.csr_matrix,
                            group: int) -> sp.csr_matrix:
        """``D^-1 A`` rows. Purely local: ``comm``, ``layout`` and ``group`` are unused (not collective)."""
        return mean_normalize(rows)

    def forward(self, h: torch.Tensor, spmm: SpMM, context: ExchangeContext,
                weight_scale: float = 1.0) -> torch.Tensor:
        weight = _scaled(self.weight, weight_scale)
        neighbour = _scaled(self.neighbour_weight, weight_scale)
        return torch.addmm(self.bias, context.self_rows(h), weight).add_(propagate(spmm, h, neighbour, None, context))
