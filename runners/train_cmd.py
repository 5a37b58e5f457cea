"""``sparse-dist train``: full-graph distributed training from a prepared dataset directory.

Each rank loads only its own part(s), trains, evaluates every
``--eval-every`` epochs, and rank 0 prints progress and writes the results
file (JSON lines: ``config``, ``environment``, ``setup`` (how layer 0 gets its
input and why, the halo each rank keeps, and the bytes moved before the first
epoch: set-up metadata under ``other``, the one-time halo under ``halo``), one
``epoch`` record per epoch with loss, metrics, time breakdown and training bytes
per phase as min/mean/max over ranks (plus ``eval_bytes`` where it evaluated,
and ``audit`` every ``--audit-every`` epochs: per layer the relative error of
the policy's layer outputs against an exact forward, and that forward's
seconds and bytes, which the epoch's figures leave out),
then ``final`` with peak memory per rank, the bytes of the attention structures each rank
caches (GAT; 0 otherwise), the final metrics and ``bytes_total``:
every byte of the run per phase, set-up and evaluation included).

Time breakdown per epoch: ``local_spmm`` (local sparse multiplies),
``exchange`` (the rank's own seconds inside MPI for the SpMM exchanges: posting, copies, the transfer),
``exchange_wait`` (its seconds in them waiting for partners that had not posted yet: load imbalance),
``allreduce`` and ``allreduce_wait`` (the same for the gradient allreduce; "Waits" in
:mod:`sparse_dist.comm`), ``dropout`` (masks and their application, forward
and backward), ``optimizer`` (the Adam step), ``dense`` (everything else:
dense matmuls, activations, loss).

Time-to-accuracy: every ``epoch`` record carries ``wall``, seconds since launch (:mod:`runners.launch`: rank 0's
process start, recorded as ``launch`` in the ``environment`` record) at the end of that epoch, evaluation
included, read by rank 0 after the epoch's allgather, so it is the slowest rank's time and counts every second
before it (start-up, data loading, halo, evaluation, checkpoints, policy bookkeeping). ``final`` carries
``wall_total``, ``best_val``, ``best_epoch``, ``time_to_best`` and, with ``--target-acc A``, ``time_to_target``
and ``target_epoch``: the ``wall`` and epoch of the first epoch whose validation metric (``val_acc``, or
``val_f1`` multi-label) is at least A (null if none is). Without ``--target-acc`` only the curve is recorded
(time-to-accuracy needs a target). Training runs its ``--epochs`` unless ``--stop-at-target`` ends it cleanly
after the first epoch at the target.

Outputs: one writer each (rank 0 holds ``NAME.lock`` beside ``--out`` and ``--checkpoint`` for the run's life,
:mod:`runners.output_lock`); a file there that is not ours is refused unless ``--overwrite``. ``--resume`` keeps
the earlier legs' records (:func:`runners.results.read_earlier_legs`): the file holds every epoch once, a
``leg`` record says where each resumed leg started, and ``wall`` (so time to best and to target) counts the
earlier legs' time up to the epoch resumed from.
"""

from __future__ import annotations

__all__ = ["add_arguments", "check_arguments", "main"]  # the subcommand's interface (runners.cli); flags: train_flags

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algorithms.checkpoint import (MAIN_FILE, CheckpointError, CheckpointSet, SetWriter, agree, checkpoint_mismatch,
                                   dropped_policy_state, is_checkpoint_file, rank_file, read_pointer,
                                   remove_leftovers)
from algorithms.layers import layer_type
from algorithms.policies import PolicySpec, RunShape
from algorithms.train import TrainConfig, Trainer, bytes_by_phase
from algorithms.training.config import evaluation_plan_refusal
from algorithms.training.state import replicated_state_problem
from algorithms.training.steering import DEFAULT_CEILING
from algorithms.training.tighten import restore_best_at_end
from runners.shm_leftovers import leftover_note
from runners.guard_flags import guard_flag_problem
from runners.minibatch_flags import (make_trainer, minibatch_flag_problem, mode_fingerprint,
                                     mode_record)
from runners.model_defaults import fill_model_defaults
from runners.output_lock import OutputLocks, lock_beside
from runners.policy_auto import auto_problem, choose, with_checkpoint_policies
from runners.results import (EarlierLegs, EarlierResultsError, ResultsWriter, cpu_seconds, environment, foreign_results,
                             partial_beside, peak_memory_bytes, read_earlier_legs)
