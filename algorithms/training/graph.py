"""What one rank holds of the graph (:class:`LocalGraph`; the data layer builds it), its feature scaling and the
narrow wire its feature rows travel in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.layout import RowLayout
from sparse_dist.lossless_wire import WireRows, from_wire, to_wire


@dataclass
class LocalGraph:
    """What one rank holds: its row group's raw adjacency rows and node data."""

    layout: RowLayout              # G row groups over new (partitioned) node ids
    rows: sp.csr_matrix            # n_g x N raw adjacency, global column ids
    features: np.ndarray           # n_g x F
    labels: np.ndarray             # n_g (class ids) or n_g x C (multi-label 0/1)
    masks: dict[str, np.ndarray]   # split -> bool n_g
    num_classes: int
    multilabel: bool
    name: str = "graph"
    extra: dict[str, Any] = field(default_factory=dict)


def scaled_features(features: np.ndarray, feature_norm: str) -> np.ndarray:
    """Layer 0's input rows as a float64 copy, scaled as ``--feature-norm`` says (``row``: each row divided by
    its sum; ``none``: as loaded). One place for the trainer and the single-process peers it is compared with."""
    if feature_norm == "row":
        return row_normalize_features(features)
    if feature_norm == "none":
        return features.astype(np.float64)
    raise ValueError(f"feature_norm must be 'row' or 'none', got {feature_norm!r}")


def row_normalize_features(features: np.ndarray) -> np.ndarray:
    """A float64 copy of ``features`` with each row divided by its sum (rows summing to 0 become 0), as Kipf &
    Welling do. The division writes into the copy itself: no second array of the same size (0.25 -> 0.03 s
    for 100k x 128 rows; the same values bitwise)."""
    normalized = features.astype(np.float64)
    sums = normalized.sum(axis=1, keepdims=True)
    zero = sums[:, 0] == 0
    np.divide(normalized, sums, out=normalized, where=~zero[:, None])
    normalized[zero] = 0
    return normalized


def wire_rows(loaded: np.ndarray, wire: torch.dtype | None, feature_norm: str, dtype: torch.dtype,
              device: torch.device) -> WireRows | None:
    """This rank's loaded feature rows (``n_g x F``) in ``wire`` (agreed:
    :func:`sparse_dist.lossless_wire.agree_wire_dtype`), and the receiver's way back to layer 0's input rows:
    widened to the loaded dtype, scaled by :func:`scaled_features` row by row (the owner's values bitwise), cast
    to ``dtype`` and moved to ``device``. None where no narrower dtype holds the rows."""
    if wire is None:
        return None

    def decode(received: torch.Tensor) -> torch.Tensor:
        rows = scaled_features(from_wire(received, wire, loaded.dtype), feature_norm)
        return torch.from_numpy(rows).to(dtype).to(device)

    return WireRows(to_wire(loaded, wire).to(device), decode)
