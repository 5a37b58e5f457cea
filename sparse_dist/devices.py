"""Which device a rank computes on, and waiting for it: shared by every command that trains or benchmarks."""

from __future__ import annotations

import socket

import torch

from sparse_dist.comm import Communicator


def rank_device(comm: Communicator, name: str) -> torch.device:
    """This rank's device: ``cpu``, or ``cuda:(rank mod visible GPUs)`` (collective).

    Every rank checks ``torch.cuda.is_available()``; if any rank lacks CUDA,
    every rank raises the same error (naming the ranks) before any other
    collective work.
    """
    error = None
    if name == "cuda" and not torch.cuda.is_available():
        error = "--device cuda: no CUDA device is visible (torch.cuda.is_available() is False); use --device cpu"
    comm.raise_if_any(error, RuntimeError)
    if name == "cuda":
        return torch.device("cuda", comm.rank % torch.cuda.device_count())
    return torch.device("cpu")


def shared_gpu_note(comm: Communicator, device: torch.device) -> str | None:
    """A note when several ranks of this job compute on the same GPU (collective), else None."""
    where = comm.allgather_object((socket.gethostname(), str(device)) if device.type == "cuda" else None)
    counts: dict[tuple[str, str], int] = {}
    for key in where:
        if key is not None:
            counts[key] = counts.get(key, 0) + 1
    shared = {key: count for key, count in counts.items() if count > 1}
    if not shared:
        return None
    return "note: " + ", ".join(f"{count} ranks share {dev} on {host}" for (host, dev), count in shared.items()) \
        + " (their kernels and memory compete; per-rank times and memory are not one GPU's each)"


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels on ``device`` so a clock read after it counts them (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
