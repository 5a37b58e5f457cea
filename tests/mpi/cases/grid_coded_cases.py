"""The grid's coded allreduce (sparse_dist.grid_links.coded_allreduce) under mpiexec, against a single-process
simulation of what it specifies.

Every rank draws its own ``r x w`` rows from a seed of its rank; all ranks' inputs are gathered, and rank by rank
the simulation here computes what the documented algorithm gives, with the codec's own encode and decode and no
communication: owner ``j``'s chunk is its own rows plus, in rank order, the decoded code of every other rank's
rows (each rank codes its non-owned rows as one message, so stochastic rounding draws as it does), and every rank
ends with the decoded code of each owner's sum. Checked on every rank, for fp16, bf16, int8, int4 with stochastic
rounding and int2, over shapes whose rows do not divide by the ranks and shapes with fewer rows than ranks (empty
chunks):

* the result equals the simulation exactly (the same bits), so every rank along the axis holds the same values;
* the bytes sent and received equal ``coded_allreduce_bytes`` (and so are below the exact allreduce's where the
  code is narrower than the values);
* with error feedback (int2), the mean of 24 repeated allreduces of the same rows is at least 4x closer to the exact
  sum than one allreduce without feedback (the residuals carry each round's error into the next);
* on a communicator of one rank nothing is coded or sent;
* through GridLinks, the weights' gradient (``weight_gradient``) stays exact while a coded message does not.

Run: ``mpiexec -n P python tests/mpi/cases/grid_coded_cases.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "support"))
from case_report import finish  # noqa: E402

from sparse_dist.comm import run_or_abort, world  # noqa: E402
from sparse_dist.compress import Codec  # noqa: E402
from sparse_dist.grid import GridShape, ProcessGrid, block_range  # noqa: E402
from sparse_dist.grid_links import GridLinks, coded_allreduce, coded_allreduce_bytes, pieces_bytes  # noqa: E402

CODECS = ("fp16", "bf16", "int8", "int4:stochastic", "int2")
SHAPES = ((37, 6), (3, 5), (64, 16))
KEY, SEED_KEY = (0, "rows", "aggregation"), (7, 0, 0)


def rows_of(rank: int, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * rank + rows * width)
    return torch.randn(rows, width, generator=generator, dtype=torch.float64).to(dtype)


def simulated(inputs: list[torch.Tensor], codec: Codec) -> torch.Tensor:
    """The documented algorithm's result on one process (no feedback); rank ``k``'s stochastic streams are
    ``(*SEED_KEY, k, stage)``."""
    size, (rows, width), dtype = len(inputs), inputs[0].shape, inputs[0].dtype
    if size == 1:  # an axis of one rank: nothing to sum, nothing coded
        return inputs[0].clone()
    spans = [block_range(rows, size, j) for j in range(size)]
    decoded_rows = []  # each sender's foreign rows, coded as one message and decoded, in row order
    for sender, x in enumerate(inputs):
        lo, hi = spans[sender]
        foreign = torch.cat([x[:lo], x[hi:]])
        decoded = codec.decode(codec.encode(foreign, (*SEED_KEY, sender, 0)), width, dtype)
        back = torch.empty_like(x)
        back[:lo], back[hi:] = decoded[:lo], decoded[lo:]
        decoded_rows.append(back)
    out = torch.empty(rows, width, dtype=dtype)
    for owner, (lo, hi) in enumerate(spans):
        if hi == lo:
            continue
        others = torch.stack([decoded_rows[k][lo:hi] for k in range(size) if k != owner])
        summed = inputs[owner][lo:hi] + others.sum(dim=0)
        out[lo:hi] = codec.decode(codec.encode(summed, (*SEED_KEY, owner, 1)), width, dtype)
    return out


def check_against_simulation(comm, failures: list[str]) -> None:
    for text in CODECS:
        for rows, width in SHAPES:
            for dtype in (torch.float32, torch.float64):
                codec = Codec.parse(text, seed=3)
                assert codec is not None
                mine = rows_of(comm.rank, rows, width, dtype)
                inputs = [rows_of(k, rows, width, dtype) for k in range(comm.size)]
                seed_key = (*SEED_KEY, comm.rank)  # as GridLinks: the sender's rank last
                want = simulated(inputs, codec)
                comm.stats.reset()
                got = mine.clone()
                coded_allreduce(comm, got, codec, KEY, "forward", seed_key)
                where = f"{text} {rows}x{width} {dtype} rank {comm.rank} of {comm.size}"
                if not torch.equal(got, want):
                    failures.append(f"{where}: differs from the simulation by {float((got - want).abs().max())}")
                predicted = coded_allreduce_bytes(rows, comm.size, comm.rank, codec.row_bytes(width))
                counted = comm.stats.phases["forward"]
                if (counted.bytes_sent, counted.bytes_recv) != (predicted, predicted):
                    failures.append(f"{where}: sent/received {counted.bytes_sent}/{counted.bytes_recv} bytes, "
                                    f"predicted {predicted}")
                exact_bytes = pieces_bytes(rows * width, comm.size, comm.rank, mine.element_size())
                if comm.size > 1 and codec.row_bytes(width) < width * mine.element_size() and rows >= comm.size and \
                        predicted >= exact_bytes:
                    failures.append(f"{where}: coded {predicted} bytes not below the exact allreduce's {exact_bytes}")


def check_feedback(comm, failures: list[str]) -> None:
    rows, width = 40, 12
    mine = rows_of(comm.rank, rows, width, torch.float64)
    exact = mine.clone()
    comm.allreduce_(exact, "other")
    errors = {}
    for text in ("int2", "int2,feedback"):
        codec = Codec.parse(text)
        assert codec is not None
        results = []
        for _ in range(24):
            got = mine.clone()
            coded_allreduce(comm, got, codec, KEY, "forward", (*SEED_KEY, comm.rank))
            results.append(got)
        first, mean = results[0], torch.stack(results).mean(dim=0)
        errors[text] = float((first - exact).abs().max()), float((mean - exact).abs().max())
        if codec.feedback and not codec.residuals:
            failures.append(f"rank {comm.rank}: feedback kept no residuals")
    one_round = errors["int2"][0]
    if not errors["int2,feedback"][1] * 4 <= one_round:
        failures.append(f"rank {comm.rank}: with feedback the mean of 24 rounds is {errors['int2,feedback'][1]:.3g} "
                        f"from exact, one round without it {one_round:.3g}: not 4x closer")


def check_links(comm, failures: list[str]) -> None:
    """One rank's axis codes nothing; the weights' gradient stays exact through GridLinks."""
    grid = ProcessGrid(comm, GridShape(comm.size, 1, 1))
    codec = Codec.parse("int2")
    mine = rows_of(comm.rank, 9, 7, torch.float64)
    exact = mine.clone()
    comm.allreduce_(exact, "other")
    links = GridLinks(grid, 1, codec, epoch=3)
    comm.stats.reset()
    alone = mine.clone()
    links.allreduce(alone, "y", "forward", "aggregation")  # the y axis has one rank
    if not torch.equal(alone, mine) or comm.stats.phases["forward"].bytes_sent:
        failures.append(f"rank {comm.rank}: an axis of one rank changed the rows or sent bytes")
    gradient = mine.clone()
    links.allreduce(gradient, "x", "grad_allreduce", "weight_gradient")
    if not torch.allclose(gradient, exact, rtol=1e-14, atol=1e-14):
        failures.append(f"rank {comm.rank}: the weights' gradient was not summed exactly")
    coded = mine.clone()
    links.allreduce(coded, "x", "forward", "combination")
    if comm.size > 1 and torch.allclose(coded, exact, rtol=1e-6, atol=1e-6):
        failures.append(f"rank {comm.rank}: an int2-coded combination came out exact")
    grid.free()


def main() -> int:
    comm = world()
    failures: list[str] = []
    check_against_simulation(comm, failures)
    if comm.size > 1:  # one rank sums nothing: nothing to code, nothing to feed back
        check_feedback(comm, failures)
    check_links(comm, failures)
    return finish(comm, failures, f"coded allreduce on {comm.size} ranks")


if __name__ == "__main__":
    sys.exit(run_or_abort(main))
