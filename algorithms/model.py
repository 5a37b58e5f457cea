"""A stack of graph layers over the distributed SpMM (DESIGN section 5).

The layers (:mod:`algorithms.layers`) are compute only; this module adds
what lies between them: the activation each layer declares after it (ReLU
for GCN and SAGE, ELU for GAT; none after the last) and inverted dropout on
every layer's input with masks drawn per global row
(:mod:`algorithms.dropout`). Two fusions keep dropout to about one pass
over the activations: a ReLU of layer ``l`` and the mask of layer
``l + 1``'s input are one autograd node (an ELU and the mask are two), and
the inverted-dropout scale multiplies the (small) weights instead of the
activations (``dropout(H) W = (H m)(s W)``; each layer folds it into all
its weights).

Without dropout two more passes go. A ReLU is written over the layer's
output and its backward over the incoming gradient (:class:`_ReluInPlace`):
a layer's output rows belong to the model alone (every layer returns a
fresh tensor; GCN already adds its bias in place on the SpMM's output), and
autograd's version counter refuses the step if any node had kept them; on
the CPU this saves a fresh 100 MB tensor each way on the 200k synthetic,
which the kernel zeroes page by page. And a static layer-0 input (a
:class:`~sparse_dist.halo.StaticHalo`) with no mask on it is the same every
epoch, so training multiplies the halo's kept ``Â_ext X`` as evaluation
does (GCN: one GEMM, no SpMM; SAGE: its neighbour term; ``(Â X) W = Â (X W)`` to
rounding).

Initial weights come from one ``torch.Generator`` seeded with ``seed``,
passed through the layers in order (each layer draws its own parameters,
see :mod:`algorithms.layers`). Every rank draws the same weights, so they
are replicated without a broadcast.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

import algorithms.gat  # noqa: F401  (registers the "gat" layer kind)
from algorithms.dropout import GlobalRowDropout
from algorithms.layers import LAYER_TYPES, ExchangeContext, LayerOptions, SpMM, glorot, layer_type
from sparse_dist.accounting import ComputeTimer
from sparse_dist.halo import StaticHalo

if TYPE_CHECKING:  # annotations only
    from sparse_dist.receptive_field import ReceptiveField

MODEL_KINDS: tuple[str, ...] = tuple(LAYER_TYPES)
"""The built-in layer kinds (for ``choices=``); layers registered later are in ``LAYER_TYPES``."""

__all__ = ["GraphModel", "LayerFigures", "MODEL_KINDS", "glorot", "layer_figures"]


@dataclass(frozen=True)
class LayerFigures:
    """One layer of a model as the estimators see it, from the flags alone (no weights drawn).

    ``owner`` / ``receiver``: (columns, backward even in layer 0) of its training exchange owner-side and
    under receiver-side dropout (:meth:`GraphLayer.exchange_columns`).
    """

    fan_in: int
    width: int
    parameters: int
    dense_work: int
    edge_values: int
    owner: tuple[int, bool]
    receiver: tuple[int, bool]


def layer_figures(kind: str, dims: Sequence[int], options: LayerOptions = LayerOptions()) -> list[LayerFigures]:
    """What each layer of ``GraphModel(kind, dims, options=options)`` holds and moves, asked of the layer class
    (widths chained as the model chains them: a layer takes what the previous one gives)."""
    layer_class = layer_type(kind)
    figures, fan_in = [], int(dims[0])
    for index, fan_out in enumerate(dims[1:]):
        where = {"last": index == len(dims) - 2, "options": options}
        figures.append(LayerFigures(
            fan_in, layer_class.output_width(fan_in, fan_out, **where),
            layer_class.parameter_count(fan_in, fan_out, **where), layer_class.dense_work(fan_in, fan_out, **where),
            layer_class.edge_values(fan_in, fan_out, **where),
            layer_class.exchange_columns(fan_in, fan_out, receiver=False, **where),
            layer_class.exchange_columns(fan_in, fan_out, receiver=True, **where)))
        fan_in = figures[-1].width
    return figures


def _as_is(h: torch.Tensor, context: ExchangeContext) -> torch.Tensor:
    """The operator of a layer handed an input that is already the product (:meth:`StaticHalo.aggregate`)."""
    return h


class GraphModel(nn.Module):
    """An L-layer model of one registered layer kind whose propagation is a distributed SpMM.

    ``dims = [F_0, ..., F_L]``: layer ``l`` maps ``F_l`` to ``F_{l+1}`` columns, except that a layer
    kind may widen its output from ``options`` (GAT: hidden layers concatenate ``heads`` heads of
    ``F_{l+1}`` columns); the next layer takes what the previous one gives (``widths``).
    ``forward`` is collective: every rank calls it in the same epoch.
    """

    def __init__(self, kind: str, dims: list[int], *, dropout: float = 0.5, seed: int = 0,
                 dtype: torch.dtype = torch.float32, options: LayerOptions = LayerOptions()) -> None:
        super().__init__()
        layer_class = layer_type(kind)
        if len(dims) < 2 or min(dims) < 1:
            raise ValueError(f"model dims need at least input and output width >= 1, got {dims}")
        self.kind, self.dims, self.dropout, self.seed, self.options = kind, list(dims), dropout, seed, options
        generator = torch.Generator().manual_seed(seed)
        layers, fan_in = [], dims[0]
        for index, fan_out in enumerate(dims[1:]):
            layers.append(layer_class.build(fan_in, fan_out, generator=generator, dtype=dtype,
                                            last=index == len(dims) - 2, seed=seed, options=options))
            fan_in = layers[-1].fan_out
        self.layers = nn.ModuleList(layers)
        self.widths = [dims[0]] + [layer.fan_out for layer in self.layers]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def needs_source_ids(self) -> bool:
        """Whether training needs the global ids of exchanged rows (attention dropout; see the layers)."""
        return any(layer.needs_source_ids for layer in self.layers)

    def layer_parameters(self, layer: int) -> list[nn.Parameter]:
        """Layer ``layer``'s parameters in registration order (GCN ``[W, b]``; SAGE ``[W_self, W_neigh, b]``)."""
        return list(self.layers[layer].parameters())

    # Views kept for code written against the former parallel lists
    # (tests/mpi/cases/train_parity.py, runners/bench/pyg_peer.py).
    @property
    def weights(self) -> list[nn.Parameter]:
        """Each layer's ``weight`` (GCN ``W``, SAGE ``W_self``)."""
        return [layer.weight for layer in self.layers]

    @property
    def neighbour_weights(self) -> list[nn.Parameter]:
        """Each layer's ``neighbour_weight`` (SAGE ``W_neigh``); empty for layers without one."""
        return [layer.neighbour_weight for layer in self.layers if hasattr(layer, "neighbour_weight")]

    @property
    def biases(self) -> list[nn.Parameter]:
        """Each layer's ``bias``."""
        return [layer.bias for layer in self.layers]

    def forward(self, x: torch.Tensor, spmm: SpMM, *, first_row: int, epoch: int, training: bool,
                timer: ComputeTimer | None = None, halo: StaticHalo | None = None,
                receiver_dropout: bool = False, bypass_policy: bool = False,
                trace: list[torch.Tensor] | None = None) -> torch.Tensor:
        """This rank's output rows (``n_g x F_L``) from its input rows ``x``.

        ``x``: this rank's ``n_g x F_0`` input rows, or, with ``halo``, ``halo.values`` (its rows then its
        halo rows): layer 0 then multiplies locally (:meth:`StaticHalo.multiply`, the receiver drawing
        the halo rows' masks) and exchanges nothing; a layer that ``takes_operator`` (attention) is handed
        ``halo`` itself, or ``spmm`` itself where it exchanges. ``receiver_dropout``: every exchanging layer sends
        its input pre-dropout and the SpMM masks what it multiplies (so cached or stale rows stay
        meaningful under dropout); the product is the same. ``first_row``: global id of this rank's
        first row (dropout masks are per global row). ``timer`` books the dropout work (masks and their
        passes). ``bypass_policy``: exchange exactly although training (same masks; the audit's forward).
        ``trace``: each layer's output rows (before its activation) are appended to it, detached.
        Evaluating (``training`` False), or training without dropout, with a static halo whose own values are
        the input (a policy may hand a sampled or scaled input instead, then multiplied as it is), layer 0 is
        :meth:`_layer0_without_masks` (GCN's multiplies the halo's kept ``Â_ext X``: one GEMM). Without
        dropout and ``trace``, ReLUs are written over the layer outputs (module docstring).
        Under owner-side dropout each exchanging SpMM layer's context also says how to make its input
        without the mask (``ExchangeContext.unmasked``: what ``sancus-h`` compares; made only if asked);
        layer 1 after a static halo, on either side, without any mask (layer 0 recomputed locally, unmasked).
        Collective: every exchanging layer calls the SpMM.
        """
        dropout = (GlobalRowDropout(self.dropout, self.seed, epoch, first_row, timer)
                   if training and self.dropout > 0 else None)
        scale = dropout.scale if dropout is not None else 1.0
        receiver = dropout is not None and receiver_dropout
        h = x
        for index, layer in enumerate(self.layers):
            local = index == 0 and halo is not None
            unmasked = None
            if dropout is not None and not local and not layer.takes_operator:
                if index == 1 and isinstance(halo, StaticHalo) and not self.layers[0].takes_operator:
                    unmasked = self._mask_free_after_halo(x, halo, epoch)
                elif not receiver:
                    unmasked = self._unmasked(h, self.layers[index - 1].activation if index > 0 else None)
            if index > 0:
                h = self._activate(h, self.layers[index - 1].activation, index,
                                   dropout if not receiver else None, in_place=dropout is None and trace is None)
            elif dropout is not None and (local or not receiver):
                h = dropout.drop(h, 0, halo.halo_ids if local else None)
            context = ExchangeContext(epoch=epoch, layer=index, training=training,
                                      halo_rows=halo.count if local else 0,
                                      dropout=dropout.masks(index) if receiver and not local else None,
                                      bypass_policy=bypass_policy, unmasked=unmasked)
            if local and dropout is None and isinstance(halo, StaticHalo) and h is halo.values:
                h = self._layer0_without_masks(h, halo, context)
            else:
                operator = (halo if layer.takes_operator else halo.multiply) if local else spmm
                h = layer(h, operator, context, scale)
            if trace is not None:
                trace.append(h.detach())
        return h

    def forward_on_field(self, field: ReceptiveField, *, first_row: int, epoch: int, training: bool = False,
                         first_product: torch.Tensor | None = None,
                         trace: list[torch.Tensor] | None = None) -> torch.Tensor:
        """This rank's exact output rows (``n_g x F_L``) from its receptive field held locally
        (:class:`~sparse_dist.receptive_field.ReceptiveField`): layer ``l`` takes the field's ``S_l`` rows (own
        rows first, its self term reads them) and gives ``S_{l+1}``'s. ``training``: with ``epoch``'s dropout
        masks (an exact reference of a training step: every row of a layer's input masked by its global id, as its
        owner masks it; the same product on either dropout side), else none. ``first_product``: layer 0's ``Â X``
        over the field, kept by a caller whose first layer sees its input only through the product (one GEMM
        where no mask applies). ``trace``: each layer's own output rows, as :meth:`forward`'s. Local: nothing
        is exchanged. Without autograd (a caller's ``no_grad``): activations and masks write over each layer's
        output, which the model alone holds, so a forward over the field allocates about two layers' rows."""
        if torch.is_grad_enabled():
            raise ValueError("a forward over the receptive field writes over its layer outputs: call it under "
                             "torch.no_grad()")
        dropout = (GlobalRowDropout(self.dropout, self.seed, epoch, first_row) if training and self.dropout > 0
                   else None)
        scale = dropout.scale if dropout is not None else 1.0
        own = field.sizes[-1]
        h = field.inputs
        for index, layer in enumerate(self.layers):
            if layer.takes_operator:
                raise ValueError(f"the {layer.kind} layer multiplies through its operator's exchanged rows; a "
                                 "forward over the receptive field multiplies by the field's Â alone")
            if index > 0:  # h is this forward's own layer output (a trace keeps a copy): written over
                h = self._activate(h, self.layers[index - 1].activation, index, None, in_place=True)
            if dropout is not None:  # no autograd here: a layer's own output is masked in place (less memory)
                rows = field.ids[own:field.sizes[index]]
                h = dropout.drop(h, index, rows) if index == 0 else h.mul_(dropout.mask(index, h, rows))
            context = ExchangeContext(epoch=epoch, layer=index, training=False,
                                      halo_rows=field.sizes[index] - field.sizes[index + 1])
            if index == 0 and first_product is not None and dropout is None:
                h = layer(first_product, _as_is, context, 1.0)
            else:
                h = layer(h, lambda rows, _context, at=index: field.multiply(at, rows), context, scale)
            if trace is not None:
                trace.append(h[:own].clone())
        return h

    def _mask_free_after_halo(self, x: torch.Tensor, halo: StaticHalo, epoch: int) -> Callable[[], torch.Tensor]:
        """Makes, on demand, layer 1's input with no dropout mask anywhere (layer 0 recomputed locally from
        the halo, unmasked; no exchange): still whenever the weights are, on either dropout side."""
        context = ExchangeContext(epoch=epoch, layer=0, training=False, halo_rows=halo.count)
        activation = self.layers[0].activation
        return lambda: self._unmasked(self._layer0_without_masks(x, halo, context), activation)()

    def _layer0_without_masks(self, x: torch.Tensor, halo: StaticHalo, context: ExchangeContext) -> torch.Tensor:
        """Layer 0's output rows from the halo with no dropout mask (an evaluation; the mask-free input of
        layer 1). A layer that sees its input only through the product multiplies the halo's kept
        ``Â_ext X`` (:meth:`StaticHalo.aggregate`): one GEMM, no SpMM; another (SAGE's self term) gets that kept
        product from its operator (:meth:`StaticHalo.product`). Local."""
        first = self.layers[0]
        if first.input_only_through_product:
            return first(halo.aggregate(), _as_is, context, 1.0)
        return first(x, halo if first.takes_operator else halo.product, context, 1.0)

    @staticmethod
    def _unmasked(h: torch.Tensor, activation: str | None) -> Callable[[], torch.Tensor]:
        """Makes, on demand, the layer input without its dropout mask: ``activation(h)`` (``h`` itself for
        layer 0). What a value-comparing staleness rule looks at under owner-side dropout."""
        if activation is None:
            return lambda: h
        return lambda: F.elu(h) if activation == "elu" else torch.relu(h)

    @staticmethod
    def _activate(h: torch.Tensor, activation: str, layer: int, dropout: GlobalRowDropout | None,
                  in_place: bool = False) -> torch.Tensor:
        """``activation(h)``, masked for layer ``layer``'s input where ``dropout`` is given (owner side);
        ``in_place``: a ReLU may be written over ``h`` (nobody else reads it)."""
        if activation == "relu":
            if dropout is not None:
                return dropout.relu_drop(h, layer)
            return _ReluInPlace.apply(h) if in_place else torch.relu(h)
        if activation != "elu":
            raise ValueError(f"unknown activation {activation!r}; expected 'relu' or 'elu'")
        h = F.elu(h)
        return dropout.drop(h, layer) if dropout is not None else h


class _ReluInPlace(torch.autograd.Function):
    """``relu(z)`` written over ``z``, and its backward over the incoming gradient: no new tensor either way.

    The output is kept for the backward (``d relu / d z = [out > 0]``). Only for a ``z`` nobody else reads
    (:meth:`GraphModel._activate`); a gradient that is not a plain contiguous tensor (an expanded zero, say)
    gets a new one instead.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, z: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        z.clamp_min_(0)
        ctx.mark_dirty(z)
        ctx.save_for_backward(z)
        return z

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        (out,) = ctx.saved_tensors  # type: ignore[attr-defined]
        if grad.is_contiguous() and grad._base is None and grad.shape == out.shape:
            return torch.ops.aten.threshold_backward.grad_input(grad, out, 0, grad_input=grad)
        return torch.ops.aten.threshold_backward(grad, out, 0)
