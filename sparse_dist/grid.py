"""A process grid: ``P = X * Y * Z`` ranks, one sub-communicator per axis, and who owns which block.

The 3D algorithm of :mod:`sparse_dist.grid_gcn` (after Plexus, Ranjan et al., SC'25, and CAGNET's split-3D,
Tripathy et al., SC'20) splits every matrix of a layer over two axes of the grid and replicates it over the
third. Which axis splits what rotates with the layer, so that one layer's output is the next one's input
without a redistribution: layer ``l`` gives the axes the roles ``(outer, inner, depth)``

    l % 3 == 0: (x, y, z)     l % 3 == 1: (z, x, y)     l % 3 == 2: (y, z, x)

and then, with ``N`` nodes, input width ``F`` and output width ``F'``:

* ``A`` (``N x N``): rows split over ``depth``, columns over ``outer``; the block ``A[d, o]``;
* ``H`` (``N x F``, the layer's input): rows over ``outer``, columns over ``inner``; replicated over ``depth``;
* ``W`` (``F x F'``): rows over ``inner``, columns over ``outer``; replicated over ``depth``;
* the output (``N x F'``): rows over ``depth``, columns over ``outer``; replicated over ``inner``: the next
  layer's input, whose ``outer`` is this layer's ``depth`` and whose ``inner`` is this layer's ``outer``.

Blocks of a dimension of length ``n`` over an axis of size ``s`` are ``numpy.array_split``'s: the first
``n % s`` blocks one longer. A rank's place is ``rank = x + X * (y + Y * z)``.
1D is the grid ``P x 1 x 1`` only in its counting: its exchange is a halo, this grid's are allreduces.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparse_dist.comm import Communicator

AXES: tuple[str, str, str] = ("x", "y", "z")
ROTATION: tuple[tuple[str, str, str], ...] = (("x", "y", "z"), ("z", "x", "y"), ("y", "z", "x"))
"""``(outer, inner, depth)`` of layer ``l``: ``ROTATION[l % 3]``."""


@dataclass(frozen=True)
class GridShape:
    """``X x Y x Z`` ranks."""

    x: int
    y: int
    z: int

    @property
    def size(self) -> int:
        return self.x * self.y * self.z

    def of(self, axis: str) -> int:
        """Ranks along ``axis``."""
        return {"x": self.x, "y": self.y, "z": self.z}[axis]

    def __str__(self) -> str:
        return f"{self.x}x{self.y}x{self.z}"

    @classmethod
    def parse(cls, text: str, world_size: int) -> "GridShape":
        """``X,Y,Z`` (or ``XxYxZ``) with ``X * Y * Z`` equal to ``world_size``; a ValueError in one sentence."""
        pieces = text.replace("x", ",").split(",")
        try:
            values = [int(piece) for piece in pieces]
        except ValueError:
            values = []
        if len(values) != 3 or min(values) < 1:
            raise ValueError(f"--grid {text}: expected three positive integers X,Y,Z, e.g. 2,2,1")
        shape = cls(*values)
        if shape.size != world_size:
            raise ValueError(f"--grid {text}: X * Y * Z = {shape.size}, but the job has {world_size} ranks")
        return shape


def block_range(length: int, parts: int, index: int) -> tuple[int, int]:
    """``[lo, hi)`` of block ``index`` of ``length`` items in ``parts`` blocks (``numpy.array_split``'s)."""
    base, extra = divmod(length, parts)
    lo = index * base + min(index, extra)
    return lo, lo + base + (1 if index < extra else 0)


def roles(layer: int) -> tuple[str, str, str]:
    """``(outer, inner, depth)`` of ``layer`` (module docstring)."""
    return ROTATION[layer % 3]


class ProcessGrid:
    """This rank's place in the grid and a communicator per axis (built collectively over ``comm``).

    ``axis_comm[a]``: the ranks that differ from this one only in their coordinate along ``a`` (ordered by
    it), so an allreduce over it sums the blocks that axis split."""

    def __init__(self, comm: Communicator, shape: GridShape) -> None:
        if shape.size != comm.size:
            raise ValueError(f"a {shape} grid needs {shape.size} ranks, the communicator has {comm.size}")
        self.comm, self.shape = comm, shape
        rank = comm.rank
        self.coords = {"x": rank % shape.x, "y": (rank // shape.x) % shape.y, "z": rank // (shape.x * shape.y)}
        self.axis_comm: dict[str, Communicator] = {}
        for axis in AXES:  # every rank splits along every axis, in the same order
            others = tuple(self.coords[a] for a in AXES if a != axis)
            color = others[0] * max(shape.x, shape.y, shape.z) + others[1]
            self.axis_comm[axis] = comm.split(color, self.coords[axis])

    def block(self, length: int, axis: str) -> tuple[int, int]:
        """This rank's ``[lo, hi)`` of a dimension of ``length`` split over ``axis``."""
        return block_range(length, self.shape.of(axis), self.coords[axis])

    def free(self) -> None:
        """Release the axis communicators (collective)."""
        for axis in AXES:
            self.axis_comm[axis].free()