from runners.data.shards import ShardError, load_local_graph, read_meta
from runners.launch import LAUNCH_SOURCE, LAUNCH_TIME
from runners.train_epochs import EpochRows, run_epochs, traffic_spread
from runners.train_flags import DEFAULT_CHECKPOINT_EVERY, add_arguments, attention_problem
from runners.train_grid import grid_flag_problem, open_grid_run, resumed_plan
from runners.train_records import leg_record, setup_record
from runners.train_paths import PathError, check_paths, overlap_problems
from runners.resources import check_train_resources, free_memory_per_rank, readable_meta
from sparse_dist.comm import Communicator, default_threads_per_rank, mpi_vendor_details, ranks_on_this_node, said_once
from sparse_dist.compress import Codec
from sparse_dist.dcsr import split_grid
from sparse_dist.state_checks import StateError
from sparse_dist.devices import rank_device
from sparse_dist.hostmem import freed_memory_state, huge_page_state
from sparse_dist.layout import Grid
from sparse_dist.plans import plan_class


def check_arguments(args: argparse.Namespace) -> str | None:
    """Flag combinations argparse cannot check (refused before MPI starts); then fills the flags left at None
    with ``--layer-kind``'s defaults (:func:`runners.model_defaults.fill_model_defaults`)."""
    problem = attention_problem(args)
    if problem:
        return problem
    problem = guard_flag_problem(args)
    if problem:
        return problem
    fill_model_defaults(args)
    problem = grid_flag_problem(args)
    if problem:
        return problem
    problem = minibatch_flag_problem(args)
    if problem:
        return problem
    if args.overlap_evaluation and args.minibatch is not None:  # kept by minibatch_flag_problem
        return "--overlap-evaluation is for full-graph training (a mini-batch step has no exchanges to hide it behind)"
    if args.steer_evaluation and args.minibatch is not None:
        return ("--steer-evaluation is for full-graph training (a mini-batch step computes no logits for the "
                "validation nodes to steer by)")
    if args.steer_evaluation and not args.stale.is_none:
        return (f"--steer-evaluation steers by the step's own forward, which --stale {args.stale} computes from "
                f"rows of earlier epochs, so it cannot see that policy fall (a pipe run steered on Cora ended 11 "
                f"points below the same run evaluated every step); evaluate on a schedule (--eval-every) instead")
    if args.eval_every is None:
        args.eval_every = DEFAULT_CEILING if args.steer_evaluation else 1
    if args.stop_at_target and args.target_acc is None:
        return "--stop-at-target needs --target-acc A (the validation accuracy to stop at)"
    if args.resume and not args.checkpoint:
        return "--resume needs --checkpoint PATH (the checkpoint to continue from)"
    overlaps = overlap_problems(args)  # paths only, the same on every rank: refused before MPI starts
    if overlaps:
        return "; ".join(overlaps)
    if args.checkpoint_every is not None and not args.checkpoint:
        return f"--checkpoint-every {args.checkpoint_every} needs --checkpoint PATH (where to write the checkpoints)"
    try:
        Codec.parse(args.compress)
    except ValueError as exc:
        return str(exc)
    problem = auto_problem(args)
    if problem:
        return problem
    problem = plan_class(args.plan).run_refusal(attention=layer_type(args.model).takes_operator,
                                                receiver_dropout=args.dropout_side == "receiver" and args.dropout > 0)
    if problem:
        return problem
    problem = evaluation_plan_problem(args)
    if problem:
        return problem
    shape = RunShape(plan=args.plan, replication=args.replication, model=args.model,
                     dropout_side=args.dropout_side, input_exchange=args.input_exchange)
    return PolicySpec(args.sample, args.stale).refusal(shape)  # the policies' one check, from the flags alone


def evaluation_plan_problem(args: argparse.Namespace) -> str | None:
    """Why ``--evaluation-plan`` cannot be what was asked, in one sentence, or None (from the flags alone)."""
    if args.evaluation_plan == "same":
        return None
    if args.minibatch is not None or args.grid is not None:
        return (f"--evaluation-plan {args.evaluation_plan} is for 1D full-graph training (mini-batch and grid runs "
                "evaluate on the run's own plan)")
    return evaluation_plan_refusal(args.evaluation_plan, args.model, layer_type(args.model).takes_operator)


