"""The one pull (sparse_dist/pull.py) under mpiexec, on an uneven layout with an EMPTY part (P >= 3):

* dense rows: a matrix of 37 rows (2-D float32 and 1-D float64) read by global id, with repeats, own rows and
  a rank that asks nothing, equal the global matrix's rows bitwise, in the asked order;
* segments: three segments in one pull give, segment after segment, what three pulls give;
* ragged answers: each owner answers the ids it was asked with a computed int64 buffer of its own length;
* agreed counts: with ``answered`` given no counts travel, requests and answers booked under two phases;
* bytes: every pull's counted bytes per phase equal :func:`predict_pull_bytes` and an independent figure
  written here from every rank's requests (gathered), on every rank.

Rank 0 prints ``PULL P=.. pulls=.. mismatches=0``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from case_report import finish  # noqa: E402

from sparse_dist.comm import run_or_abort, world  # noqa: E402
from sparse_dist.layout import RowLayout  # noqa: E402
from sparse_dist.pull import Pull, PullTraffic, predict_pull_bytes  # noqa: E402

COUNTS = {1: [37], 2: [20, 17], 3: [11, 0, 26], 4: [9, 13, 0, 15]}
N, F = 37, 5


def moved(comm, before: dict, phase: str) -> dict[str, int]:
    after = comm.stats.snapshot()[phase]
    return {"sent": int(after["bytes_sent"] - before[phase]["bytes_sent"]),
            "recv": int(after["bytes_recv"] - before[phase]["bytes_recv"])}


def independent(comm, asked: list[np.ndarray], segments: int, id_bytes: int, answer_bytes) -> dict[str, int]:
    """What a pull moves on this rank, from every rank's requests: ``asked[q]`` the ids asked of rank ``q``;
    ``answer_bytes(ids)`` the bytes of the answer to ``ids``."""
    everyone = comm.allgather_object(asked)
    me = comm.rank
    sent = recv = 0
    for q in range(comm.size):
        if q == me:
            continue
        mine, theirs = everyone[me][q], everyone[q][me]
        sent += 8 * segments + id_bytes * mine.size + answer_bytes(theirs)
        recv += 8 * segments + id_bytes * theirs.size + answer_bytes(mine)
    return {"sent": sent, "recv": recv}


def wanted_ids(rng: np.random.Generator, rank: int) -> np.ndarray:
    if rank == 1:
        return np.zeros(0, dtype=np.int64)  # a rank that asks nothing (the empty part at P = 3, 4)
    return rng.integers(0, N, size=int(rng.integers(1, 30))).astype(np.int64)  # repeats and own rows included


def check_dense(comm, layout: RowLayout, failures: list[str]) -> int:
    rng = np.random.default_rng(11 + comm.rank)
    lo, hi = layout.row_range(comm.rank)
    pulls = 0
    whole2 = torch.arange(N * F, dtype=torch.float32).reshape(N, F) / 7
    whole1 = torch.from_numpy(np.sqrt(np.arange(N, dtype=np.float64) + 0.5))
    for whole in (whole2, whole1):
        segments = [wanted_ids(rng, comm.rank) for _ in range(3)]
        row_bytes = int(whole[0].numel() * whole.element_size())
        alone = []
        for ids in segments:
            before = comm.stats.snapshot()
            pull = Pull(comm, layout, ids, "fetch")
            rows = pull.rows(whole[lo:hi].contiguous())
            pulls += 1
            alone.append(rows)
            if not torch.equal(rows, whole[torch.from_numpy(ids)]):
                failures.append(f"dense P={comm.size}: rows differ from the matrix's")
            got = moved(comm, before, "fetch")
            want = independent(comm, pull.requests, 1, 8, lambda x: row_bytes * x.size)
            library = predict_pull_bytes(pull.traffic(row_bytes), comm.rank)
            if not got == want == library:
                failures.append(f"dense P={comm.size}: counted {got}, independent {want}, library {library}")
        before = comm.stats.snapshot()
        pull = Pull(comm, layout, segments, "fetch")
        together = pull.rows(whole[lo:hi].contiguous())
        pulls += 1
        if not torch.equal(together, torch.cat(alone)):
            failures.append(f"segments P={comm.size}: one pull of 3 segments differs from 3 pulls")
        got = moved(comm, before, "fetch")
        want = independent(comm, pull.requests, 3, 8, lambda x: row_bytes * x.size)
        if not got == want == predict_pull_bytes(pull.traffic(row_bytes), comm.rank):
            failures.append(f"segments P={comm.size}: counted {got}, independent {want}")
    return pulls


def answer_of(ids: np.ndarray) -> np.ndarray:
    """A computed answer of any length: per id its square, then the ids' sum, once per answer."""
    return np.concatenate([ids * ids, [int(ids.sum())]]).astype(np.int64)


