"""Sampled mini-batch training on the full-graph shards (DistDGL, ByteGNN): :class:`MinibatchTrainer`."""

from algorithms.minibatch.config import MinibatchConfig, parse_fanouts
from algorithms.minibatch.trainer import Batch, MinibatchTrainer, minibatch_problem

__all__ = ["Batch", "MinibatchConfig", "MinibatchTrainer", "minibatch_problem", "parse_fanouts"]