def _config(args: argparse.Namespace, meta: dict[str, Any] | None = None) -> TrainConfig:
    """The run's hyper-parameters from the checked flags (:func:`check_arguments` filled ``--layer-kind``'s
    defaults), ``--feature-norm auto`` resolved to what the dataset's ``meta`` says (``row`` where it is silent)."""
    norm = args.feature_norm if args.feature_norm != "auto" else (meta or {}).get("feature_norm", "row")
    return TrainConfig.from_args(args, feature_norm=norm)


@dataclass
class Resumption:
    """A checkpoint set read and checked before any shard is read: its main state, this rank's policy state
    (None where the set has none or it does not fit this run) and, where per-rank state was dropped because
    the set was written at another world size, replication or plan, the note rank 0 prints."""

    current: CheckpointSet
    state: dict[str, Any]
    policy: dict[str, Any] | None
    note: str | None
    identity: dict[str, Any]  # what the earlier legs' config record must agree with: fingerprint, mode, graph
    config: TrainConfig  # the run's configuration (with --policy auto: the policies the first leg chose)


def _layout_text(layout: dict[str, Any], other: dict[str, Any]) -> str:
    """``P=4`` (and ``c=2``, ``plan p2p`` where they differ from ``other``)."""
    text = f"P={layout['world_size']}"
    if layout["replication"] != other["replication"]:
        text += f" c={layout['replication']}"
    if layout["plan"] != other["plan"]:
        text += f" plan {layout['plan']}"
    return text


def open_resume(comm: Communicator, args: argparse.Namespace, config: TrainConfig) -> Resumption:
    """Read ``--checkpoint``'s current set on every rank and check it against this run (``config``, the run's
    :func:`_config`): pointer, headers, checksums, the fingerprint of configuration and graph (from
    ``meta.json``). Collective, before any shard is read; any rank's problem is one :class:`CheckpointError`
    everywhere, said once."""
    result, error = None, None
    try:
        current = read_pointer(args.checkpoint)
        state = current.load(MAIN_FILE)
        if args.policy == "auto":  # the first leg chose: resume with its choice, not a new measurement's
            config = with_checkpoint_policies(config, state.get("config"))
        meta = read_meta(args.data)
        fingerprint = {**config.fingerprint(), **mode_fingerprint(args, comm.size, state.get("config"))}
        graph = {"name": meta["name"], "nodes": meta["num_nodes"]}
        identity = {**fingerprint, "mode": mode_record(args)["mode"], "graph": graph}  # as its config record says
        problem = checkpoint_mismatch(state, fingerprint, graph)
        if problem:
            raise CheckpointError(f"--checkpoint {args.checkpoint}: {problem}")
        here = {"world_size": comm.size, "replication": args.replication, "plan": resumed_plan(args, comm.size)}
        policy, note = None, None
        if current.has_rank_files and current.written_at() == here:
            policy = current.load(rank_file(comm.rank))
        elif current.has_rank_files:
            note = (f"resumed at {_layout_text(here, current.written_at())} from a "
                    f"{_layout_text(current.written_at(), here)} checkpoint: dropped "
                    f"{', '.join(dropped_policy_state(config))}")
        result = Resumption(current, state, policy, note, identity, config)
    except (CheckpointError, ShardError) as exc:
        error = str(exc)
    agree(comm, error)
    assert result is not None
    return result


def _companion_problem(args: argparse.Namespace) -> str | None:
    """Why a file ``--out`` writes beside itself (``NAME.partial``, ``NAME.lock``) would be one of the checkpoint's
    (``PATH*``), or None."""
    if args.out is None or args.checkpoint is None:
        return None
    prefix = os.path.realpath(args.checkpoint)
    for companion in (partial_beside(Path(args.out)), lock_beside(args.out)):
        if os.path.realpath(companion).startswith(prefix):
            return (f"--out {args.out} writes {companion} beside it, whose name starts with the --checkpoint path "
                    f"{args.checkpoint} (the checkpoint's files are {args.checkpoint}*); choose another checkpoint "
                    f"path")
    return None


def _foreign_output(args: argparse.Namespace) -> str | None:
    """Why an existing ``--out`` (or its ``.partial``) or ``--checkpoint`` may not be replaced: it is not a file of
    ours (:func:`runners.results.is_results_file`, :func:`algorithms.checkpoint.is_checkpoint_file`) and
    ``--overwrite`` is not given; None if it may. Local (rank 0)."""
    if args.overwrite:
        return None
    try:
        if args.out is not None and (problem := foreign_results(args.out)):
            return problem
        checkpoint = Path(args.checkpoint) if args.checkpoint else None
        if (checkpoint is not None and not args.resume and checkpoint.is_file()  # --resume: read and checked later
                and not is_checkpoint_file(checkpoint)):
            return (f"--checkpoint {checkpoint}: exists and is not a checkpoint of sparse_dist (its first line is "
                    f"not a checkpoint header); pass --overwrite to replace it, or choose another --checkpoint")
    except OSError as exc:
        return f"cannot read {exc.filename} to see whether it is a file of ours: {exc.strerror or exc}"
    return None


