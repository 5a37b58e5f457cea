"""Full-graph distributed training: the public face of :mod:`algorithms.training`.

``Trainer`` (the epoch loop, :mod:`algorithms.training.trainer`, over the run that
:mod:`algorithms.training.assembly` builds), ``TrainConfig`` (:mod:`algorithms.training.config`),
``LocalGraph`` (:mod:`algorithms.training.graph`) and the byte counters of :mod:`algorithms.training.metrics`.

Collective: construction, :meth:`Trainer.train_epoch` and :meth:`Trainer.evaluate` are entered by every rank
in the same order.
"""

from __future__ import annotations

from algorithms.training.config import PROGRESS_MODES, TrainConfig
from algorithms.training.graph import LocalGraph, row_normalize_features, scaled_features
from algorithms.training.metrics import SPLITS, bytes_by_phase
from algorithms.training.trainer import Trainer

__all__ = ["PROGRESS_MODES", "SPLITS", "LocalGraph", "TrainConfig", "Trainer", "bytes_by_phase",
           "row_normalize_features", "scaled_features"]
