"""The hyper-parameters of one training run (:class:`TrainConfig`) and how a command line fills them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any

from algorithms.layers import LayerOptions
from algorithms.policies.spec import AxisSpec
from algorithms.training.guard import GuardSettings
from sparse_dist.plans import plan_class

PROGRESS_MODES: tuple[str, ...] = ("auto", "test", "thread", "none")
"""How outstanding pipelined exchanges progress while the rank computes (see :class:`TrainConfig.progress`)."""
EVALUATION_PLANS: tuple[str, ...] = ("same", "cover", "field")
"""How exact evaluations get their rows (:class:`TrainConfig.evaluation_plan`): exchanged on the run's own plan or
on ``cover``, or ``field``: from the receptive field each rank gathers once (no exchange per evaluation)."""


def evaluation_plan_refusal(evaluation_plan: str, model: str, attention: bool) -> str | None:
    """Why exact evaluations of a ``model`` run cannot exchange on ``evaluation_plan``, in one sentence, or None
    (``attention``: a layer weighs each edge by its source row, which a partial sum hides). The command line
    and the trainer ask it alike."""
    if evaluation_plan not in EVALUATION_PLANS:
        return f"--evaluation-plan must be one of {', '.join(EVALUATION_PLANS)}, got {evaluation_plan!r}"
    if evaluation_plan == "field":
        return (f"--evaluation-plan field multiplies by the held rows of Â alone, but attention ({model}) weighs each "
                "edge by its rows' scores through its operator: use --evaluation-plan same") if attention else None
    if evaluation_plan != "same" and plan_class(evaluation_plan).run_refusal(attention=attention):
        return (f"--evaluation-plan {evaluation_plan} sends partial sums, but attention ({model}) weighs each edge "
                "by its source row itself: use --evaluation-plan same")
    return None


@dataclass
class TrainConfig:
    """Hyper-parameters of one run; defaults are Kipf & Welling's GCN on Cora."""

    model: str = "gcn"
    hidden: int = 16
    layers: int = 2
    dropout: float = 0.5
    lr: float = 0.01
    weight_decay: float = 5e-4
    weight_decay_scope: str = "first"  # "first": first layer only (Kipf & Welling), "all"
    epochs: int = 200
    eval_every: int = 1
    steer_evaluation: bool = False  # the step's own forward decides when an exact evaluation is due
                                    # (algorithms.training.steering); eval_every is then the ceiling
    target_acc: float | None = None  # the validation accuracy a run races to (steering's target rule)
    seed: int = 0
    plan: str = "p2p"
    evaluation_plan: str = "same"  # what exact evaluations exchange on: "same" (``plan``) or "cover" (exact, fewer
                                   # rows; built beside ``plan`` where that is another, for policies cover refuses),
                                   # or "field": none, each rank holds its receptive field (gathered at set-up)
    replication: int = 1
    feature_norm: str = "row"  # "row": divide each feature row by its sum; "none"
    dtype: str = "float32"
    sample: AxisSpec = AxisSpec("sample")  # boundary sampling policy, e.g. "bns:p=0.1" (text is parsed here)
    stale: AxisSpec = AxisSpec("stale")    # staleness policy, e.g. "sancus-h:eps=0.02"
    clip: float = 0.0     # global gradient-norm bound; 0 = off (local threshold clip / sqrt(G), as SANCUS)
    input_exchange: str = "auto"   # layer 0: "once" (X's boundary rows kept by receivers), "per-epoch", "auto"
    dropout_side: str = "auto"     # "owner", "receiver" (exchanges carry pre-dropout rows), "auto"
    halo_budget: int | None = None  # bytes of halo rows a rank may keep under "once" (None: unlimited)
    audit_every: int = 0           # every k epochs, one exact forward beside the policy's (0: never)
    progress: str = "auto"         # pipelined exchanges: "test" (at every layer), "thread" (and a probe thread), "none";
                                   # "auto": "thread" where some rank is on another node (TCP needs it), else "test"
    overlap_evaluation: bool = False  # evaluations may run beside the next step (Trainer.train_epoch's
                                      # evaluate_alongside); their transfers progress like pipelined ones
    compress: str = "none"         # exchanged rows and gradients: "none", "fp16", "bf16", "int8[:stochastic]", ",feedback"
    heads: int = 1                 # GAT: attention heads of each hidden layer (concatenated)
    output_heads: int = 1          # GAT: attention heads of the output layer (averaged)
    attention_dropout: float = 0.0  # GAT: dropout on the attention weights
    guard: str = GuardSettings.mode              # the accuracy guard: "auto" (on with a policy), "off"
    guard_drop: float = GuardSettings.drop       # falling: validation this far below its best
    guard_patience: int = GuardSettings.patience # ... for this many evaluations (loss: steps)
    guard_loss_rise: float = GuardSettings.loss_rise # falling: loss above (1 + this) x its lowest
    guard_warmup: int = GuardSettings.warmup     # epochs that only set the best
    guard_sharp: float = GuardSettings.sharp     # falling at once: one evaluation this far below
    guard_noise: float = GuardSettings.noise     # falls must exceed this many standard errors of validation
    guard_settle: float = GuardSettings.settle   # validation falls count once the loss fell this share
    guard_stall: int = GuardSettings.stall       # ... which it must within this many epochs of a policy taking
                                                 # over, or the guard finishes exact
    guard_bias: str = GuardSettings.bias         # the second signal: the policy against exact on the same weights

    def __post_init__(self) -> None:
        for axis in ("sample", "stale"):
            value = getattr(self, axis)
            if not isinstance(value, AxisSpec):
                object.__setattr__(self, axis, AxisSpec.parse(axis, str(value)))

    @classmethod
    def from_args(cls, args: argparse.Namespace, **overrides: Any) -> "TrainConfig":
        """Every field ``args`` has under the field's own name (``--weight-decay`` -> ``weight_decay``), then
        ``overrides``; a field ``args`` lacks keeps its default. Policies arrive parsed (argparse types)."""
        values = {spec.name: getattr(args, spec.name) for spec in fields(cls) if hasattr(args, spec.name)}
        return cls(**{**values, **overrides})

    def record(self) -> dict[str, Any]:
        """Every field as plain JSON values (policies as their text)."""
        values = {key: getattr(self, key) for key in self.__dataclass_fields__}
        return {key: str(value) if isinstance(value, AxisSpec) else value for key, value in values.items()}

    def guard_settings(self) -> GuardSettings:
        return GuardSettings(self.guard, self.guard_drop, self.guard_patience, self.guard_loss_rise,
                             self.guard_warmup, self.guard_sharp, self.guard_noise, self.guard_settle,
                             self.guard_stall, self.guard_bias)

    def layer_options(self) -> LayerOptions:
        """The options only some layer kinds take (attention heads, attention dropout)."""
        return LayerOptions(self.heads, self.output_heads, self.attention_dropout)

    def fingerprint(self) -> dict[str, Any]:
        """The fields a checkpoint must agree with (P, plan and c change no math of the replicated weights and
        Adam state, so a checkpoint resumes at any of them; attention options where set)."""
        keep = ("model", "hidden", "layers", "dropout", "lr", "weight_decay", "weight_decay_scope", "seed",
                "feature_norm", "dtype", "sample", "stale", "clip", "dropout_side", "compress")
        if not self.layer_options().is_default():
            keep += ("heads", "output_heads", "attention_dropout")
        return {key: value for key, value in self.record().items() if key in keep}