def check_ragged(comm, layout: RowLayout, failures: list[str]) -> None:
    rng = np.random.default_rng(5 + comm.rank)
    segments = [wanted_ids(rng, comm.rank) for _ in range(2)]
    before = comm.stats.snapshot()
    pull = Pull(comm, layout, segments, "sample")
    replies = pull.answers([answer_of(np.concatenate(parts)) for parts in pull.incoming])
    for q, reply in enumerate(replies):
        if not np.array_equal(reply, answer_of(np.concatenate(pull.asked[q]))):
            failures.append(f"ragged P={comm.size}: rank {q}'s answer is not its answer to what was asked")
    got = moved(comm, before, "sample")
    want = independent(comm, pull.requests, 2, 8, lambda x: 8 + 8 * (x.size + 1))
    words_in = [8 * reply.size for reply in replies]
    words_out = [8 * answer_of(np.concatenate(parts)).size for parts in pull.incoming]
    library = predict_pull_bytes(PullTraffic(pull.asked_counts, pull.answered_counts, words_in, words_out, 2,
                                             ragged=True), comm.rank)
    if not got == want == library:
        failures.append(f"ragged P={comm.size}: counted {got}, independent {want}, library {library}")


def check_agreed(comm, layout: RowLayout, failures: list[str]) -> None:
    """``answered`` given: no counts travel; the ids under ``other``, the rows under ``halo``."""
    rng = np.random.default_rng(9 + comm.rank)
    ids = np.unique(wanted_ids(rng, comm.rank))
    lo, hi = layout.row_range(comm.rank)
    asked = np.bincount(layout.owner_of(ids), minlength=comm.size).astype(np.int64)
    answered = comm.allgather_array(asked)[:, comm.rank]  # agreed beforehand, as DistCSR agrees boundary counts
    whole = torch.arange(N * F, dtype=torch.float64).reshape(N, F)
    before = comm.stats.snapshot()
    pull = Pull(comm, layout, ids, "halo", request_phase="other", answered=answered)
    rows = pull.rows(whole[lo:hi].contiguous())
    if not torch.equal(rows, whole[torch.from_numpy(ids)]):
        failures.append(f"agreed P={comm.size}: rows differ from the matrix's")
    counted = {phase: moved(comm, before, phase) for phase in ("other", "halo")}  # before the checks' gathers
    traffic = pull.traffic(F * 8)
    for phase, want, library in (("other", independent(comm, pull.requests, 0, 8, lambda x: 0),
                                  traffic.request_bytes(comm.rank)),
                                 ("halo", independent(comm, pull.requests, 0, 0, lambda x: F * 8 * x.size),
                                  traffic.answer_bytes(comm.rank))):
        got = counted[phase]
        if not got == want == library:
            failures.append(f"agreed P={comm.size} {phase}: counted {got}, independent {want}, library {library}")


def main() -> int:
    torch.set_num_threads(1)
    comm = world(gpu_aware="off")
    layout = RowLayout.from_counts(COUNTS[comm.size])
    failures: list[str] = []
    pulls = check_dense(comm, layout, failures)
    check_ragged(comm, layout, failures)
    check_agreed(comm, layout, failures)
    try:
        Pull(comm, RowLayout.from_counts([N] + [0] * comm.size), np.zeros(0, np.int64), "other")
        failures.append("a layout with a part more than ranks was not refused")
    except ValueError as exc:
        if "one layout part per rank" not in str(exc):
            failures.append(f"the refusal says {exc}")
    if comm.rank == 0:
        print(f"PULL P={comm.size} pulls={pulls + 2} mismatches={len(failures)}", flush=True)
    return finish(comm, failures, f"pull cases P={comm.size}")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
