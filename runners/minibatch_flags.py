"""``train --mode minibatch`` flags: defined, checked before MPI starts, and turned into a trainer.

The train command calls :func:`add_minibatch_arguments` from its ``add_arguments``, :func:`minibatch_flag_problem`
from its ``check_arguments`` (so a bad combination is refused before MPI does any collective work) and
:func:`make_trainer` where it builds its trainer. The mode is read from the flags once: the check builds the
run's :class:`MinibatchConfig` (None for a full-graph run) and keeps it as ``args.minibatch``; the trainer,
the checkpoint fingerprint (:func:`mode_fingerprint`) and the results file's ``config`` record
(:func:`mode_record`) read that object. Decisions: ``--checkpoint``/``--resume`` in mini-batch mode are
written at epoch ends like full-graph ones (a batch is a pure function of (seed, epoch, step), so weights,
Adam state and epoch resume exactly) and their fingerprint adds the mode, the fanouts and the global batch
size; ``--fanouts`` needs one entry per ``--layers``.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from algorithms.minibatch import MinibatchConfig, MinibatchTrainer, minibatch_problem, parse_fanouts
from algorithms.train import LocalGraph, TrainConfig, Trainer
from runners.argtypes import at_least
from sparse_dist.comm import Communicator
from sparse_dist.sampling import SAMPLERS, compiled_sampler_problem

MODES = ("full", "minibatch")


def fanouts_arg(text: str) -> tuple[int | None, ...]:
    """argparse type of ``--fanouts``."""
    try:
        return parse_fanouts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_minibatch_arguments(parser: argparse.ArgumentParser) -> None:
    """``--mode``, ``--fanouts``, ``--batch-size``, ``--feature-cache``, ``--prefetch``, ``--sample-batches``,
    ``--sampler`` (docs/guide/minibatch.md)."""
    parser.add_argument("--mode", choices=MODES, default="full",
                        help="full: full-graph training (default); minibatch: sampled mini-batches (DistDGL's "
                             "synchronous SGD), evaluated exactly on the full graph")
    parser.add_argument("--fanouts", type=fanouts_arg, default=None, metavar="K1,K2,...",
                        help="minibatch: neighbours sampled per node on each hop from the seeds, one per layer, "
                             "each >= 1 or 'all' (first entry: the hop from the seeds; default: 'all' per layer)")
    parser.add_argument("--batch-size", type=at_least(1), default=None, metavar="B",
                        help="minibatch: training nodes per rank per step, >= 1; a step trains on P*B nodes "
                             "(default: 512)")
    parser.add_argument("--feature-cache", type=at_least(0), default=0, metavar="ROWS",
                        help="minibatch: remote input rows each rank keeps, chosen by estimated inclusion "
                             "probability, >= 0 (default: 0, none)")
    parser.add_argument("--prefetch", type=at_least(0), default=0, metavar="N",
                        help="minibatch: sample and fetch up to N batches ahead on a worker thread while the "
                             "current one trains (needs MPI_THREAD_MULTIPLE; results are bitwise those of 0), "
                             ">= 0 (default: 0, no overlap)")
    parser.add_argument("--sample-batches", type=at_least(1), default=1, metavar="K",
                        help="minibatch: sample K batches together, one round of exchanges per hop for all K "
                             "(DistDGL's k-batch step: K times fewer collective rounds, bitwise the same "
                             "batches), >= 1 (default: 1, each batch alone)")
    add_sampler_argument(parser)


def add_sampler_argument(parser: argparse.ArgumentParser) -> None:
    """``--sampler auto|numba|numpy`` (train --mode minibatch and bench minibatch)."""
    parser.add_argument("--sampler", choices=SAMPLERS, default="auto",
                        help="minibatch: the neighbour-sampling kernel: numba (compiled, per row, threaded), numpy "
                             "(the reference: the same draws vectorised over a hop's rows, one thread) or auto = "
                             "numba where it imports, else numpy (default: auto); both draw the same blocks, bitwise")


def sampler_problem(name: str) -> str | None:
    """Why ``--sampler name`` cannot run here (numba asked for but not importable), or None."""
    problem = compiled_sampler_problem() if name == "numba" else None
    return f"--sampler numba: {problem}; install numba or use --sampler numpy" if problem else None


DEFAULT_BATCH_SIZE = 512


def minibatch_flag_problem(args: argparse.Namespace) -> str | None:
    """Why the mini-batch flags do not fit (checked before MPI starts), or None; fills their defaults and
    keeps the run's settings as ``args.minibatch`` (:func:`minibatch_settings`)."""
    minibatch = minibatch_settings(args)
    if minibatch is None:
        given = [flag for flag, value in (("--fanouts", args.fanouts), ("--batch-size", args.batch_size),
                                          ("--feature-cache", args.feature_cache or None),
                                          ("--prefetch", args.prefetch or None),
                                          ("--sample-batches", None if args.sample_batches == 1 else args.sample_batches),
                                          ("--sampler", None if args.sampler == "auto" else args.sampler))
                 if value is not None]
        return f"{', '.join(given)} need --mode minibatch" if given else None
    problem = sampler_problem(minibatch.sampler)
    if problem:
        return problem
    shape = TrainConfig(model=args.model, layers=args.layers, replication=args.replication, sample=args.sample,
                        stale=args.stale, compress=args.compress)
    return minibatch_problem(shape, minibatch)


def minibatch_settings(args: argparse.Namespace) -> MinibatchConfig | None:
    """The run's mini-batch settings, None for a full-graph run: built from the flags the first time it is
    asked (the defaults filled in: ``all`` per layer, batch size 512) and kept as ``args.minibatch``."""
    if not hasattr(args, "minibatch"):
        if getattr(args, "mode", "full") == "full":
            args.minibatch = None
        else:
            fanouts = args.fanouts if args.fanouts is not None else (None,) * args.layers
            batch_size = args.batch_size if args.batch_size is not None else DEFAULT_BATCH_SIZE
            args.minibatch = MinibatchConfig(tuple(fanouts), batch_size, args.feature_cache, args.prefetch,
                                             args.sample_batches, args.sampler)
    return args.minibatch


def make_trainer(comm: Communicator, graph: LocalGraph, config: TrainConfig, device: torch.device,
                 args: argparse.Namespace) -> Trainer | MinibatchTrainer:
    """The full-graph trainer, or with ``--mode minibatch`` the mini-batch one (collective)."""
    minibatch = minibatch_settings(args)
    if minibatch is not None:
        return MinibatchTrainer(comm, graph, config, minibatch, device)
    return Trainer(comm, graph, config, device)


def mode_fingerprint(args: argparse.Namespace, world_size: int, saved: Any) -> dict[str, Any]:
    """What this run adds to :meth:`TrainConfig.fingerprint` when it resumes a checkpoint whose fingerprint
    is ``saved``: a mini-batch run its :meth:`MinibatchConfig.fingerprint`; a full-graph run nothing (so
    checkpoints written before mini-batch mode existed still resume), or ``mode: full`` against a mini-batch
    checkpoint (so the refusal names the mode)."""
    minibatch = minibatch_settings(args)
    if minibatch is not None:
        return minibatch.fingerprint(world_size)
    return {"mode": "full"} if isinstance(saved, dict) and "mode" in saved else {}


def mode_record(args: argparse.Namespace) -> dict[str, Any]:
    """What the results file's ``config`` record says of the mode."""
    minibatch = minibatch_settings(args)
    return minibatch.record() if minibatch is not None else {"mode": "full"}
