"""Communication-avoiding policies, one module each, and the one parser of their text.

* :mod:`~algorithms.policies.registry`: the table of names (imports no policy);
* :mod:`~algorithms.policies.spec`: the parser (``--sample``/``--stale`` and the joined ``a+b`` form) and the
  run's one check, :meth:`PolicySpec.refusal`;
* :mod:`~algorithms.policies.base`: what every policy answers and the per-epoch protocol
  (:class:`~algorithms.policies.base.EpochWork`) through which a policy works in the training loop;
* the policies: :mod:`~algorithms.policies.bns` (BNS-GCN sampling), :mod:`~algorithms.policies.psc`
  (PSC-GCN importance sampling and feature cache), :mod:`~algorithms.policies.dgs` (DGS explanation-guided
  sampling; its explainer in :mod:`~algorithms.policies.dgs_explainer`), :mod:`~algorithms.policies.sancus`
  (SANCUS skip-broadcast), :mod:`~algorithms.policies.pipe` (PipeGCN pipelined staleness).

The built-in policies are registered here, explicitly, in the order their accepted forms are listed in
messages (samplers bns, psc, dgs; rules sancus-e, -a, -h, pipe). A third party adds one with
:func:`register_sampler` / :func:`register_staleness` (see docs/design/extending.md) without touching the SpMM.
Compression (``--compress``) is the third axis and lives in :mod:`sparse_dist.compress`: it has no
policy-level code here.
"""

from __future__ import annotations

from algorithms.policies import bns, dgs, pipe, psc, sancus
from algorithms.policies.base import EpochWork, PolicyBase, RunShape
from algorithms.policies.bns import BnsSampler
from algorithms.policies.dgs import DgsSampler
from algorithms.policies.pipe import PipeRule
from algorithms.policies.psc import PscSampler
from algorithms.policies.registry import PolicyKind, register, register_sampler, register_staleness
from algorithms.policies.sancus import SancusRule
from algorithms.policies.spec import (AxisSpec, PolicySpec, parse_sampler, parse_staleness, policy_list_arg,
                                      sampling_arg, staleness_arg)

BUILT_IN: tuple[PolicyKind, ...] = (*bns.KINDS, *psc.KINDS, *dgs.KINDS, *sancus.KINDS, *pipe.KINDS)
for _kind in BUILT_IN:
    register(_kind)

__all__ = ["AxisSpec", "BnsSampler", "DgsSampler", "EpochWork", "PipeRule", "PolicyBase", "PolicyKind",
           "PolicySpec", "PscSampler", "RunShape", "SancusRule", "parse_sampler", "parse_staleness",
           "policy_list_arg", "register_sampler", "register_staleness", "sampling_arg", "staleness_arg"]
