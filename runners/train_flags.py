"""``sparse-dist train``'s flags, in groups by concern (files, model, schedule, exchange, machine; the guard's in
:mod:`runners.guard_flags`, mini-batch's in :mod:`runners.minibatch_flags`), and the attention flags that
``bench train`` shares. Each flag is checked by its type while the command line is parsed, before MPI starts;
combinations are :func:`runners.train_cmd.check_arguments`'."""

from __future__ import annotations

import argparse

from algorithms.layers import LAYER_TYPES, layer_type
from algorithms.model import MODEL_KINDS
from algorithms.policies import sampling_arg, staleness_arg
from algorithms.static_input import DROPOUT_SIDES, INPUT_EXCHANGES, halo_budget_arg
from algorithms.train import PROGRESS_MODES
from algorithms.training.config import EVALUATION_PLANS
from algorithms.training.steering import DEFAULT_CEILING
from runners.argtypes import add_renamed, at_least, non_negative, number, positive, probability
from runners.argtypes import seed as seed_number
from runners.guard_flags import add_guard_arguments
from runners.minibatch_flags import add_minibatch_arguments
from runners.model_defaults import help_for
from sparse_dist.plans import PLAN_NAMES

DEFAULT_CHECKPOINT_EVERY = 10
"""Epochs between checkpoints when ``--checkpoint`` is given without ``--checkpoint-every``."""

target_accuracy = number(0.0, 1.0, low_open=True)
"""A validation accuracy (or micro-F1) to time training to, in ``(0, 1]``."""


def add_attention_arguments(parser: argparse.ArgumentParser, defaults: dict[str, object] | None = None) -> None:
    """``--heads``, ``--output-heads``, ``--attention-dropout`` (GAT only; see :func:`attention_problem`).

    ``defaults`` None: left at None and filled from ``--layer-kind``'s row of :data:`MODEL_DEFAULTS` after parsing
    (train); else these fixed defaults (bench train keeps 1, 1, 0 whatever the model).
    """
    fixed = defaults or {}
    parser.add_argument("--heads", type=at_least(1), default=fixed.get("heads"),
                        help="gat: attention heads of each hidden layer, concatenated (default: "
                             + (f"{fixed['heads']})" if fixed else f"{help_for('heads')})"))
    parser.add_argument("--output-heads", type=at_least(1), default=fixed.get("output_heads"),
                        help="gat: attention heads of the output layer, averaged (default: "
                             + (f"{fixed['output_heads']})" if fixed else f"{help_for('output_heads')})"))
    parser.add_argument("--attention-dropout", type=probability, default=fixed.get("attention_dropout"),
                        help="gat: dropout probability on the attention weights, in [0, 1) (default: "
                             + (f"{fixed['attention_dropout']})" if fixed else f"{help_for('attention_dropout')})"))


_NO_ATTENTION = {"heads": 1, "output_heads": 1, "attention_dropout": 0.0}


