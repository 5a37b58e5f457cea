"""Per-model training defaults, each from the model's paper (``train --model`` picks the row).

``train`` leaves these flags at None and fills them after parsing (:func:`fill_model_defaults`), so an
explicit flag always wins and the results file's ``config`` record shows the values used.

* gcn: Kipf & Welling (ICLR 2017), Cora: hidden 16, dropout 0.5, lr 0.01, L2 5e-4 on the first layer.
* gat: Velickovic et al. (ICLR 2018), Cora: 8 heads x 8 hidden units, 1 output head, dropout 0.6 on
  every layer's input and on the attention weights, lr 0.005, L2 5e-4 on all weights.
* sage: the full-graph GraphSAGE setup of BNS-GCN (Wan et al., MLSys 2022, Reddit; PipeGCN uses the
  same): hidden 256, dropout 0.5, lr 0.01, no weight decay. (Hamilton et al.'s own setup samples
  mini-batches and has no full-graph counterpart.) Their 4 layers are not taken: ``--layers`` stays 2
  for every model, as the GCN and GAT papers use on Cora.
"""

from __future__ import annotations

import argparse
from typing import Any

MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "gcn": {"hidden": 16, "dropout": 0.5, "lr": 0.01, "weight_decay": 5e-4, "weight_decay_scope": "first",
            "heads": 1, "output_heads": 1, "attention_dropout": 0.0},
    "sage": {"hidden": 256, "dropout": 0.5, "lr": 0.01, "weight_decay": 0.0, "weight_decay_scope": "all",
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
    """``per model: gcn 16, sage 256, gat 8`` for a flag's help text (an attention flag: ``gat 8, others 1``)."""
    if key in ("heads", "output_heads", "attention_dropout"):
        return f"gat {_shown(MODEL_DEFAULTS['gat'][key])}; {_shown(FALLBACK[key])} for the others"
    return "per model: " + ", ".join(f"{model} {_shown(row[key])}" for model, row in MODEL_DEFAULTS.items())


def fill_model_defaults(args: argparse.Namespace) -> list[str]:
    """Set every flag left at None to ``args.model``'s default; returns the names of the flags set explicitly."""
    explicit = []
    for key, value in defaults_for(args.model).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
        else:
            explicit.append(key)
    return explicit