def _claim_outputs(comm: Communicator, args: argparse.Namespace) -> OutputLocks:
    """Nobody else's file replaced, and one writer per output: rank 0 refuses an existing file at ``--out`` or
    ``--checkpoint`` that is not ours (:func:`_foreign_output`), then locks both (:mod:`runners.output_lock`;
    held until :meth:`OutputLocks.release` or the process ends). Collective, before any output is touched:
    rank 0 decides, every rank raises the same :class:`PathError`, said once."""
    locks, problem = OutputLocks(), None
    if comm.rank == 0:  # the checks that only read first, so that a refusal creates no lock file
        problem = _companion_problem(args) or _foreign_output(args)
        for flag, path in (("--out", args.out), ("--checkpoint", args.checkpoint)):
            if problem is None and path is not None:
                problem = locks.take(path, flag, overwrite=args.overwrite)
        if problem is not None:
            locks.release()
    problem = comm.allgather_object(problem)[0]
    if problem:
        raise said_once(PathError(problem))
    return locks


def _earlier_legs(comm: Communicator, args: argparse.Namespace, resumption: Resumption | None) -> EarlierLegs | None:
    """Rank 0 of a resumed run with ``--out`` (without ``--overwrite``): the earlier legs' records it keeps
    (:func:`runners.results.read_earlier_legs`); None elsewhere. Collective where resumed: a file that cannot be
    continued is refused on every rank, said once."""
    if resumption is None:
        return None
    earlier, problem = None, None
    if comm.rank == 0 and args.out is not None and not args.overwrite:
        try:
            earlier = read_earlier_legs(args.out, resumption.current.epoch, resumption.identity)
        except EarlierResultsError as exc:
            problem = str(exc)
        except OSError as exc:
            problem = f"--out {args.out}: cannot read the earlier legs' records: {exc.strerror or exc}"
    problem = comm.allgather_object(problem)[0]
    if problem:
        raise said_once(PathError(problem))
    return earlier


def _remove_leftovers(comm: Communicator, args: argparse.Namespace, resumption: Resumption | None) -> None:
    """Rank 0 removes what an interrupted checkpoint write left (never the current set; with a pointer that
    cannot be read, only temporaries) and says what it removed."""
    if comm.rank != 0 or not args.checkpoint:
        return
    keep, sets = (resumption.current.directory.name, True) if resumption is not None else (None, True)
    if resumption is None and Path(args.checkpoint).exists():
        try:
            keep = read_pointer(args.checkpoint).directory.name
        except CheckpointError:
            sets = False
    removed = remove_leftovers(args.checkpoint, keep, sets=sets)
    if removed:
        print(f"checkpoint: removed {len(removed)} leftover(s) of an interrupted checkpoint write: "
              f"{', '.join(removed)}", flush=True)


def _resume(comm: Communicator, trainer: Trainer, resumption: Resumption) -> None:
    """Load a checked set into the trainer: the replicated state, then this rank's policy state where it fits
    (collective: its check is agreed)."""
    agree(comm, _unfit(resumption.current.pointer, replicated_state_problem(trainer, resumption.state)))
    trainer.load_state(resumption.state)
    if resumption.policy is None and resumption.note is None and trainer.has_policy_state:
        agree(comm, f"--checkpoint {resumption.current.pointer}: its set holds no policy state, which this run keeps")
    if resumption.policy is not None:
        agree(comm, trainer.policy_mismatch(resumption.policy))
        error = None
        try:
            trainer.load_policy_state(resumption.policy)
        except StateError as exc:  # checked field by field: its clause says which
            error = _unfit(resumption.current.pointer, f"its policy state for rank {comm.rank} does not fit this "
                                                       f"run: {str(exc)[:200]}")
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError) as exc:
            error = _unfit(resumption.current.pointer, f"its policy state for rank {comm.rank} does not fit this "
                                                       f"run ({type(exc).__name__}: {str(exc)[:120]})")
        agree(comm, error)


