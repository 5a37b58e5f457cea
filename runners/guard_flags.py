"""The accuracy guard's flags of ``train`` (algorithms.training.guard): their parser group and the one combination
argparse cannot check. Defaults are :class:`~algorithms.training.guard.GuardSettings`'."""

from __future__ import annotations

import argparse

from algorithms.training.guard import BIAS_MODES, GUARD_MODES, GuardSettings


def add_guard_arguments(parser: argparse.ArgumentParser) -> None:
    """``--guard`` and its thresholds (each a field of :class:`~algorithms.training.config.TrainConfig`)."""
    defaults = GuardSettings()
    parser.add_argument("--guard", choices=GUARD_MODES, default=defaults.mode,
                        help="the accuracy guard (docs/guide/policies.md): auto (default) = whenever a policy is "
                             "active, tighten it one step toward exact when the validation accuracy or the loss "
                             "falls behind, restoring the best evaluation's weights; off = never")
    parser.add_argument("--guard-drop", type=float, default=defaults.drop, metavar="D",
                        help=f"falling: validation more than D below its best for --guard-patience evaluations "
                             f"(default {defaults.drop:g}; raised to --guard-noise standard errors)")
    parser.add_argument("--guard-patience", type=int, default=defaults.patience, metavar="N",
                        help=f"evaluations (and steps, for the loss) a fall must last (default {defaults.patience})")
    parser.add_argument("--guard-sharp", type=float, default=defaults.sharp, metavar="S",
                        help=f"falling at once: one evaluation more than S below the best (default "
                             f"{defaults.sharp:g}; >= --guard-drop; raised to twice --guard-noise standard errors)")
    parser.add_argument("--guard-loss-rise", type=float, default=defaults.loss_rise, metavar="R",
                        help=f"falling: the training loss above (1 + R) x the lowest level it held for "
                             f"--guard-patience steps (default {defaults.loss_rise:g})")
    parser.add_argument("--guard-warmup", type=int, default=defaults.warmup, metavar="E",
                        help=f"the first E epochs only set the best (default {defaults.warmup}: early training "
                             f"swings even when exact)")
    parser.add_argument("--guard-noise", type=float, default=defaults.noise, metavar="Z",
                        help=f"a validation fall counts only beyond Z standard errors of an accuracy measured on "
                             f"the validation nodes (default {defaults.noise:g}; 0: the thresholds as given)")
    parser.add_argument("--guard-settle", type=float, default=defaults.settle, metavar="F",
                        help=f"validation falls count only once the training loss has fallen the share F below "
                             f"its first step's (default {defaults.settle:g}; 0: from the end of the warm-up)")
    parser.add_argument("--guard-stall", type=int, default=defaults.stall, metavar="E",
                        help=f"the training loss must have fallen --guard-settle below its first step's within E "
                             f"epochs of the policy in force taking over (the start, or its tightening), or the "
                             f"model has not begun to learn: the guard gives up and finishes exact (default "
                             f"{defaults.stall}; 0: never; not within --guard-warmup)")
    parser.add_argument("--guard-bias", choices=BIAS_MODES, default=defaults.bias,
                        help="the guard's second signal: auto (default, wherever the guard is on) = every K epochs "
                             "an exact forward on the step's weights and masks (the audit's, at --audit-every K; "
                             "else K chosen so that it costs at most 5%% of the steps' time), and when its "
                             "validation accuracy lies more than --guard-noise standard errors above the policy's, "
                             "with the policy's training loss above exact's, for --guard-patience checks in a row, "
                             "the policy is tightened one step; off = only falls are watched")


def guard_flag_problem(args: argparse.Namespace) -> str | None:
    """The one guard combination argparse cannot check, in one sentence (or None)."""
    if args.guard_sharp < args.guard_drop:
        return (f"--guard-sharp {args.guard_sharp:g} is below --guard-drop {args.guard_drop:g}: a collapse is a "
                f"larger fall than a slow one; give --guard-sharp {args.guard_drop:g} or more")
    return None
