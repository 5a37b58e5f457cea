"""``sparse-dist plot RESULTS [RESULTS ...]``: the figures of one or more studies, as PNG files.

RESULTS is a study's output directory (``results.csv`` and ``runs.jsonl``
from ``sparse-dist sweep``). Figures, written to ``--out`` (default
``RESULTS/figures`` of the first directory):

* ``scaling-strong.png`` / ``scaling-weak.png``: epoch time (slowest
  rank, warm-up excluded) and parallel efficiency against P, one line per
  plan and policy (strong: ``T1 / (P TP)``; weak: ``T1 / TP``);
* ``breakdown.png``: stacked epoch time (local SpMM / dense / exchange / exchange wait /
  allreduce / allreduce wait, means over ranks; the waits for late partners hatched) per configuration and P;
* ``bytes.png``: exchange bytes per epoch (all ranks) per plan and policy;
* ``accuracy.png``: test accuracy against epoch per plan and policy, at the
  largest P;
* ``sancus-broadcasts.png``: for each staleness run at the largest P, which
  owner broadcast (dark) or was reused from the cache (light) in each epoch
  and layer (SANCUS Fig. 24);
* ``audit.png`` (runs trained with ``--audit-every``): per layer, the
  relative error of the layer's output under the run's policy against an
  exact forward with the same weights and masks, over epochs, one panel per
  layer and one line per configuration, at the largest P;
* ``accuracy-time.png`` (runs whose results carry ``wall``): validation
  accuracy (micro-F1 for multi-label) against wall seconds since launch,
  one line per plan and policy at the largest P (lowest seed), one panel
  per bandwidth in a ``[network]`` study; the dotted line is the target of
  ``results.csv``'s ``time_to_target``;
* ``tta-bandwidth.png`` (``[network]`` studies, ``bandwidth`` column):
  time to that target against the emulated bandwidth, one line per plan and
  policy, one panel per dataset and P (a run that never reached the target
  has no point; ``unlimited`` is drawn right of the fastest cap);
* ``epoch-time-bandwidth.png``, ``exchange-bandwidth.png`` and ``exchange-wait-bandwidth.png`` (``[network]``
  studies): the epoch time (slowest rank), a rank's own time in the SpMM exchanges (``t_exchange``: posting,
  copies, the transfer; for ``pipe`` only what the compute did not hide) and its time in them waiting for
  partners that had not posted yet (``t_exchange_wait``: imbalance), means over ranks, against the emulated
  bandwidth, drawn as ``tta-bandwidth.png`` (a table older than ``t_exchange_wait`` draws no wait figure).

Lines are per plan, policy and compression (``p2p fp16``: exact p2p with ``--compress fp16``).
"""

from __future__ import annotations

import argparse

from runners.argtypes import at_least


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", help="study output directories (each holds results.csv)")
    parser.add_argument("--out", default=None, help="directory for the PNG files (default: FIRST/figures)")
    parser.add_argument("--dpi", type=at_least(10), default=150, help="resolution, >= 10 (default: %(default)s)")


def main(comm: object, args: argparse.Namespace) -> int:
    from runners.figures import draw  # matplotlib: imported by this command alone

    return draw(args)
