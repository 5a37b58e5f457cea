"""What an evaluation from the receptive field costs (``--evaluation-plan field``,
:mod:`algorithms.training.field_evaluation`), before the field is gathered: its compute, its memory, from a
:class:`~runners.perf.workload.Workload`.

A rank's field ``S_l`` is the rows layer ``l``'s input must hold for its own rows' logits: ``S_L`` its own rows,
``S_{L-1}`` those and their in-neighbours (its halo, known from the workload: ``sum_j |B_gj|``), and each ring
further out. The outer rings are known only by gathering them, so they are estimated: each grows by the first
ring's factor ``|S_{L-1}| / |S_L|``, at most to the graph's ``N`` rows (the 200k synthetic in two METIS parts,
three layers, the first rank: ``S_3 .. S_0`` estimated 100,043 / 177,653 / 200,000 / 200,000 rows; its set-up
record's layer-0 product had the 200,000 rows of ``S_1``).

An evaluation exchanges nothing; it multiplies each layer over its field rows: layer ``l``'s SpMM over the
entries of ``S_{l+1}``'s rows at the rank's mean entries a row (none for a layer that sees its input only
through ``Â X``, made once at set-up), its dense work over ``S_l``'s rows, at the step's rates. The gathering
(once a run, about the bytes of one or two exchanged evaluations) is not priced per epoch.
"""

from __future__ import annotations

import numpy as np

from algorithms.layers import layer_type
from runners.perf.cost_model import EVALUATION_DENSE_SHARE, EvaluationCost, ModelShape, Rates, cores_per_rank
from runners.perf.workload import Workload
from sparse_dist.cost import Network

INDEX_BYTES = 4


def field_sizes(work: Workload, layers: int, nodes: int) -> np.ndarray:
    """``sizes[g, l] = |S_l|`` estimated for each row group ``g`` and ``l = 0..layers`` (``groups x (layers + 1)``;
    module docstring)."""
    own = work.rows.astype(np.float64)
    halo = work.boundary.sum(axis=1) - np.diag(work.boundary)
    sizes = np.empty((work.groups, layers + 1))
    sizes[:, layers] = own
    if layers >= 1:
        sizes[:, layers - 1] = np.minimum(nodes, own + halo)
    growth = np.divide(sizes[:, layers - 1], own, out=np.ones_like(own), where=own > 0) if layers >= 1 else own
    for level in range(layers - 2, -1, -1):
        sizes[:, level] = np.minimum(nodes, sizes[:, level + 1] * growth)
    return sizes


def entries_per_row(work: Workload) -> np.ndarray:
    """Each row group's mean stored entries a row (local and remote columns), what a field row is assumed to hold."""
    return (work.nnz_local + work.nnz_remote) / np.maximum(work.rows, 1)


def predict_field_evaluation(work: Workload, shape: ModelShape, rates: Rates, net: Network, nodes: int,
                             threads: int = 1) -> EvaluationCost:
    """One evaluation from the field on ``work.groups`` ranks (one a row group): the slowest rank's compute, no
    exchange (module docstring)."""
    sizes, per_row = field_sizes(work, len(shape.dims) - 1, nodes), entries_per_row(work)
    kept_product = layer_type(shape.kind).input_only_through_product
    cores = cores_per_rank(net, work.groups, threads)
    seconds = np.zeros(work.groups)
    for layer, figures in enumerate(shape.layers):
        width = 0 if layer == 0 and kept_product else shape.dims[layer]
        spmm = sizes[:, layer + 1] * per_row * width / (rates.spmm * cores)
        dense = sizes[:, layer] * figures.dense_work * EVALUATION_DENSE_SHARE / (rates.dense * cores)
        seconds += spmm + dense
    return EvaluationCost(float(seconds.max()), 0.0)


def field_memory(work: Workload, shape: ModelShape, nodes: int, references: bool = False) -> np.ndarray:
    """Bytes each row group's rank holds for its field, from above (module docstring's sizes): every layer's
    operator (the rows of ``S_{l+1}`` at the mean entries a row, an int32 index and a value each), layer 0's
    product ``Â X`` over ``S_1`` (where the layer sees ``X`` only through it), ``X``'s rows of ``S_0`` (where it
    does not, or ``references``: exact forwards of training's masks read from the field), and one layer's
    output over the widest field rows. On the 200k synthetic in two METIS parts (GCN 3 x 128, float32) this
    gives 320 MB a rank (422 MB with references), where the field kept 171 MB (its product and operators, the
    set-up record's ``evaluation_field``) beside a layer's output over its 200,000 rows (102 MB)."""
    sizes, per_row = field_sizes(work, len(shape.dims) - 1, nodes), entries_per_row(work)
    itemsize = shape.itemsize
    operators = sizes[:, 1:].sum(axis=1) * per_row * (INDEX_BYTES + itemsize)
    kept_product = layer_type(shape.kind).input_only_through_product
    first = sizes[:, 1] * shape.dims[0] * itemsize if kept_product else 0.0
    inputs = sizes[:, 0] * shape.dims[0] * itemsize if (references or not kept_product) else 0.0
    widest = sizes.max(axis=1) * max(shape.dims[1:]) * itemsize
    return operators + first + inputs + widest


__all__ = ["entries_per_row", "field_memory", "field_sizes", "predict_field_evaluation"]
