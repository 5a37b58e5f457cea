"""``sparse-dist train``'s paths: ``--data``, ``--out`` and ``--checkpoint`` checked before any data is read.

Outputs never overwrite an input or each other (compared by resolved path, from the flags alone, so refused
before MPI starts: :func:`overlap_problems`); whether each path can be used is looked at by rank 0 and agreed
(:func:`check_paths`, collective).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from runners.data.shards import ShardError, read_meta
from runners.results import output_path_problem
from sparse_dist.comm import Communicator, said_once


class PathError(ValueError):
    """A ``--data``, ``--out`` or ``--checkpoint`` path that cannot be used; the message names each flag, its
    path and what was expected."""


def _resolved(path: str | Path) -> str:
    """``path`` absolute, symbolic links and ``..`` resolved (as it will be opened), as text."""
    return os.path.realpath(path)


def _inside(path: str, directory: str) -> bool:
    """Whether the resolved ``path`` is ``directory`` or lies beneath it."""
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def overlap_problems(args: argparse.Namespace) -> list[str]:
    """Outputs that would overwrite an input or each other, compared by resolved path.

    Inputs: the ``--data`` directory (every file beneath it) and, with ``--resume``, the checkpoint.
    Outputs: ``--out`` and ``--checkpoint``. A checkpoint may be a set of files, so every path whose text
    starts with the checkpoint's resolved path (``PATH``, ``PATH.rank00001``, ``PATH.e000010/...``) counts
    as the checkpoint's, whatever its layout. The checkpoint being resumed and rewritten is one file set
    by design and is not a clash.
    """
    problems = []
    data = _resolved(args.data)
    out = _resolved(args.out) if args.out is not None else None
    checkpoint = _resolved(args.checkpoint) if args.checkpoint is not None else None
    if out is not None and _inside(out, data):
        problems.append(f"--out {args.out} {'is' if out == data else 'lies inside'} the --data dataset directory "
                        f"{args.data}; writing it there would damage the dataset, so choose a results file "
                        f"outside it")
    if checkpoint is not None and _inside(checkpoint, data):
        problems.append(f"--checkpoint {args.checkpoint} {'is' if checkpoint == data else 'lies inside'} the "
                        f"--data dataset directory {args.data}; writing it there would damage the dataset, so "
                        f"choose a path outside it")
    elif checkpoint is not None and data.startswith(checkpoint):
        problems.append(f"--data {args.data} starts with the --checkpoint path {args.checkpoint}, whose files "
                        f"({args.checkpoint}*) belong to the checkpoint; choose another checkpoint path")
    if out is not None and checkpoint is not None and out.startswith(checkpoint):
        what = "is" if out == checkpoint else "starts with"
        problems.append(f"--out {args.out} {what} the --checkpoint path {args.checkpoint}, whose files "
                        f"({args.checkpoint}*) belong to the checkpoint"
                        + (" being resumed" if args.resume else "") + "; choose another results file")
    return problems


def _path_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the paths of this run, found without reading any shard."""
    problems = overlap_problems(args)
    if problems:
        return problems  # said before anything else: the other checks would describe a path never to be used
    try:
        read_meta(args.data)
    except ShardError as exc:
        problems.append(f"--data {exc}")
    if args.out is not None:
        problems.append(output_path_problem(args.out, "--out", "a results file (JSON lines)", "results.jsonl"))
    if args.checkpoint is not None:
        checkpoint = Path(args.checkpoint)
        if args.resume and not checkpoint.is_file():
            problems.append(f"--checkpoint {checkpoint}: no such file to --resume from; expected a checkpoint "
                            f"written by a run with --checkpoint")
        else:
            problems.append(output_path_problem(checkpoint, "--checkpoint", "a checkpoint file", "run.ckpt"))
    return [problem for problem in problems if problem]


def check_paths(comm: Communicator, args: argparse.Namespace) -> None:
    """Refuse unusable ``--data``/``--out``/``--checkpoint`` paths before any data is read (collective).

    Rank 0 looks (it writes the results file and the checkpoint; every rank then reads the shards and
    the checkpoint itself, and refuses collectively what it cannot read); every rank raises the same
    :class:`PathError`, marked ``every_rank`` so that it is said once.
    """
    problems = comm.allgather_object(_path_problems(args) if comm.rank == 0 else None)[0]
    if problems:
        raise said_once(PathError("; ".join(problems)))
