"""``train --grid X,Y,Z``: the flags a grid run refuses (before MPI starts) and its set-up (shape, memory, blocks).

The process grid (:mod:`sparse_dist.grid`) replaces the 1D plans' halo exchange by allreduces along its axes; a
grid run is exact. What is a 1D idea is refused in one sentence naming what to use instead: sampling and
staleness (they thin or age a halo the grid does not have), ``--plan``/``--replication`` (the grid is the layout),
adaptive bit widths (``--compress adaptive``: the grid codes at one width), ``--policy auto``, the evaluation beside
or steered by a step, ``--audit-every``, ``--clip``, ``--input-exchange``/``--halo-budget`` (layer 0 is aggregated
once), mini-batch training, GAT, multi-label graphs and unnormalised features. ``--compress`` with a fixed format
codes the step's allreduces (:mod:`sparse_dist.grid_links`), guarded as a 1D compressed run is
(:mod:`algorithms.training.grid_policy`); without it the run is exact and the guard has nothing to tighten. Checkpoints are the 1D trainer's (the whole weights and Adam,
replicated): a set written by either resumes in the other, at any grid and any ``P``
(:mod:`algorithms.training.grid_trainer`).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from algorithms.layers import layer_type
from algorithms.training.config import TrainConfig
from algorithms.training.grid_trainer import GridTrainer, grid_kind_refusal
from runners.data.grid_reader import load_grid_graph, read_meta_everywhere
from runners.grid_memory import check_grid_memory
from runners.perf.grid_model import AUTO, GridEpoch, choose_grid, factorisations
from runners.grid_probes import allreduce_link, probe_rates, probe_seconds
from sparse_dist.comm import Communicator, said_once
from sparse_dist.compress import Codec
from sparse_dist.cost import Network
from sparse_dist.grid import GridShape, ProcessGrid

_USE_1D = "drop --grid to run it on a 1D plan (--plan p2p)"


class GridRunError(ValueError):
    """A grid run that cannot start with this job or dataset (its shape against the ranks, a multi-label
    graph): one sentence, said once."""


def grid_flag_problem(args: argparse.Namespace) -> str | None:
    """Why ``--grid`` cannot run with the other flags given, in one sentence, or None (also without ``--grid``)."""
    text = getattr(args, "grid", None)
    if text is None:
        return None
    try:
        if text != AUTO:
            GridShape.parse(text, _size_of(text))
    except ValueError as exc:
        return str(exc) + " (or auto)"
    if layer_type(args.model).grid_form is None:
        return grid_kind_refusal(args.model)
    refusals = (
        (getattr(args, "mode", "full") != "full",
         "--grid is full-graph training; mini-batch training (--mode minibatch) runs on the 1D shards: drop --grid"),
        (args.plan != "p2p", f"--grid replaces --plan (the grid's allreduces are its exchange): drop --plan "
                             f"{args.plan}, or drop --grid to run --plan {args.plan}"),
        (args.replication != 1, "--grid replaces --replication (a 1.5D layout of c replicas is the grid P/c x c x 1 "
                                "only in its counting): drop --replication"),
        (not args.sample.is_none or not args.stale.is_none,
         f"--sample/--stale thin or age the 1D halo exchange, which a grid run does not have; {_USE_1D}"),
        (_adaptive(args.compress), f"--compress {args.compress} agrees its bit widths over the 1D exchanges; the grid "
                                   f"codes its allreduces at one width: give --compress int8,feedback (or fp16, "
                                   f"bf16, int4, int2), or {_USE_1D}"),
        (args.policy == "auto",
         f"--policy auto chooses among the 1D plans' policies: drop --policy auto, or {_USE_1D}"),
        (args.overlap_evaluation or args.steer_evaluation,
         "--overlap-evaluation and --steer-evaluation are for the 1D plans' evaluation; a grid run evaluates after "
         "its step (--eval-every): drop them"),
        (args.audit_every > 0, "--audit-every's per-layer errors are the 1D trainer's; a grid run's guard reads its "
                               "own exact reference: drop --audit-every"),
        (args.clip > 0, "--clip is not built for the grid (its gradients are whole only after their allreduce): "
                        f"drop --clip, or {_USE_1D}"),
        (args.feature_norm == "none", f"--grid normalises features by their row sums: drop --feature-norm none, or "
                                      f"{_USE_1D}"),
        (args.input_exchange != "auto" or args.halo_budget is not None,
         "--input-exchange and --halo-budget choose the 1D plans' layer-0 exchange; the grid aggregates X once: "
         "drop them"),
    )
    return next((sentence for refused, sentence in refusals if refused), None)


def resumed_plan(args: argparse.Namespace, world_size: int) -> str:
    """The plan a resume compares with the set's (its per-rank state fits only the layout that wrote it):
    ``--plan``, or ``grid:XxYxZ`` for a given grid. ``--grid auto`` chooses after the set is read, so its
    per-rank state (error-feedback residuals) is dropped, as at another layout."""
    text = getattr(args, "grid", None)
    if text is None:
        return args.plan
    try:
        return f"grid:{GridShape.parse(text, world_size)}"
    except ValueError:  # auto, or a shape of another size: refused when the grid opens
        return f"grid:{text}"


def _adaptive(text: str) -> bool:
    """Whether ``--compress`` asks for adaptive bit widths (a malformed text is the flag's own error)."""
    try:
        codec = Codec.parse(text)
    except ValueError:
        return False
    return codec is not None and codec.adapts


def _size_of(text: str) -> int:
    """``X * Y * Z`` of a well-formed ``--grid`` text (the world size is checked at run time), else 0."""
    try:
        values = [int(piece) for piece in text.replace("x", ",").split(",")]
    except ValueError:
        return 0
    return int(np.prod(values)) if len(values) == 3 and min(values) >= 1 else 0


def open_grid_run(comm: Communicator, args: argparse.Namespace, config: TrainConfig, device: torch.device,
                  threads: int) -> tuple[GridTrainer, dict[str, Any], TrainConfig, dict[str, Any] | None]:
    """The grid of ``--grid`` (or, for ``auto``, the one the cost model prices fastest, :func:`choose_shape`),
    every rank's memory estimated (a run its node cannot hold is refused), its blocks read and the trainer built;
    returns the trainer, the memory figures the results file keeps, the config with ``plan`` ``grid:XxYxZ`` and,
    for ``auto``, the ``grid_auto`` record. Collective; a problem is one sentence, said once."""
    meta = read_meta_everywhere(comm, args.data)
    if meta.get("multilabel") or config.feature_norm != "row":  # from meta and flags: the same on every rank
        what = "multi-label" if meta.get("multilabel") else f"features scaled as --feature-norm {config.feature_norm}"
        raise said_once(GridRunError(f"--grid trains single-label graphs with features normalised by row sums; "
                                     f"{meta['name']} has {what}; {_USE_1D}"))
    form = layer_type(config.model).grid_form
    assert form is not None  # refused with the flags
    dtype = {"float32": torch.float32, "float64": torch.float64}[config.dtype]
    itemsize = torch.tensor([], dtype=dtype).element_size()
    chosen: dict[str, Any] | None = None
    if args.grid == AUTO:
        shape, chosen = choose_shape(comm, meta, config, itemsize, form.terms, threads, device)
    else:
        try:
            shape = GridShape.parse(args.grid, comm.size)
        except ValueError as exc:  # the same text and size on every rank
            raise said_once(GridRunError(str(exc))) from None
    grid = ProcessGrid(comm, shape)
    memory = check_grid_memory(comm, meta, shape, grid.coords, config.layers, config.hidden, itemsize, form.terms,
                               config.dropout > 0.0)
    graph = load_grid_graph(comm, grid, args.data, config.layers,
                            np.float32 if dtype == torch.float32 else np.float64, form.normalization)
    config = replace(config, plan=f"grid:{shape}")
    return GridTrainer(comm, grid, graph, config, device), memory, config, chosen


def choose_shape(comm: Communicator, meta: dict[str, Any], config: TrainConfig, itemsize: int, terms: int,
                 threads: int, device: torch.device) -> tuple[GridShape, dict[str, Any]]:
    """``--grid auto``: the link (allreduces, :func:`runners.grid_probes.allreduce_link`) and the cores (an SpMM,
    a GEMM and an elementwise pass of the run's width, :func:`runners.grid_probes.probe_seconds`) measured on every
    rank and agreed as the slowest, then every ``X x Y x Z = P`` priced by the grid's cost model
    (:func:`runners.perf.grid_model.choose_grid`); the fastest, and the ``grid_auto`` record (the measurements,
    every grid's predicted epoch and busiest-rank bytes). Rank 0 prints the choice and the runner-up. Collective."""
    alpha, beta = allreduce_link(comm)
    degree = max(1, round(meta["num_edges"] / max(meta["num_nodes"], 1)))
    probed = probe_seconds(degree, config.hidden, device)
    slowest = comm.allgather_array(np.array([alpha, beta, *probed], dtype=np.float64)).max(axis=0)
    rates = probe_rates(slowest[2:], degree, config.hidden, threads, "measured at set-up by --grid auto")
    net = Network("measured", float(slowest[0]), float(slowest[1]), float(slowest[0]), float(slowest[1]),
                  ranks_per_node=1, cores_per_node=threads)
    dims = (meta["feature_dim"], *[config.hidden] * (config.layers - 1), meta["num_classes"])
    priced = choose_grid(comm.size, factorisations(comm.size), meta["num_nodes"], meta["num_edges"], dims, itemsize,
                         rates, net, threads, terms, input_once=config.dropout == 0.0,
                         codec=Codec.parse(config.compress))
    if comm.rank == 0:
        print(f"grid auto: chose {_line(priced[0])}", flush=True)
        if len(priced) > 1:
            print(f"grid auto: runner-up {_line(priced[1])} (link {slowest[0] * 1e6:.0f} us, "
                  f"{1e-9 / slowest[1]:.3g} GB/s)", flush=True)
    record = {"chosen": str(priced[0].shape), "measured": {"alpha": float(slowest[0]), "beta": float(slowest[1]),
                                                           "spmm_rate": rates.spmm, "dense_rate": rates.dense,
                                                           "elementwise_rate": rates.elementwise},
              "candidates": [{"grid": str(e.shape), "predicted_epoch": e.epoch, "busiest_rank_bytes": e.bytes}
                             for e in priced]}
    return priced[0].shape, record


def _line(epoch: GridEpoch) -> str:
    return (f"{epoch.shape}, predicted epoch {epoch.epoch:.3g} s, busiest rank "
            f"{sum(epoch.bytes.values()) / 1e6:.1f} MB a step")


__all__ = ["GridRunError", "choose_shape", "grid_flag_problem", "open_grid_run"]
