"""What the multi-rank cases on in-memory graphs share: a rank's row group of a whole graph, and the tolerance."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from algorithms.train import LocalGraph
from sparse_dist.layout import RowLayout


def local_graph(data: dict[str, np.ndarray], layout: RowLayout, group: int, num_classes: int,
                name: str) -> LocalGraph:
    """Row group ``group`` of ``data`` (adjacency, features, labels, train mask; val = test = not train)."""
    lo, hi = layout.row_range(group)
    masks = {"train": data["train"][lo:hi], "val": ~data["train"][lo:hi], "test": ~data["train"][lo:hi]}
    return LocalGraph(layout, sp.csr_matrix(data["adjacency"][lo:hi]), data["features"][lo:hi],
                      data["labels"][lo:hi], masks, num_classes, False, name=name)


def close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-4, atol: float = 2e-5) -> bool:
    """float32 agreement with a reference (compared in float64)."""
    return bool(torch.allclose(got.detach().double(), want.detach().double(), rtol=rtol, atol=atol))


def check_loss(failures: list[str], label: str, epoch: int, got: float, want: float, rtol: float = 1e-4,
               atol: float = 2e-5) -> None:
    """Record a failure when epoch ``epoch``'s (0-based) training loss differs from the reference's."""
    if abs(got - want) > atol + rtol * abs(want):
        failures.append(f"{label}: epoch {epoch + 1} loss {got:.7f} != reference {want:.7f}")
