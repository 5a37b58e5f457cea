"""What one rank holds of the graph (:class:`LocalGraph`; the data layer builds it) and its feature scaling."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparse_dist.layout import RowLayout


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


def row_normalize_features(features: np.ndarray) -> np.ndarray:
    """Divide each row by its sum (rows summing to 0 stay 0), as Kipf & Welling do."""
    sums = features.sum(axis=1, keepdims=True)
    return np.divide(features, sums, out=np.zeros_like(features, dtype=np.float64), where=sums != 0)