def attention_problem(args: argparse.Namespace) -> str | None:
    """Why the attention flags do not fit ``--layer-kind``, or None (a flag left at its default or None is fine; a
    kind takes them when its layer says so, ``takes_options``)."""
    given = {key: getattr(args, key) for key, neutral in _NO_ATTENTION.items()
             if getattr(args, key) is not None and getattr(args, key) != neutral}
    if layer_type(args.model).takes_options or not given:
        return None
    takers = " or ".join(kind for kind, known in LAYER_TYPES.items() if known.takes_options)
    return (f"--heads, --output-heads and --attention-dropout are for --layer-kind {takers}; "
            f"--layer-kind {args.model} has no attention (got " + " ".join(f"--{key.replace('_', '-')} {value}"
                                                                           for key, value in given.items()) + ")")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of ``train`` in groups by concern, each checked by its type while the command line is parsed
    (before MPI)."""
    _files_arguments(parser.add_argument_group("files", "the dataset, the results file and checkpoints"))
    _model_arguments(parser.add_argument_group("model", "the model and its optimiser"))
    _schedule_arguments(parser.add_argument_group("schedule", "epochs, evaluations and when to stop"))
    _exchange_arguments(parser.add_argument_group("exchange", "how the SpMM exchanges rows, which policy avoids "
                                                              "what, and the accuracy guard over it"))
    _machine_arguments(parser.add_argument_group("machine", "where each rank runs"))
    add_minibatch_arguments(parser)


def _files_arguments(parser: argparse._ActionsContainer) -> None:
    """``train``'s flags of one concern: the dataset, the results file and checkpoints."""
    parser.add_argument("--data", required=True, help="dataset directory made by `sparse-dist prepare` (required)")
    parser.add_argument("--out", default=None,
                        help="results file (JSON lines); not inside --data nor the checkpoint's path "
                             "(default: none)")
    parser.add_argument("--checkpoint", default=None, metavar="PATH",
                        help="write checkpoints: PATH is a small pointer naming the current set of files, "
                             "PATH.eEPOCH.TOKEN/ beside it (docs/reference/checkpoints.md); default: none")
    parser.add_argument("--checkpoint-every", type=at_least(1), default=None, metavar="K",
                        help=f"with --checkpoint: a checkpoint every K >= 1 epochs and after the last epoch "
                             f"(default: every {DEFAULT_CHECKPOINT_EVERY})")
    parser.add_argument("--resume", action="store_true",
                        help="continue from --checkpoint's current set, at any P, --replication and --plan, "
                             "keeping the earlier legs' records in --out (default: off, start at epoch 0)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an --out or --checkpoint file that sparse_dist did not write; with --resume, "
                             "start --out again at the resumed epoch instead of keeping the earlier legs' records "
                             "(default: refuse such a file; keep them)")


def _model_arguments(parser: argparse._ActionsContainer) -> None:
    """``train``'s flags of one concern: the model and its optimiser."""
    add_renamed(parser, "--layer-kind", "--model", dest="model", choices=MODEL_KINDS, default="gcn",
                help="the kind of every layer; it also picks the defaults of --hidden, --dropout, --lr, "
                     "--weight-decay, --weight-decay-scope and the attention flags, each from its paper "
                     "(default: %(default)s; --model is its old name)")
    parser.add_argument("--layers", type=at_least(1), default=2, help="number of layers, >= 1 (default: %(default)s)")
    parser.add_argument("--hidden", type=at_least(1), default=None,
                        help=f"hidden width, >= 1; gat: per head (default: {help_for('hidden')})")
    parser.add_argument("--dropout", type=probability, default=None,
                        help=f"dropout probability on every layer's input, in [0, 1) (default: {help_for('dropout')})")
    add_attention_arguments(parser)
    parser.add_argument("--lr", type=positive, default=None,
                        help=f"Adam learning rate, > 0 (default: {help_for('lr')})")
    parser.add_argument("--weight-decay", type=non_negative, default=None,
                        help=f"L2 weight decay, >= 0 (default: {help_for('weight_decay')})")
    parser.add_argument("--weight-decay-scope", choices=("first", "all"), default=None,
                        help="first: the first layer only, as Kipf & Welling; all: every weight "
                             f"(default: {help_for('weight_decay_scope')})")
    parser.add_argument("--seed", type=seed_number, default=0,
                        help="seed of the weights and dropout masks, >= 0 (default: %(default)s)")
    parser.add_argument("--clip", type=non_negative, default=0.0,
                        help="gradient-norm bound, >= 0; each row group clips locally to clip/sqrt(G) "
                             "(default: 0, off)")
    parser.add_argument("--feature-norm", choices=("auto", "row", "none"), default="auto",
                        help="auto (default): what the dataset's meta.json says (row for Planetoid and synthetic "
                             "bag-of-words, none for OGB and edge lists)")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="element type of features, weights and exchanges (default: %(default)s)")


