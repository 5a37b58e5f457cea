"""``sparse-dist bench policies``: the papers' headline comparisons side by side, in one MPI job.

On one prepared dataset, trains the same model under each configuration
and reports exchange bytes (forward + backward, all ranks, all epochs),
the epoch-time breakdown (median over epochs after the first, slowest
rank; ``exch`` and ``allred`` a rank's own seconds in the exchanges and the gradient allreduce, ``e_wait`` and
``a_wait`` its seconds there waiting for partners that had not posted yet: "Waits" in :mod:`sparse_dist.comm`),
the CPU seconds of an epoch (``cpu_usr``, ``cpu_sys``: median, slowest rank, all threads; MPICH
polls while it waits, so a rank's CPU seconds include its waits: over TCP mostly as system time, in the
poll and socket calls, beside the kernel's own TCP work), and the final test accuracy:

* the exact plans: ``p2p``, ``dense-bcast`` (CAGNET) and ``sparse-bcast``;
* BNS-GCN (Fig. 5 / Table 6): exact ``p2p`` vs ``bns`` with p = 0.1, 0.01, 0;
* SANCUS (Table 5): ``dense-bcast`` (CAGNET) vs ``sancus-e`` (eps 1),
  ``sancus-a`` (eps 1) and ``sancus-h`` (eps ``--sancus-h-eps``), with
  gradients exchanged every epoch, plus ``sancus-e`` (eps 1) skipping the
  gradients of stale blocks too (``-bwd``);
* what never changes is sent once: ``p2p`` and ``dense-bcast`` with layer 0
  exchanging ``dropout(X) W`` every epoch and owner-side dropout (``X/epoch``,
  the path before the halo), against the default (``--input-exchange auto``);
* PipeGCN / PSC-GCN: ``pipe`` with tau 1 (and gamma 0.95) and tau 2 on ``p2p``
  (``exch`` is then the time spent inside MPI, what the compute did not hide, not the transfer),
  and ``psc`` at budget ``--psc-budget`` (set it so psc moves about the bytes
  of ``bns p=0.1`` to compare them at equal bytes);
* DGS: ``dgs`` keeping half the remote rows (all feature columns), and a
  quarter of them with half the feature columns;
* compression: ``--compress`` fp16, bf16, int8 and stochastic int8 on exact
  ``p2p``, each without and with error feedback (``+fb``).

Every configuration runs with the train command's defaults otherwise (so
layer 0 reads its halo where the byte model says so, and the SANCUS rows use
receiver-side dropout). Bytes are what all ranks received: forward and
backward exchanges of every epoch plus the one-time halo (``halo MB`` shows
that part). Ratios are taken within this one run: bytes and epoch time
relative to exact ``p2p`` and to ``dense-bcast``. ``--only`` runs a subset.
Bytes also count the ``sample`` phase (psc's and dgs's agreements with the
owners), so a sampling policy pays for what its sample costs to agree.

Time-to-accuracy (``tta_s``): every configuration evaluates after every epoch (as ``train`` does by default;
the epoch-time columns leave evaluation out, TTA counts it). Its "launch" is the start of that configuration
in this one process group (before its shards are loaded: loading, halo, set-up, training, evaluation and
policy bookkeeping all count; MPI and Python start-up do not, being paid once for all rows). ``tta_s`` is the
seconds from there to the end of the first epoch whose validation accuracy reaches the target, read by rank 0
after that epoch's evaluation (whose allreduce waits for the slowest rank); ``-`` if never. The target is
``--target-acc``, else 0.98 of exact ``p2p``'s best validation accuracy in this run
(:data:`runners.time_to_accuracy.DEFAULT_TARGET_FRACTION`), the same for every row. The first configuration
(exact ``p2p``) also pays the process's one-time warm-ups (first kernels, lazy imports), so its ``tta_s`` reads
high beside the others; ``sparse-dist train --target-acc`` (one launch per run) is the fair comparison.
With ``--overlap-evaluation`` each epoch's evaluation runs beside the next step (the same metrics): an epoch's
point on the curve is taken after that next step (the last epoch's after its own evaluation), the epoch-time
columns still leave the evaluation's turns out, and ``evaluation_turns_s`` (JSON) is their median on rank 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from algorithms.policies import AxisSpec
from algorithms.train import TrainConfig, Trainer
from runners.data.shards import load_local_graph
from runners.argtypes import at_least, non_negative, number, positive, probability
from runners.results import cpu_seconds, cpu_since
from runners.argtypes import seed as seed_number

psc_budget = number(0.0, 1.0, low_open=True)
"""psc's budget: a share of neighbours kept, in (0, 1]."""
from sparse_dist.comm import Communicator, default_threads_per_rank
from runners.time_to_accuracy import DEFAULT_TARGET_FRACTION, first_reaching, validation_value

