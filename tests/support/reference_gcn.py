"""Single-process reference for GCN / GraphSAGE-mean training in plain torch and numpy.

Written independently of the project (imports none of it) from the
documented conventions: remaining self-loops with weight 1 and row-degree
symmetric normalisation for GCN, row-mean for SAGE, row-normalised
features, Glorot-uniform weights from one seeded generator (layer by layer;
SAGE draws W_self then W_neigh), zero biases, inverted dropout on every
layer's input with the global-row masks of the documented rule (the
SplitMix64 word g // 4 of a per-layer key for lane g = row * width + column,
16-bit little-endian lanes, kept when lane ^ 0x8000 < round((1 - p) 2^16)), mean cross-entropy over
the training rows, Adam with weight decay on the first layer only.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from reference_adam import TextbookAdam


def normalized_adjacency(adjacency: np.ndarray, model: str) -> torch.Tensor:
    a = adjacency.astype(np.float64).copy()
    if model == "gcn":
        diagonal = np.diag(a).copy()
        diagonal[diagonal == 0] = 1.0
        np.fill_diagonal(a, diagonal)
        degree = a.sum(axis=1)
        scale = np.where(degree > 0, degree ** -0.5, 0.0)
        return torch.from_numpy(scale[:, None] * a * scale[None, :])
    degree = a.sum(axis=1)
    return torch.from_numpy(np.where(degree[:, None] > 0, a / np.maximum(degree[:, None], 1e-300), 0.0))


_U64 = (1 << 64) - 1
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on uint64 (NumPy wraps)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


def _sm(value: int) -> int:
    """splitmix64 of one word (Python ints): ``mix(value + GOLDEN)``."""
    z = (value + _GOLDEN) & _U64
    z = ((z ^ (z >> 30)) * _MIX1) & _U64
    z = ((z ^ (z >> 27)) * _MIX2) & _U64
    return z ^ (z >> 31)


def dropout_key(seed: int, epoch: int, layer: int) -> int:
    """The layer's key: ``k = seed``, then ``k = sm(sm(k) ^ w)`` for w in (epoch, layer, 0x44524F50)."""
    key = seed
    for word in (epoch, layer, 0x44524F50):
        key = _sm(_sm(key) ^ word)
    return key


def dropout_keep_rows(seed: int, epoch: int, layer: int, rows: np.ndarray, width: int, p: float) -> torch.Tensor:
    """Keep mask of the global ``rows`` (``len(rows) x width``), straight from the written rule, lane by lane."""
    threshold = max(1, round((1.0 - p) * 65536))
    lane = (np.asarray(rows, dtype=np.int64)[:, None] * width + np.arange(width)).reshape(-1).astype(np.uint64)
    with np.errstate(over="ignore"):
        words = _mix(np.uint64(dropout_key(seed, epoch, layer)) + ((lane >> np.uint64(2)) + np.uint64(1))
                     * np.uint64(_GOLDEN))
    values = (words >> ((lane & np.uint64(3)) * np.uint64(16))) & np.uint64(0xFFFF)
    return torch.from_numpy(((values ^ np.uint64(0x8000)) < threshold).reshape(-1, width))


def dropout_keep(seed: int, epoch: int, layer: int, rows: int, width: int, p: float) -> tuple[torch.Tensor, float]:
    """Keep mask of all ``rows`` and the scale of kept entries, straight from the written rule."""
    threshold = max(1, round((1.0 - p) * 65536))
    return dropout_keep_rows(seed, epoch, layer, np.arange(rows), width, p), 65536.0 / threshold


class Reference:
    def __init__(self, adjacency: np.ndarray, features: np.ndarray, labels: np.ndarray, train: np.ndarray,
                 num_classes: int, model: str, hidden: int = 16, layers: int = 2, dropout: float = 0.5,
                 lr: float = 0.01, weight_decay: float = 5e-4, seed: int = 0) -> None:
        self.model, self.dropout, self.seed = model, dropout, seed
        self.a = normalized_adjacency(adjacency, model).float()
        self.a_sparse = self.a.to_sparse()  # the same values; products cost O(nnz) instead of O(N^2)
        sums = features.sum(axis=1, keepdims=True)
        self.x = torch.from_numpy(np.divide(features, sums, out=np.zeros_like(features, dtype=np.float64),
                                            where=sums != 0)).float()
        self.y = torch.from_numpy(labels)
        self.train = torch.from_numpy(train)
        dims = [features.shape[1]] + [hidden] * (layers - 1) + [num_classes]
        generator = torch.Generator().manual_seed(seed)
        self.params: list[list[torch.Tensor]] = []
        for fan_in, fan_out in zip(dims[:-1], dims[1:]):
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            layer = [((torch.rand(fan_in, fan_out, generator=generator, dtype=torch.float64) * 2 - 1) * bound)
                     .float().requires_grad_()]
            if model == "sage":
                layer.append(((torch.rand(fan_in, fan_out, generator=generator, dtype=torch.float64) * 2 - 1)
                              * bound).float().requires_grad_())
            layer.append(torch.zeros(fan_out, requires_grad=True))
            self.params.append(layer)
        self.optimizer = TextbookAdam([
            {"params": self.params[0], "weight_decay": weight_decay},
            {"params": [p for layer in self.params[1:] for p in layer], "weight_decay": 0.0}], lr=lr)
        self.epoch = 0

    def forward(self, training: bool) -> torch.Tensor:
        h = self.x
        for index, layer in enumerate(self.params):
            if training and self.dropout > 0:
                keep, scale = dropout_keep(self.seed, self.epoch, index, h.shape[0], h.shape[1], self.dropout)
                h = h * keep.float() * scale
            if self.model == "gcn":
                h = self._propagate(h, layer[0]) + layer[1]
            else:
                h = h @ layer[0] + self._propagate(h, layer[1]) + layer[2]
            if index < len(self.params) - 1:
                h = torch.relu(h)
        return h

    def _propagate(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``A h W``, multiplied in the cheaper order: same value to rounding."""
        if weight.shape[1] < weight.shape[0]:
            return torch.sparse.mm(self.a_sparse, h @ weight)
        return torch.sparse.mm(self.a_sparse, h) @ weight

    def step(self) -> float:
        self.optimizer.zero_grad()
        logits = self.forward(training=True)
        loss = F.cross_entropy(logits[self.train], self.y[self.train])
        loss.backward()
        self.optimizer.step()
        self.epoch += 1
        return float(loss.detach())

    def flat_parameters(self) -> list[torch.Tensor]:
        return [p for layer in self.params for p in layer]
