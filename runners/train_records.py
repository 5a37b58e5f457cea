"""Records of the train command's results file that describe a run rather than an epoch: where a resumed leg
starts (``leg``) and how the run was set up (``setup``); runners/train_cmd.py writes them."""

from __future__ import annotations

from typing import Any

from runners.results import EarlierLegs, spread
from runners.train_epochs import traffic_spread
from sparse_dist.comm import Communicator


def leg_record(epoch: int, checkpoint: str, earlier: EarlierLegs | None) -> dict[str, Any]:
    """Where this resumed leg starts: its epoch and set (``checkpoint``, the set's directory name), the file its
    earlier legs' records came from, the epochs before it that no record holds (as ``[first, last]`` ranges) and
    the run time before it."""
    missing = earlier.missing(epoch) if earlier is not None else list(range(1, epoch + 1))
    ranges: list[list[int]] = []
    for number in missing:
        if ranges and ranges[-1][1] == number - 1:
            ranges[-1][1] = number
        else:
            ranges.append([number, number])
    return {"type": "leg", "leg": earlier.legs if earlier is not None else 1, "start_epoch": epoch,
            "checkpoint": checkpoint,
            "earlier_records": str(earlier.source) if earlier is not None else None, "missing_epochs": ranges,
            "wall_offset": earlier.wall if earlier is not None else 0.0}


def setup_record(comm: Communicator, trainer: Any, grid: bool = False) -> dict[str, Any]:
    """``trainer``'s set-up (a 1D, mini-batch or grid trainer): how layer 0 gets its input, what each rank keeps
    for it, the bytes before the first epoch, the seconds building its plan and its evaluations' own plan where
    they time it, what its evaluations keep where they keep a receptive field (collective); on the ``grid``, also
    the byte model's bytes of a step per rank and phase (``step_bytes_predicted``)."""
    plan_seconds = trainer.plan_setup_seconds  # the same on every rank: a plan times its set-up or never does
    evaluation_seconds = trainer.evaluation_plan_setup_seconds  # where evaluations have a plan of their own
    kept = trainer.evaluation_memory()  # what evaluations keep of their own (the receptive field), or None
    gathered = comm.allgather_object({"memory": trainer.memory(), "bytes": trainer.setup_bytes,
                                      "plan_seconds": plan_seconds, "evaluation_seconds": evaluation_seconds,
                                      "kept": kept})
    memory = {key: spread([g["memory"][key] for g in gathered]) for key in gathered[0]["memory"]}
    return {"type": "setup", "input_exchange": trainer.input_exchange.record(),
            **({"plan_setup_seconds": spread([g["plan_seconds"] for g in gathered])} if plan_seconds is not None
               else {}),
            **({"evaluation_plan_setup_seconds": spread([g["evaluation_seconds"] for g in gathered])}
               if evaluation_seconds is not None else {}),
            **({"evaluation_field": {key: spread([g["kept"][key] for g in gathered]) for key in kept}}
               if kept is not None else {}),
            "progress": getattr(trainer, "progress_mode", None),  # what --progress resolved to (full-graph runs)
            "receiver_dropout": trainer.receiver_dropout, "halo": memory,
            "halo_bytes_per_rank": [g["memory"]["halo_bytes"] for g in gathered],
            "bytes": traffic_spread([g["bytes"] for g in gathered]),
            **({"step_bytes_predicted": comm.allgather_object(trainer.predicted_step_bytes())} if grid else {})}