TIME_KEYS = ("total", "local_spmm", "exchange", "exchange_wait", "allreduce", "allreduce_wait", "dense")
IN_MPI = ("exchange", "exchange_wait", "allreduce", "allreduce_wait")  # a step's seconds inside MPI, all parts
EXCHANGE_PHASES = ("forward", "backward", "sample")  # a training epoch's exchanges (the halo is set-up)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="dataset directory made by `sparse-dist prepare`")
    parser.add_argument("--epochs", type=at_least(1), default=200, help="epochs per configuration, >= 1 "
                        "(default: %(default)s)")
    parser.add_argument("--hidden", type=at_least(1), default=16, help="hidden width, >= 1 (default: %(default)s)")
    parser.add_argument("--layers", type=at_least(1), default=2, help="layers, >= 1 (default: %(default)s)")
    parser.add_argument("--dropout", type=probability, default=0.5,
                        help="dropout probability, in [0, 1) (default: %(default)s)")
    parser.add_argument("--seed", type=seed_number, default=0, help="seed, >= 0 (default: %(default)s)")
    parser.add_argument("--sancus-h-eps", type=non_negative, default=0.05,
                        help="variation-gap threshold of sancus-h, >= 0 (default: %(default)s)")
    parser.add_argument("--psc-budget", type=psc_budget, default=0.1,
                        help="psc's budget B (share of each row's neighbours kept in expectation), in (0, 1] "
                             "(default: %(default)s)")
    parser.add_argument("--threads", type=at_least(0), default=0,
                        help="torch threads per rank, >= 0 (default: 0 = cores / ranks)")
    parser.add_argument("--only", default=None,
                        help="comma-separated configuration names to run (default: all); exact p2p and "
                             "dense-bcast, the ratios' bases, always run")
    parser.add_argument("--target-acc", type=psc_budget, default=None, metavar="A",  # (0, 1] like a budget
                        help="validation accuracy in (0, 1] that tta_s times each configuration to (default: "
                             f"{DEFAULT_TARGET_FRACTION:g} x exact p2p's best in this run)")
    parser.add_argument("--overlap-evaluation", action="store_true",
                        help="evaluate each epoch's weights beside the next step, in turns, so the evaluation's "
                             "exchanges travel while the step computes (the same metrics; tta_s then reads each "
                             "epoch's accuracy at the end of the next step, the last epoch's after it)")
    parser.add_argument("--beta-gbs", type=positive, default=None, metavar="GBS",
                        help="the link's bandwidth in GB/s, as `sparse-dist bench network` measured it on the same "
                             "network: adds each row's ideal epoch (exact p2p's compute plus the row's own "
                             "exchange bytes over the link; pipe rows the larger of the two) and the ratio to it")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")


COMPRESSION_FORMATS = ("fp16", "bf16", "int8", "int8:stochastic")


def configurations(h_eps: float, psc_budget: float = 0.1) -> list[tuple[str, dict[str, str]]]:
    compressed = [(f"{fmt.replace(':stochastic', 's')}{suffix}", {"plan": "p2p", "compress": fmt + feedback})
                  for fmt in COMPRESSION_FORMATS for suffix, feedback in (("", ""), ("+fb", ",feedback"))]
    return [
        ("exact p2p", {"plan": "p2p"}),
        ("bns p=0.1", {"plan": "p2p", "sample": "bns:keep=0.1"}),
        ("bns p=0.01", {"plan": "p2p", "sample": "bns:keep=0.01"}),
        ("bns p=0", {"plan": "p2p", "sample": "bns:keep=0"}),
        ("dense-bcast", {"plan": "dense-bcast"}),
        ("sparse-bcast", {"plan": "sparse-bcast"}),
        ("sancus-e1", {"plan": "dense-bcast", "stale": "sancus-e:eps=1"}),
        ("sancus-a1", {"plan": "dense-bcast", "stale": "sancus-a:eps=1"}),
        (f"sancus-h{h_eps:g}", {"plan": "dense-bcast", "stale": f"sancus-h:eps={h_eps}"}),
        ("sancus-e1 -bwd", {"plan": "dense-bcast", "stale": "sancus-e:eps=1,skip_backward=1"}),
        ("p2p X/epoch", {"plan": "p2p", **CLASSIC}),
        ("dense X/epoch", {"plan": "dense-bcast", **CLASSIC}),
        ("pipe t1", {"plan": "p2p", "stale": "pipe:tau=1"}),
        ("pipe t1 g.95", {"plan": "p2p", "stale": "pipe:tau=1,gamma=0.95"}),
        ("pipe t2", {"plan": "p2p", "stale": "pipe:tau=2"}),
        (f"psc B{psc_budget:g}", {"plan": "p2p", "sample": f"psc:budget={psc_budget}"}),
        ("dgs R.5", {"plan": "p2p", "sample": "dgs:nodes=0.5,features=1"}),
        ("dgs R.25 Q.5", {"plan": "p2p", "sample": "dgs:nodes=0.25,features=0.5"}),
        *compressed,
    ]


