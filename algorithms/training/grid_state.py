"""The grid trainer's checkpoint state in the 1D trainer's form (:class:`GridCheckpointState`), so that a
checkpoint resumes across grids and between the grid and 1D plans.

The weights and Adam's moments live as blocks on the grid (``W[i, o]`` and ``b[o]`` of each layer on the rank at
``(o, i, d)``, :mod:`sparse_dist.grid_gcn`); a checkpoint holds them whole, as the 1D trainer's
(:func:`algorithms.training.state.replicated_state`). Writing gathers each block from one holder (depth 0, and
inner 0 for a bias) in one allreduce; reading cuts the whole tensors into this rank's blocks.

Collective: :meth:`GridCheckpointState.state` (one allreduce over every rank, phase ``other``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from algorithms.training import state as checkpoint_state
from sparse_dist.grid import roles


class GridCheckpointState:
    """Checkpoint state of :class:`~algorithms.training.grid_trainer.GridTrainer` (module docstring). Reads the
    trainer's ``model`` and ``optimizer`` (the whole tensors, the checkpoint's form), ``_cut`` and
    ``block_optimizer`` (the blocks and their moments), ``_cut_of``, ``grid``, ``comm``, ``dtype``, ``device``,
    ``config``, ``epoch``, ``meta``, ``nodes`` and ``guard``."""

    model: Any
    optimizer: Any
    block_optimizer: Any
    _cut: dict[tuple[int, str], torch.Tensor]
    grid: Any
    comm: Any
    dtype: torch.dtype
    device: torch.device
    config: Any
    epoch: int
    meta: dict[str, Any]
    nodes: int
    guard: Any
    _cut_of: Callable[[int, torch.Tensor], torch.Tensor]  # this rank's block of a layer's whole tensor

    def state(self) -> dict[str, Any]:
        """The replicated state in the 1D trainer's form (:func:`algorithms.training.state.replicated_state`):
        the whole weights and Adam moments gathered from the blocks into :attr:`model` and :attr:`optimizer`
        (collective: one allreduce over every rank, phase ``other``)."""
        self._gather_whole()
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "epoch": self.epoch,
                "torch_rng": torch.get_rng_state(), "config": self.config.fingerprint(),
                "graph": {"name": self.meta["name"], "nodes": self.nodes}, "written_at": self.written_at(),
                **self.guard.state_dict()}

    def _gather_whole(self) -> None:
        wholes = self._wholes()
        moments = bool(self.block_optimizer.state)  # the same on every rank: every block stepped alike
        sections = 3 if moments else 1
        sizes = [whole.numel() for _, whole in wholes]
        flat = torch.zeros(sections * sum(sizes), dtype=self.dtype, device=self.device)
        offset = 0
        for section in range(sections):
            for (key, whole), size in zip(wholes, sizes):
                block = self._cut[key] if section == 0 else self.block_optimizer.state[self._cut[key]][
                    ("exp_avg", "exp_avg_sq")[section - 1]]
                if self._writes(key, whole):
                    self._place(key, flat[offset:offset + size].view_as(whole), block.detach())
                offset += size
        self.comm.allreduce_(flat, "other")
        offset = 0
        with torch.no_grad():
            for section in range(sections):
                for (key, whole), size in zip(wholes, sizes):
                    values = flat[offset:offset + size].view_as(whole)
                    offset += size
                    if section == 0:
                        whole.copy_(values)
                        continue
                    state = self.optimizer.state.setdefault(whole, {})
                    state["step"] = self.block_optimizer.state[self._cut[key]]["step"].clone()
                    state[("exp_avg", "exp_avg_sq")[section - 1]] = values.clone()

    def _wholes(self) -> list[tuple[tuple[int, str], torch.nn.Parameter]]:
        return [((index, name), whole) for index, layer in enumerate(self.model.layers)
                for name, whole in layer.named_parameters()]

    def _writes(self, key: tuple[int, str], whole: torch.Tensor) -> bool:
        """Whether this rank writes its block of ``whole`` when gathering: one holder per block."""
        _, inner, depth = roles(key[0])
        return self.grid.coords[depth] == 0 and (whole.dim() == 2 or self.grid.coords[inner] == 0)

    def _place(self, key: tuple[int, str], into: torch.Tensor, block: torch.Tensor) -> None:
        outer, inner, _ = roles(key[0])
        if into.dim() == 2:
            (r0, r1), (c0, c1) = self.grid.block(into.shape[0], inner), self.grid.block(into.shape[1], outer)
            into[r0:r1, c0:c1] = block
        else:
            lo, hi = self.grid.block(into.shape[0], outer)
            into[lo:hi] = block

    def written_at(self) -> dict[str, Any]:
        return {"world_size": self.comm.size, "replication": 1, "plan": self.config.plan}

    def load_state(self, state: dict[str, Any]) -> None:
        """A checked 1D-form state into :attr:`model` and :attr:`optimizer`, then cut into the blocks and their
        moments (local)."""
        checkpoint_state.load_replicated_state(self, state)  # type: ignore[arg-type]
        self.block_optimizer.reset_moments()
        with torch.no_grad():
            for key, whole in self._wholes():
                block = self._cut[key]
                block.copy_(self._cut_of(key[0], whole.detach()))
                saved = self.optimizer.state.get(whole)
                if saved is not None:
                    self.block_optimizer.state[block] = {
                        "step": saved["step"].clone(),
                        "exp_avg": self._cut_of(key[0], saved["exp_avg"]).to(block.device, block.dtype),
                        "exp_avg_sq": self._cut_of(key[0], saved["exp_avg_sq"]).to(block.device, block.dtype)}


__all__ = ["GridCheckpointState"]