def _schedule_arguments(parser: argparse._ActionsContainer) -> None:
    """``train``'s flags of one concern: epochs, evaluations and when to stop."""
    parser.add_argument("--epochs", type=at_least(1), default=200,
                        help="training epochs, >= 1 (default: %(default)s)")
    parser.add_argument("--eval-every", type=at_least(1), default=None,
                        help="evaluate every k epochs and after the last, k >= 1; with --steer-evaluation at "
                             f"least every k (default: 1; {DEFAULT_CEILING} with --steer-evaluation)")
    parser.add_argument("--steer-evaluation", action="store_true",
                        help="the step's own forward (its validation accuracy under the policy and dropout, "
                             "summed over ranks in one small allreduce) decides when an exact evaluation is due: the "
                             "first step, a possible --target-acc, a possible fall, at least every --eval-every "
                             "epochs and the last; every reported accuracy stays an exact evaluation's "
                             "(full-graph mode; default: evaluate on the --eval-every schedule)")
    parser.add_argument("--overlap-evaluation", action="store_true",
                        help="evaluate each epoch's weights beside the next step, in turns, so the evaluation's "
                             "exchanges travel while that step computes (the same metrics, bitwise; an epoch's row "
                             "is written after the next step; full-graph mode; default: evaluate after the step)")
    parser.add_argument("--print-every", type=at_least(1), default=10,
                        help="rank-0 progress line every k epochs, k >= 1 (default: %(default)s)")
    parser.add_argument("--target-acc", type=target_accuracy, default=None, metavar="A",
                        help="record time-to-accuracy: the final record's time_to_target is the wall time from "
                             "launch to the end of the first epoch whose validation accuracy (val_f1 for "
                             "multi-label) is >= A, A in (0, 1] (default: none, the curve only)")
    parser.add_argument("--stop-at-target", action="store_true",
                        help="with --target-acc: stop after the first epoch that reaches it (still writing the "
                             "final record and, with --checkpoint, a checkpoint); default: run every --epochs")