def _unfit(pointer: Path, problem: str | None) -> str | None:
    """``problem`` of the checkpoint set ``pointer`` names, as the sentence a resume refuses with, or None."""
    return None if problem is None else f"--checkpoint {pointer}: its set cannot be resumed here: {problem}"


def _ogb_metric(comm: Communicator, trainer: Trainer, meta: dict[str, Any]) -> dict[str, float] | None:
    """The OGB Evaluator's metric on the test split (predictions gathered to rank 0; collective)."""
    rows, predicted = trainer.predictions("test")
    gathered = comm.allgather_object((rows, predicted, trainer.labels[trainer.masks["test"]].cpu().numpy()))
    if comm.rank != 0:
        return None
    from ogb.nodeproppred import Evaluator

    seen: set[int] = set()
    truth, guesses = [], []
    for part_rows, part_pred, part_true in gathered:  # replicas of a row group send the same rows once each
        first = int(part_rows[0]) if len(part_rows) else None
        if first is not None and first in seen:
            continue
        seen.update(int(r) for r in part_rows)
        truth.append(part_true)
        guesses.append(part_pred)
    y_true, y_pred = np.concatenate(truth), np.concatenate(guesses)
    if y_true.ndim == 1:
        y_true, y_pred = y_true[:, None], y_pred[:, None]
    result = Evaluator(meta["ogb_name"]).eval({"y_true": y_true, "y_pred": y_pred})
    return {f"test_ogb_{key}": float(value) for key, value in result.items()}


def main(comm: Communicator, args: argparse.Namespace) -> int:
    """The command (collective): paths checked, outputs claimed (one writer each), then the run."""
    check_paths(comm, args)  # first: before the collectives below and before any shard is read
    meta = readable_meta(args.data)  # None where it cannot be read: the shard reader then says why, collectively
    # memory and disk estimates; may refuse (a grid run estimates its own blocks: runners.train_grid)
    resources = check_train_resources(comm, args, meta) if args.grid is None else None
    locks = _claim_outputs(comm, args)  # before any output is touched (a refusal above leaves no lock file)
    try:
        return _train(comm, args, _config(args, meta), resources)
    finally:
        locks.release()


def _train(comm: Communicator, args: argparse.Namespace, config: TrainConfig,
           resources: dict[str, Any] | None) -> int:
    """Resume or start, train with ``config`` (the run's one :class:`TrainConfig`), write the final record
    (collective; rank 0 holds the outputs' locks)."""
    resumption = open_resume(comm, args, config) if args.resume else None  # also before any shard is read
    earlier = _earlier_legs(comm, args, resumption)  # before the results file is touched
    _remove_leftovers(comm, args, resumption)
    every = args.checkpoint_every or DEFAULT_CHECKPOINT_EVERY
    threads = args.threads or default_threads_per_rank()
    torch.set_num_threads(threads)
    device = rank_device(comm, args.device)  # before any data is read
    auto: dict[str, Any] | None = None
    if resumption is not None:
        config = resumption.config
    if args.grid is not None:  # the process grid: its own blocks, exact (runners.train_grid)
        trainer, resources, config, chosen = open_grid_run(comm, args, config, device, threads)
        auto = {"type": "grid_auto", **chosen} if chosen is not None else None
        meta = trainer.meta
    else:
        grid = Grid(comm.size, args.replication)
        graph = load_local_graph(comm, args.data, grid.groups, args.replication)
        if resumption is None and args.policy == "auto":  # measured and chosen before the trainer (collective)
            config, chosen_policy, lines = choose(comm, split_grid(comm, grid)[1], graph, config, threads, device,
                                                  free_memory_per_rank(resources))
            auto = {"type": "policy_auto", **chosen_policy}
            if comm.rank == 0:
                print("\n".join(lines), flush=True)
        trainer = make_trainer(comm, graph, config, device, args)  # or MinibatchTrainer with --mode minibatch
        meta = graph.extra["meta"]
    checkpoints = (SetWriter(comm, args.checkpoint, replication=args.replication, plan=config.plan)
                   if args.checkpoint else None)
    leader = comm.rank == 0
    writer = ResultsWriter(args.out if leader else None, earlier.lines if earlier is not None else None)
    head = [{"type": "config", **config.record(), **mode_record(args), "data": args.data,
             "graph": {"name": meta["name"], "nodes": meta["num_nodes"]}, "world_size": comm.size,
             "device": args.device, "gpu_aware": comm.gpu_aware, "target_acc": args.target_acc,
             "stop_at_target": args.stop_at_target},
            {"type": "environment", "huge_pages": huge_page_state(), "freed_memory": freed_memory_state(),
             **environment(mpi_vendor_details(), comm.size, threads, ranks_on_this_node(), writes=leader),
             **({"memory": resources} if resources is not None else {}),
             "launch": {"time": LAUNCH_TIME, "source": LAUNCH_SOURCE}},
            setup_record(comm, trainer, args.grid is not None)]
    head += [auto] if auto is not None else []  # what --policy auto or --grid auto measured and chose
    if earlier is None:  # the file starts here; a resumed leg after earlier ones keeps these in its leg record
        for record in head:
            writer.write(record)
    if resumption is not None:  # where this leg starts (after the earlier legs' records: with its own head records)
        leg = leg_record(resumption.current.epoch, resumption.current.directory.name, earlier)
        if earlier is not None:
            leg.update({record["type"]: {k: v for k, v in record.items() if k != "type"} for record in head})
        writer.write(leg)
    if leader:
        print(trainer.input_exchange.describe(), flush=True)
        if trainer.receiver_dropout:
            print("dropout: receiver side (exchanges carry pre-dropout rows; each rank masks what it multiplies)",
                  flush=True)
    if resumption is not None:
        _resume(comm, trainer, resumption)
        if leader:
            print(f"resumed from {args.checkpoint} (set {resumption.current.directory.name}) at epoch "
                  f"{trainer.epoch}", flush=True)
            if resumption.note:
                print(resumption.note, flush=True)
            if earlier is not None:
                print(f"results: kept the earlier legs' records of epochs up to {resumption.current.epoch} from "
                      f"{earlier.source}" + (" (its torn last line left out)" if earlier.torn else ""), flush=True)
    rows, stopped = run_epochs(comm, args, trainer, config, writer, checkpoints, every, earlier)
    _finish(comm, trainer, config, writer, rows, stopped, meta)
    return 0