CLASSIC = {"input_exchange": "per-epoch", "dropout_side": "owner"}
"""Layer 0 exchanging dropout(X) W every epoch, owner-side dropout: the path before the halo."""


def check_arguments(args: argparse.Namespace) -> str | None:
    names = [name for name, _ in configurations(args.sancus_h_eps, args.psc_budget)]
    unknown = [name for name in _selected(args) if name not in names]
    return f"--only: unknown configuration(s) {unknown}; expected names from {names}" if unknown else None


def _selected(args: argparse.Namespace) -> list[str]:
    if args.only is None:
        return [name for name, _ in configurations(args.sancus_h_eps, args.psc_budget)]
    return [name.strip() for name in args.only.split(",") if name.strip()]


def _run_one(comm: Communicator, args: argparse.Namespace, settings: dict[str, str]) -> dict[str, Any]:
    started = time.perf_counter()  # this configuration's "launch" (see the module docstring)
    graph = load_local_graph(comm, args.data, comm.size, 1)
    overlap = args.overlap_evaluation
    config = TrainConfig(hidden=args.hidden, layers=args.layers, dropout=args.dropout, seed=args.seed,
                         epochs=args.epochs, overlap_evaluation=overlap, **settings)
    trainer = Trainer(comm, graph, config)
    records, points, cpu = [], [], []
    for epoch in range(args.epochs):
        cpu_before = cpu_seconds()
        records.append(trainer.train_epoch(evaluation_follows=not overlap, evaluate_alongside=overlap and epoch > 0))
        cpu.append(cpu_since(cpu_before))  # the evaluation's too: run with the step, or in turns beside it
        if overlap and epoch > 0:  # the previous epoch's weights, evaluated beside this step
            points.append((epoch, time.perf_counter() - started, validation_value(records[-1]["evaluation"])))
        if not overlap or epoch == args.epochs - 1:
            value = validation_value(trainer.evaluate())  # collective: its allreduce waits for the slowest rank
            points.append((records[-1]["epoch"], time.perf_counter() - started, value))
    trainer.close()  # collective: pipelined flights still outstanding complete before the next configuration
    metrics = trainer.evaluate()
    halo = trainer.setup_bytes["halo"]["recv"]
    moved = halo + sum(r["bytes"][phase]["recv"] for r in records for phase in ("forward", "backward", "sample"))
    broadcasts = sum(len(b["active"]) for r in records for b in r["broadcasts"])
    timed = records[1:] or records
    link_bytes = statistics.mean(sum(max(r["bytes"][phase]["sent"], r["bytes"][phase]["recv"])
                                     for phase in EXCHANGE_PHASES) for r in timed)
    gathered = comm.allgather_object({"moved": moved, "halo": halo, "times": [r["time"] for r in records[1:] or records],
                                      "cpu": cpu[1:] or cpu, "cache": records[-1]["cache_bytes"],
                                      "link_bytes": link_bytes})
    alongside = [r["evaluation_seconds"] for r in records if "evaluation_seconds" in r]
    times = {key: statistics.median(max(g["times"][k][key] for g in gathered) for k in range(len(gathered[0]["times"])))
             for key in TIME_KEYS}
    cpu_medians = {key: statistics.median(max(g["cpu"][k][key] for g in gathered) for k in range(len(gathered[0]["cpu"])))
                   for key in ("user", "system")}
    return {"bytes": int(sum(g["moved"] for g in gathered)), "halo_bytes": int(sum(g["halo"] for g in gathered)),
            "input_exchange": trainer.input_exchange.mode, "receiver_dropout": trainer.receiver_dropout,
            "progress": trainer.progress_mode,
            "time": times, "cpu": cpu_medians, "test_acc": metrics["test_acc"],
            "link_bytes": max(g["link_bytes"] for g in gathered),
            "active_broadcasts": broadcasts, "cache_bytes_max": max(g["cache"] for g in gathered),
            "evaluation": "alongside" if overlap else "after",
            **({"evaluation_turns_s": statistics.median(alongside)} if alongside else {}),
            "curve": points, "best_val": max(p[2] for p in points), "wall_total": time.perf_counter() - started,
            **settings}


