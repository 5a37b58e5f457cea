"""Reference for elastic resume: a run at this launch's P (and ``--replication``) that STARTS from a given
checkpoint file's weights, Adam state and epoch, built without the resume path of ``sparse-dist train``.

Usage: ``checkpoint_cases.py DATA MAIN_FILE EPOCHS [train flags]``. It builds the trainer as ``sparse-dist
train`` does (the same parser and configuration), copies the weights and Adam state into it with torch's own
``load_state_dict``, sets the epoch, trains to ``EPOCHS`` (evaluating after every epoch, as the command's
default ``--eval-every 1``) and rank 0 prints ``LOSSES`` and the JSON list of the losses. The test compares
them, bitwise, with what ``sparse-dist train --resume`` at the same P from a checkpoint written at another P
recorded.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from algorithms.checkpoint import load_checkpoint
from algorithms.train import Trainer
from runners.data.shards import load_local_graph
from runners.train_cmd import _config, add_arguments, check_arguments
from sparse_dist.comm import run_or_abort, world
from sparse_dist.layout import Grid


def main() -> int:
    data, main_file, epochs, *flags = sys.argv[1:]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--data", data, "--epochs", epochs, *flags])
    problem = check_arguments(args)  # as the command: it also fills --layer-kind's defaults
    if problem:
        raise SystemExit(problem)
    comm = world()
    torch.set_num_threads(1)
    graph = load_local_graph(comm, data, Grid(comm.size, args.replication).groups, args.replication)
    trainer = Trainer(comm, graph, _config(args, graph.extra["meta"]))
    state = load_checkpoint(main_file)
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.epoch = int(state["epoch"])
    losses = []
    while trainer.epoch < int(epochs):
        losses.append(trainer.train_epoch()["loss"])
        trainer.evaluate()
    trainer.close()
    if comm.rank == 0:
        print("LOSSES " + json.dumps(losses), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
