"""What a mini-batch run adds to :class:`algorithms.train.TrainConfig`: fanouts, batch size, cache, prefetch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparse_dist.sampling import SAMPLERS, resolve_sampler

__all__ = ["MinibatchConfig", "parse_fanouts"]


def parse_fanouts(text: str) -> tuple[int | None, ...]:
    """``"15,10,5"`` or ``"all,all"``: one fanout per hop from the seeds, each an integer >= 1 or ``all``.

    ``ValueError`` naming the bad entry otherwise.
    """
    fanouts: list[int | None] = []
    for entry in text.split(","):
        entry = entry.strip().lower()
        if entry == "all":
            fanouts.append(None)
            continue
        try:
            value = int(entry)
        except ValueError:
            value = 0
        if value < 1 or str(value) != entry:
            raise ValueError(f"fanouts are integers >= 1 or 'all', separated by commas (e.g. 15,10,5); "
                             f"got {entry!r} in {text!r}")
        fanouts.append(value)
    return tuple(fanouts)


@dataclass(frozen=True)
class MinibatchConfig:
    """Mini-batch settings (docs/guide/minibatch.md).

    ``fanouts[h]``: neighbours kept per node on hop ``h`` from the seeds (``fanouts[0]`` builds the last
    layer's block, as PyG's ``NeighborLoader`` counts), None = all; one per layer. ``batch_size``: seeds
    per rank per step, so a global batch holds ``P * batch_size`` training nodes. ``feature_cache``: remote
    input rows each rank keeps. ``prefetch``: batches sampled and fetched ahead (0: none).
    ``sample_batches``: batches sampled together, one request round per hop for all of them (1: each alone).
    ``sampler``: the sampling kernel, ``auto`` (numba where it imports, else numpy), ``numba`` or ``numpy``
    (:mod:`sparse_dist.sampling`); both draw the same blocks, bitwise.
    """

    fanouts: tuple[int | None, ...]
    batch_size: int
    feature_cache: int = 0
    prefetch: int = 0
    sample_batches: int = 1
    sampler: str = "auto"

    def __post_init__(self) -> None:
        if not self.fanouts:
            raise ValueError("mini-batch training needs at least one fanout")
        if self.batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {self.batch_size}")
        if self.sample_batches < 1:
            raise ValueError(f"sample batches must be >= 1, got {self.sample_batches}")
        if self.feature_cache < 0 or self.prefetch < 0:
            raise ValueError(f"feature cache and prefetch must be >= 0, got {self.feature_cache}, {self.prefetch}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")

    def fingerprint(self, world_size: int) -> dict[str, Any]:
        """What a checkpoint of a mini-batch run must agree with on resume: the mode, the fanouts and the
        GLOBAL batch size ``P * batch_size`` (batches are cut from one permutation by it, so the same global
        batch resumes at another ``P``). Cache, prefetch, bulk sampling and the sampling kernel change no
        result: not included."""
        return {"mode": "minibatch", "fanouts": ["all" if f is None else f for f in self.fanouts],
                "global_batch_size": world_size * self.batch_size}

    def record(self) -> dict[str, Any]:
        """Plain JSON values for the results file's ``config`` record (``sampler``: the kernel that runs)."""
        return {"mode": "minibatch", "fanouts": ["all" if f is None else f for f in self.fanouts],
                "batch_size": self.batch_size, "feature_cache": self.feature_cache, "prefetch": self.prefetch,
                "sample_batches": self.sample_batches, "sampler": resolve_sampler(self.sampler)}