def add_time_to_target(results: dict[str, dict[str, Any]], target_acc: float | None) -> float:
    """Each row's ``time_to_target`` and ``target_epoch`` (rank 0's clock) at ``target_acc``, else at the
    default fraction of exact p2p's best validation accuracy; returns the target used."""
    target = target_acc if target_acc is not None else DEFAULT_TARGET_FRACTION * results["exact p2p"]["best_val"]
    for row in results.values():
        row["target_acc"] = target
        row["time_to_target"], row["target_epoch"] = first_reaching(row["curve"], target)
    return target


def add_ideal(results: dict[str, dict[str, Any]], beta_gbs: float) -> None:
    """Each row's ``ideal_s``: exact p2p's compute (its epoch less its seconds in the exchanges and the
    allreduce, own and waiting for late partners alike) plus the
    row's own exchange time on a link of ``beta_gbs`` GB/s; a pipe row overlaps them (the larger of the two).

    A row's link time is its slowest rank's bytes per epoch over the link, each phase counted once in the
    busier direction (links are full duplex). The ideal leaves out what the policy itself computes (codecs,
    sampling) and the CPU the network stack takes from compute: the ratio shows both.
    """
    exact = results["exact p2p"]["time"]
    compute = exact["total"] - sum(exact[key] for key in IN_MPI)
    for row in results.values():
        link = row["link_bytes"] / (beta_gbs * 1e9)
        rule = AxisSpec.parse("stale", str(row.get("stale", "none"))).build()
        row["ideal_s"] = max(compute, link) if rule is not None and rule.overlaps else compute + link
        row["to_ideal"] = row["time"]["total"] / row["ideal_s"]


def main(comm: Communicator, args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads or default_threads_per_rank())
    chosen = set(_selected(args)) | {"exact p2p", "dense-bcast"}
    results = {name: _run_one(comm, args, settings)
               for name, settings in configurations(args.sancus_h_eps, args.psc_budget) if name in chosen}
    if comm.rank == 0:
        target = add_time_to_target(results, args.target_acc)
        if args.beta_gbs is not None:
            add_ideal(results, args.beta_gbs)
        exact, dense = results["exact p2p"], results["dense-bcast"]
        print(f"policies on {args.data}: P={comm.size}, {args.epochs} epochs, GCN hidden {args.hidden}, "
              f"{args.layers} layers, dropout {args.dropout}, seed {args.seed}; tta_s: seconds from each "
              f"configuration's start to val_acc >= {target:.4f}"
              + ("" if args.target_acc is not None else f" ({DEFAULT_TARGET_FRACTION:g} x exact p2p's best)"))
        print(f"{'config':<15}{'exchange MB':>12}{'halo MB':>9}{'/p2p':>7}{'/dense':>8}{'epoch_s':>9}{'local':>8}"
              f"{'exch':>8}{'e_wait':>8}{'allred':>8}{'a_wait':>8}{'dense':>8}{'cpu_usr':>8}{'cpu_sys':>8}"
              f"{'t/p2p':>7}{'t/dense':>8}"
              f"{'test_acc':>9}{'tta_s':>8}" + (f"{'ideal_s':>8}{'/ideal':>7}" if args.beta_gbs is not None else ""))
        for name, r in results.items():
            t = r["time"]
            print(f"{name:<15}{r['bytes'] / 1e6:>12.2f}{r['halo_bytes'] / 1e6:>9.2f}{r['bytes'] / max(exact['bytes'], 1):>7.3f}"
                  f"{r['bytes'] / max(dense['bytes'], 1):>8.3f}{t['total']:>9.4f}{t['local_spmm']:>8.4f}"
                  f"{t['exchange']:>8.4f}{t['exchange_wait']:>8.4f}{t['allreduce']:>8.4f}"
                  f"{t['allreduce_wait']:>8.4f}{t['dense']:>8.4f}"
                  f"{r['cpu']['user']:>8.3f}{r['cpu']['system']:>8.3f}"
                  f"{t['total'] / exact['time']['total']:>7.2f}{t['total'] / dense['time']['total']:>8.2f}"
                  f"{r['test_acc']:>9.4f}"
                  + (f"{r['time_to_target']:>8.2f}" if r["time_to_target"] is not None else f"{'-':>8}")
                  + (f"{r['ideal_s']:>8.3f}{r['to_ideal']:>7.2f}" if args.beta_gbs is not None else ""))
        if args.json:
            print(json.dumps({"world_size": comm.size, "config": {k: v for k, v in vars(args).items()
                                                                  if k != "func"}, "results": results}))
    return 0
