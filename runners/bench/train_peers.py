"""The whole-graph peers of ``sparse-dist bench train``, by ``--peer``: why each cannot run, and how it is made.

A table, so that the benchmark never switches on a peer's name; each
library is imported only inside its functions (both are optional).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from algorithms.train import LocalGraph, TrainConfig
from runners.bench.pyg_peer import mirror_problem


def _pyg_problem(kind: str) -> str | None:
    """Why the PyG peer cannot run ``--layer-kind kind`` here, or None."""
    try:
        import torch_geometric  # noqa: F401
    except ImportError as exc:
        return f"torch_geometric is not importable ({exc})"
    return mirror_problem(kind)


def _dgl_problem(kind: str) -> str | None:
    """Why the DGL peer cannot run ``--layer-kind kind`` here, or None."""
    from runners.bench.minibatch_dgl import import_dgl
    from runners.bench.train_dgl import dgl_mirror_problem

    try:
        import_dgl()
    except ImportError as exc:
        return f"dgl is not importable ({exc})"
    return dgl_mirror_problem(kind)


def _make_pyg(graph: LocalGraph, config: TrainConfig, device: torch.device) -> Any:
    from runners.bench.pyg_peer import PygPeer

    return PygPeer(graph, config, device)


def _make_dgl(graph: LocalGraph, config: TrainConfig, device: torch.device) -> Any:
    from runners.bench.train_dgl import DglPeer

    return DglPeer(graph, config, device)


PEER_MAKERS: dict[str, tuple[Callable[[str], str | None], Callable[[LocalGraph, TrainConfig, torch.device], Any]]] = {
    "pyg": (_pyg_problem, _make_pyg), "dgl": (_dgl_problem, _make_dgl)}
"""Each peer: why it cannot run a layer kind here (or None), and how it is made (imports only inside)."""
PEERS = (*PEER_MAKERS, "none")


def peer_key(peer: str) -> str:
    """The key a ``--peer``'s figures go under: its name, ``pyg`` for ``none`` (then only ``pyg_skipped``)."""
    return "pyg" if peer == "none" else peer