def _finish(comm: Communicator, trainer: Trainer, config: TrainConfig, writer: ResultsWriter, rows: EpochRows,
            stopped: bool, meta: dict[str, Any]) -> None:
    """Close the run, write the final record and print the summary (collective: the totals are gathered)."""
    leader = comm.rank == 0
    metrics, clock = rows.metrics, rows.clock
    trainer.close()  # collective: the last pipelined flights complete before the totals are counted
    restored = restore_best_at_end(trainer)  # collective where the guard is on
    if restored is not None:
        metrics = dict(restored[0])
    ogb_metric = _ogb_metric(comm, trainer, meta) if "ogb_name" in meta else None
    if ogb_metric is not None:
        metrics.update(ogb_metric)
    totals = comm.allgather_object(bytes_by_phase(comm.stats.snapshot()))  # the whole run, per phase
    peaks = comm.allgather_object(peak_memory_bytes(trainer.device))
    cpu_total = comm.allgather_object(cpu_seconds())  # since the process started: imports and set-up included
    attention = comm.allgather_object(trainer.attention_bytes())
    if leader:
        writer.write({"type": "final", "epochs": trainer.epoch, **metrics, "peak_memory_per_rank": peaks,
                      "attention_structure_bytes_per_rank": attention, "cpu_seconds_per_rank": cpu_total,
                      "bytes_total": traffic_spread(totals),
                      **clock.record(), "stopped_at_target": stopped, "wall_total": rows.wall(),
                      "guard": {"on": trainer.guard.on, "decisions": trainer.guard.state.decisions,
                                "ended_with": trainer.policies.text,
                                "restored_at_end": trainer.guard.state.restored_at_end,
                                "reference_every": trainer.guard.state.reference_every or config.audit_every,
                                "reference_checks": trainer.guard.state.reference_checks}})
        writer.close()
        if restored is not None:
            print(restored[1], flush=True)
        final = metrics.get("test_acc", metrics.get("test_f1"))
        label = "test accuracy" if "test_acc" in metrics else "test micro-F1"
        if final is not None:
            print(f"final {label}: {final:.4f} ({config.model}, P={comm.size}, c={config.replication}, "
                  f"plan {config.plan})", flush=True)
        print(clock.describe(trainer.epoch), flush=True)
        for key, value in metrics.items():
            if key.startswith("test_ogb_"):
                print(f"OGB Evaluator {key.removeprefix('test_ogb_')} on the test split: {value:.4f}", flush=True)
        note = leftover_note("train")  # this job's ranks still map their own segments
        if note:
            print(note, flush=True)
