"""Training defaults per layer kind, each from its paper (``train --layer-kind`` picks the row).

``train`` leaves these flags at None and fills them after parsing (:func:`fill_model_defaults`), so an
explicit flag always wins and the results file's ``config`` record shows the values used.

* gcn: Kipf & Welling (ICLR 2017), Cora: hidden 16, dropout 0.5, lr 0.01, L2 5e-4 on the first layer.
* gat: Velickovic et al. (ICLR 2018), Cora: 8 heads x 8 hidden units, 1 output head, dropout 0.6 on
  every layer's input and on the attention weights, lr 0.005, L2 5e-4 on all weights.
* sage: GCN's Cora setup (hidden 16, dropout 0.5, lr 0.01, L2 5e-4 on the first layer). Neither
  Hamilton et al. (sampled mini-batches) nor BNS-GCN (Wan et al., MLSys 2022: full-graph on Reddit and
  OGB) has a setup for a small full graph, and BNS-GCN's Reddit setup (hidden 256, dropout 0.5, lr 0.01,
  no weight decay; pass ``--hidden 256 --weight-decay 0`` for it on large graphs) reached 0.7832 mean test
  accuracy on Cora (4 block parts, P = 2, seeds 0-4) against 0.8086 for this one.

``--layers`` stays 2 for every layer kind, as the GCN and GAT papers use on Cora.
"""

from __future__ import annotations

import argparse
from typing import Any

MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "gcn": {"hidden": 16, "dropout": 0.5, "lr": 0.01, "weight_decay": 5e-4, "weight_decay_scope": "first",
            "heads": 1, "output_heads": 1, "attention_dropout": 0.0},
    "sage": {"hidden": 16, "dropout": 0.5, "lr": 0.01, "weight_decay": 5e-4, "weight_decay_scope": "first",
             "heads": 1, "output_heads": 1, "attention_dropout": 0.0},
    "gat": {"hidden": 8, "dropout": 0.6, "lr": 0.005, "weight_decay": 5e-4, "weight_decay_scope": "all",
            "heads": 8, "output_heads": 1, "attention_dropout": 0.6},
}
"""model kind -> flag destination -> default value."""

FALLBACK = MODEL_DEFAULTS["gcn"]
"""A layer kind registered later (not in the table) trains with GCN's defaults and no attention."""


def defaults_for(model: str) -> dict[str, Any]:
    """The defaults of ``model``'s row."""
    return MODEL_DEFAULTS.get(model, FALLBACK)


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def help_for(key: str) -> str:
    """``per layer kind: gcn 16, sage 16, gat 8`` for a flag's help text (an attention flag: ``gat 8, others 1``)."""
    if key in ("heads", "output_heads", "attention_dropout"):
        return f"gat {_shown(MODEL_DEFAULTS['gat'][key])}; {_shown(FALLBACK[key])} for the others"
    return "per layer kind: " + ", ".join(f"{model} {_shown(row[key])}" for model, row in MODEL_DEFAULTS.items())


def fill_model_defaults(args: argparse.Namespace) -> list[str]:
    """Set every flag left at None to ``args.model``'s default; returns the names of the flags set explicitly."""
    explicit = []
    for key, value in defaults_for(args.model).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
        else:
            explicit.append(key)
    return explicit
