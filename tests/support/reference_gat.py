"""Single-process reference for GAT training in plain (dense) torch and numpy.

Written independently of the project (imports none of it, nor PyG) from the
documented conventions (README, GAT section): the attention structure is the
adjacency's pattern with every self-loop removed and one loop per node added,
all weights 1; per layer ``Z = H W``, ``e_ij = LeakyReLU(<Z_j, a_src> + <Z_i,
a_dst>, 0.2)`` per head over row ``i``'s entries ``j``, softmax per row,
attention dropout on the softmax weights, ``sum_j alpha_ij Z_j`` per head;
hidden layers concatenate their heads and apply ELU, the output layer averages
its heads; biases after the heads. Weights Glorot-uniform from one seeded
generator, layer by layer in the order ``W`` (fan_in x K F'), ``a_src``, ``a_dst``
(K x F'); zero biases. Input dropout masks: the global-row rule of
:func:`reference_gcn.dropout_keep`. Attention dropout: the counter-based rule
(a key chained by splitmix64 over (seed, domain, epoch, layer); per entry and
group of four heads ``splitmix64(splitmix64(row ^ key) ^ column ^ group *
golden)``, 16-bit lanes from the low bits up, each read as int16 ``s`` and kept
when ``s + 32768 < round((1 - p) 2^16)``, as the input-dropout rule). Everything is dense ``N x N x K``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from reference_adam import TextbookAdam
from reference_gcn import Reference, dropout_keep

DOMAIN = 0x67415441
GOLDEN = 0x9E3779B97F4A7C15


def splitmix(values: np.ndarray) -> np.ndarray:
    z = np.asarray(values, dtype=np.uint64) + np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def attention_keep(seed: int, epoch: int, layer: int, rows: np.ndarray, cols: np.ndarray, heads: int,
                   p: float) -> tuple[np.ndarray, float]:
    """``(E x heads)`` keep mask of entries ``(rows[e], cols[e])`` and the scale of kept weights."""
    with np.errstate(over="ignore"):
        key = np.array([seed], dtype=np.uint64)
        for word in (DOMAIN, epoch, layer):
            key = splitmix(splitmix(key) ^ np.uint64(word))
        entry = splitmix(rows.astype(np.uint64) ^ key) ^ cols.astype(np.uint64)
        threshold = min(65536, max(1, round((1.0 - p) * 65536)))
        keep = np.zeros((rows.size, heads), dtype=bool)
        for head in range(heads):
            group, lane = divmod(head, 4)
            word = splitmix(entry ^ np.uint64((group * GOLDEN) % 2**64))
            unsigned = ((word >> np.uint64(16 * lane)) & np.uint64(0xFFFF)).astype(np.int64)
            signed = np.where(unsigned >= 32768, unsigned - 65536, unsigned)   # the lane read as int16
            keep[:, head] = signed + 32768 < threshold
    return keep, 65536.0 / threshold


class GATReference(Reference):
    """Its own parameters and forward; the training step (cross-entropy over the training rows, Adam) and
    ``flat_parameters`` are :class:`reference_gcn.Reference`'s."""

    def __init__(self, adjacency: np.ndarray, features: np.ndarray, labels: np.ndarray, train: np.ndarray,
                 num_classes: int, hidden: int = 4, heads: int = 2, output_heads: int = 1, layers: int = 2,
                 dropout: float = 0.5, attention_dropout: float = 0.5, lr: float = 0.01,
                 weight_decay: float = 5e-4, seed: int = 0) -> None:
        self.dropout, self.attention_dropout, self.seed = dropout, attention_dropout, seed
        n = adjacency.shape[0]
        pattern = adjacency != 0
        np.fill_diagonal(pattern, True)
        self.pattern = torch.from_numpy(pattern)
        self.rows, self.cols = np.nonzero(pattern)
        sums = features.sum(axis=1, keepdims=True)
        self.x = torch.from_numpy(np.divide(features, sums, out=np.zeros_like(features, dtype=np.float64),
                                            where=sums != 0)).float()
        self.y = torch.from_numpy(labels)
        self.train = torch.from_numpy(train)
        generator = torch.Generator().manual_seed(seed)

        def glorot(fan_in: int, fan_out: int) -> torch.Tensor:
            bound = math.sqrt(6.0 / (fan_in + fan_out))
            draw = torch.rand(fan_in, fan_out, generator=generator, dtype=torch.float64)
            return ((draw * 2 - 1) * bound).float().requires_grad_()

        self.shapes: list[tuple[int, int, bool]] = []   # (heads, head width, concat)
        self.params: list[list[torch.Tensor]] = []
        fan_in = features.shape[1]
        for layer in range(layers):
            last = layer == layers - 1
            k, width = (output_heads, num_classes) if last else (heads, hidden)
            out = width if last else k * width
            self.params.append([glorot(fan_in, k * width), glorot(k, width), glorot(k, width),
                                torch.zeros(out, requires_grad=True)])
            self.shapes.append((k, width, not last))
            fan_in = out
        self.n = n
        self.optimizer = TextbookAdam([
            {"params": self.params[0], "weight_decay": weight_decay},
            {"params": [p for layer in self.params[1:] for p in layer], "weight_decay": 0.0}], lr=lr)
        self.epoch = 0

    def _layer(self, h: torch.Tensor, index: int, training: bool) -> torch.Tensor:
        weight, att_src, att_dst, bias = self.params[index]
        k, width, concat = self.shapes[index]
        z = (h @ weight).view(self.n, k, width)
        source = (z * att_src).sum(-1)        # n x k
        target = (z * att_dst).sum(-1)
        logits = F.leaky_relu(target[:, None, :] + source[None, :, :], 0.2)   # [i, j, k]
        logits = logits.masked_fill(~self.pattern[:, :, None], float("-inf"))
        alpha = torch.softmax(logits, dim=1)
        if training and self.attention_dropout > 0:
            keep, scale = attention_keep(self.seed, self.epoch, index, self.rows, self.cols, k,
                                         self.attention_dropout)
            dense = torch.zeros(self.n, self.n, k)
            dense[torch.from_numpy(self.rows), torch.from_numpy(self.cols)] = torch.from_numpy(keep).float() * scale
            alpha = alpha * dense
        out = torch.einsum("ijk,jkf->ikf", alpha, z)
        out = out.reshape(self.n, k * width) if concat else out.mean(1)
        return out + bias

    def forward(self, training: bool) -> torch.Tensor:
        h = self.x
        for index in range(len(self.params)):
            if training and self.dropout > 0:
                keep, scale = dropout_keep(self.seed, self.epoch, index, h.shape[0], h.shape[1], self.dropout)
                h = h * keep.float() * scale
            h = self._layer(h, index, training)
            if index < len(self.params) - 1:
                h = F.elu(h)
        return h
