"""Construction of a run's exchange plan and strategy: the one module above both.

The plans (:mod:`sparse_dist.plans`) and the strategies (:mod:`sparse_dist.exchange`,
:mod:`sparse_dist.cached`, :mod:`sparse_dist.pipelined`, :mod:`sparse_dist.importance`) never import
this module; it picks among them by name and by the
policies' capabilities, so neither a base class nor a plan module names its own subclasses.
"""

from __future__ import annotations

import torch

from sparse_dist.accounting import ComputeTimer
from sparse_dist.dcsr import DistCSR
from sparse_dist.cached import CachedStrategy
from sparse_dist.exchange import BoundarySampler, ExactStrategy, ExchangeStrategy, SampledStrategy, StalenessRule
from sparse_dist.importance import ImportanceStrategy
from sparse_dist.pipelined import PipelinedStrategy
from sparse_dist.plans import ExchangePlan, plan_class


def make_plan(name: str, matrix: DistCSR, dtype: torch.dtype, device: torch.device, timer: ComputeTimer,
              strategy: ExchangeStrategy | None = None, *, row_masks: bool = False) -> ExchangePlan:
    """The exchange plan called ``name`` carrying ``strategy`` (exact when None); ``row_masks``: see
    :class:`~sparse_dist.plans.ExchangePlan`."""
    return plan_class(name)(matrix, dtype, device, timer, strategy, row_masks=row_masks)


def make_strategy(sampler: BoundarySampler | None = None, staleness: StalenessRule | None = None) -> ExchangeStrategy:
    """The strategy of a run's policies; a row sampler with ``p = 1`` is the exact path; a per-edge sampler
    (``per_edge``, e.g. ``psc``) gets an :class:`~sparse_dist.importance.ImportanceStrategy`."""
    inner: ExchangeStrategy
    if sampler is not None and getattr(sampler, "per_edge", False):
        inner = ImportanceStrategy(sampler)
    else:
        inner = SampledStrategy(sampler) if sampler is not None and sampler.p < 1.0 else ExactStrategy()
    if staleness is None:
        return inner
    return PipelinedStrategy(staleness, inner) if staleness.pipelined else CachedStrategy(staleness, inner)
