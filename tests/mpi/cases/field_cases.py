"""Exact evaluations from the receptive field each rank holds (``evaluation_plan="field"``) beside a sampled
p2p training.

One launch of 4 ranks runs every rank count on sub-communicators (ranks 0-1, 0-2, all four) and c = 2 on all four;
row groups are uneven and at P = 3 one is EMPTY. Graphs: a directed graph with isolated, in-only and out-only nodes
and Cora. GCN and SAGE with 3 layers (two pulls of ``Â``'s rows, then ``X``'s), layer 0 fetched once (the field
takes the halo's rows of ``X``) and exchanged every epoch (it pulls them all), training sampled with
``bns:keep=0.5``. Checks, in float64:

* the field's sets are the receptive field counted here from the whole graph's pattern, layer by layer
  (``S_L`` the own rows, ``S_l`` = ``S_{l+1}`` and its rows' columns), in the order the module promises;
* the evaluation's logits before training equal one process's exact forward (rtol 1e-9);
* training is the training plan's: every epoch's loss and forward/backward bytes, and the weights after the
  last epoch, bitwise those of the same run evaluated on its own plan;
* after training the field's logits equal that run's exchanged evaluation (rtol 1e-9) and so do its metrics,
  and so does the exact reference of the next step (the guard's bias signal and the audit read it from the
  field, with that step's dropout masks), layer by layer;
* an evaluation moves no forward or backward bytes, and the set-up's rows of ``Â`` and ``X`` are those counted here:
  16 bytes per entry (an int32 column and a float64 value), 8 per row length, and ``X``'s rows not in the
  static halo at the wire's width.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from case_report import finish  # noqa: E402
from evaluation_plan_cases import against_same_plan, same_evaluations_and_training  # noqa: E402

from algorithms.train import Trainer  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402


def expected_field(adjacency: sp.csr_matrix, lo: int, hi: int, layers: int) -> list[np.ndarray]:
    """Own rows, then each ring (ascending) of the receptive field of rows ``[lo, hi)``, from the pattern."""
    pattern = sp.csr_matrix(adjacency != 0)
    inside = np.zeros(pattern.shape[0], dtype=bool)
    inside[lo:hi] = True
    parts, frontier = [np.arange(lo, hi)], np.arange(lo, hi)
    for _ in range(layers):
        columns = np.unique(pattern[frontier].indices) if frontier.size else np.zeros(0, np.int64)
        ring = columns[~inside[columns]]
        inside[ring] = True
        parts.append(ring)
        frontier = ring
    return parts


def check(label: str, got: dict, same: dict, alone: dict, rows: slice, data: dict, layers: int,
          failures: list[str]) -> None:
    trainer = got["trainer"]
    field = trainer.field.field if trainer.field is not None else None
    if field is None or not trainer.field.takes_references:
        failures.append(f"{label}: the run holds no receptive field, or reads no references from it")
        return
    parts = expected_field(data["adjacency"], rows.start, rows.stop, layers)
    if not np.array_equal(field.ids, np.concatenate(parts)):
        failures.append(f"{label}: the field's rows differ from the receptive field counted from the graph")
    want_sizes = [int(sum(p.size for p in parts[: layers + 1 - level])) for level in range(layers + 1)]
    if field.sizes != want_sizes:
        failures.append(f"{label}: field sizes {field.sizes} != {want_sizes}")
    same_evaluations_and_training(label, got, same, alone, rows, failures)
    for phase in ("forward", "backward", "halo"):
        moved = got["eval_bytes"][phase]
        if moved["sent"] or moved["recv"]:
            failures.append(f"{label}: an evaluation moved {phase} bytes {moved}")
    # the field's set-up rows (phase halo) beyond the same run's (its static halo, if any), received by this rank
    whole = _normalized_rows(trainer)  # collective over the column: every rank of the cell calls it
    adjacency_rows = np.concatenate([np.zeros(0, np.int64), *parts[1:layers]])
    entries = int(np.diff(whole.indptr)[adjacency_rows].sum())
    halo_ids = trainer.halo.halo_ids if trainer.halo is not None else np.zeros(0, np.int64)
    pulled = np.setdiff1d(np.concatenate(parts[1:]), halo_ids).size
    row_bytes = data["features"].shape[1] * _wire_itemsize(trainer)
    peers = trainer.col_comm.size - 1  # each pull of Â's rows also sends one answer length per peer
    want = 16 * entries + 8 * adjacency_rows.size + 8 * peers * (layers - 1) + row_bytes * pulled
    counted = got["setup"]["halo"]["recv"] - same["setup"]["halo"]["recv"]
    if counted != want:
        failures.append(f"{label}: the field's set-up received {counted} bytes of rows, counted here {want}")


def _normalized_rows(trainer: Trainer) -> sp.csr_matrix:
    """The whole graph's normalised rows (what owners send): every row group's ``trainer.normalized`` (collective
    over the replica column)."""
    return sp.vstack(trainer.col_comm.allgather_object(trainer.normalized), format="csr")


def _wire_itemsize(trainer: Trainer) -> int:
    return torch.empty(0, dtype=trainer.wire_dtype).element_size() if trainer.wire_dtype is not None else 8


def main() -> int:
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    assert comm.size == 4, "field_cases.py runs on 4 ranks"
    layers = 3
    failures, runs = against_same_plan(comm, "field", lambda cell, got, same, failures: check(
        f"{cell.label} layers={layers}", got, same, cell.reference, cell.rows, cell.data, layers, failures),
        layers=layers)
    return finish(comm, failures, f"field evaluation cases ({runs} runs on this rank)")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