def _exchange_arguments(parser: argparse._ActionsContainer) -> None:
    """``train``'s flags of one concern: how the SpMM exchanges rows and which policy avoids what."""
    parser.add_argument("--plan", choices=PLAN_NAMES, default="p2p",
                        help="how SpMM exchanges rows: dense-bcast, sparse-bcast, p2p, or cover (per pair a minimum "
                             "vertex cover: rows of H and partial sums, never more than p2p, exact; "
                             "docs/guide/plans.md) (default: %(default)s)")
    parser.add_argument("--evaluation-plan", choices=EVALUATION_PLANS, default="same",
                        help="what exact evaluations exchange on: same (--plan's), cover (built at set-up beside "
                             "--plan: exact, 0.70x p2p's evaluation bytes on the 200k synthetic at P = 2, for "
                             "the sampling policies cover refuses in training) or field (nothing: each rank "
                             "gathers its rows' receptive field once and evaluates alone, trading an evaluation's "
                             "bytes for compute and memory on the field; for slow links); gcn and sage; "
                             "docs/guide/plans.md (default: %(default)s)")
    parser.add_argument("--grid", default=None, metavar="X,Y,Z",
                        help="train over a process grid of X x Y x Z = P ranks instead of a 1D plan: every matrix "
                             "in blocks, allreduces along the grid's axes, exact; gcn and sage "
                             "(docs/guide/plans.md) (default: none, the 1D --plan)")
    parser.add_argument("--replication", type=at_least(1), default=1,
                        help="1.5D replication factor c; must divide the number of ranks P (default: %(default)s)")
    parser.add_argument("--policy", choices=("manual", "auto"), default="manual",
                        help="auto: measure the link and the cores at set-up and train with the sampling and "
                             "compression of least predicted time to accuracy (printed with the runner-up), "
                             "guarded; manual: the --sample, --stale and --compress given (default: %(default)s)")
    parser.add_argument("--sample", default="none", type=sampling_arg,
                        help="boundary sampling policy, e.g. bns:keep=0.1 or bns:keep=0.1,side=owner (default: none)")
    parser.add_argument("--stale", default="none", type=staleness_arg,
                        help="staleness policy: sancus-e:eps=1, sancus-a:eps=1, sancus-h:eps=0.02 "
                             "(add ,skip_backward=1 to skip stale gradients too); pipe:tau=1[,gamma=0.95] "
                             "(boundary rows and gradients tau epochs stale, exchanges hidden behind compute; "
                             "default: none)")
    parser.add_argument("--input-exchange", choices=INPUT_EXCHANGES, default="auto",
                        help="layer 0: once = fetch X's boundary rows once and keep them (no layer-0 exchange "
                             "after that, forward or backward); per-epoch = exchange dropout(X)W every epoch; "
                             "auto (default) = whichever the byte model says moves fewer bytes over the run")
    parser.add_argument("--dropout-side", choices=DROPOUT_SIDES, default="auto",
                        help="who applies dropout to exchanged rows (the product is the same): receiver = "
                             "exchanges carry pre-dropout rows and each rank masks what it multiplies, so a "
                             "cached or stale block stays the same rows (costs width where a layer narrows); "
                             "owner = exchanges carry masked rows; auto (default) = receiver only under "
                             "--stale sancus-h (its rule compares row values) with dropout > 0 and only where "
                             "no exchanging layer then sends more columns than owner-side (byte model, no skips "
                             "assumed: a layer that shrinks the width, e.g. 64 -> 4 classes, keeps auto on "
                             "owner), owner for every other policy (sancus-e, sancus-a, pipe, none); receiver "
                             "with --dropout 0 is owner. Owner-side, sancus-h compares the rows without their "
                             "dropout mask (H W, not dropout(H) W)")
    parser.add_argument("--halo-budget", type=halo_budget_arg, default=None, metavar="SIZE",
                        help="most bytes of X halo rows one rank may keep, e.g. 512M or 4G (default: unlimited); "
                             "auto falls back to per-epoch above it, once is refused")
    parser.add_argument("--compress", default="none", type=str, metavar="FORMAT",
                        help="compress what training exchanges send, rows and gradients: fp16, bf16, int8, "
                             "int4, int2 (per-row float32 scale), int8:stochastic (unbiased rounding), adaptive "
                             "(per layer and direction the fewest of 2/4/8/16 bits whose measured relative "
                             "squared error stays within budget=E, default 1/32, not below min=B, default 4); "
                             "add ,feedback for error feedback at the sender (default: none; evaluation stays "
                             "exact; with --grid, one width codes the grid's allreduces)")
    parser.add_argument("--progress", choices=PROGRESS_MODES, default="auto",
                        help="how a pipelined (pipe) exchange moves on while the rank computes: test = MPI_Test "
                             "of the outstanding exchanges at every layer's exchange; thread = also a "
                             "thread probing MPI every 1 ms; none = only the MPI library's own progress "
                             "(e.g. MPICH_ASYNC_PROGRESS=1); auto = thread where some rank is on another node "
                             "(TCP transfers move only inside MPI calls), else test (default)")
    parser.add_argument("--audit-every", type=at_least(0), default=0, metavar="K",
                        help="every K epochs, one extra exact forward beside the policy's (same weights and "
                             "masks; its time and bytes recorded apart from training) and the relative error "
                             "of each layer's output under the policy against it, K >= 0 (default 0: never; the "
                             "guard's bias signal, --guard-bias, reads this forward, else chooses its own K)")
    add_guard_arguments(parser)


def _machine_arguments(parser: argparse._ActionsContainer) -> None:
    """``train``'s flags of one concern: where each rank runs."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one GPU per rank, cuda:(local rank mod GPUs) (default: %(default)s)")
    parser.add_argument("--threads", type=at_least(0), default=0,
                        help="torch threads per rank, >= 0 (default: 0 = cores / ranks on the node)")
