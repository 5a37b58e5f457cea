"""Sampled mini-batch training on the full-graph shards (DistDGL, ByteGNN): :class:`MinibatchTrainer` stepping on
the batches of a :class:`BatchLoader`."""

from algorithms.minibatch.config import MinibatchConfig, parse_fanouts
from algorithms.minibatch.loader import Batch, BatchLoader
from algorithms.minibatch.trainer import MinibatchTrainer, minibatch_problem

__all__ = ["Batch", "BatchLoader", "MinibatchConfig", "MinibatchTrainer", "minibatch_problem", "parse_fanouts"]
