"""How a torch tensor becomes an MPI buffer (see "Devices" in :mod:`sparse_dist.comm`).

CPU tensors go to MPI as numpy views; CUDA tensors as device buffers where the library is CUDA-aware,
else through host staging buffers (:class:`~sparse_dist.comm.staging.StagingPool`) with the copies on a
side stream. Local: nothing here talks to other ranks.
"""

from __future__ import annotations

from typing import Any

import torch

from sparse_dist.comm.requests import Pending
from sparse_dist.comm.staging import StagingPool, _Loan
from sparse_dist.comm.startup import MPI

_MPI_TYPES: dict[torch.dtype, Any] = {
    torch.float32: MPI.FLOAT,
    torch.float64: MPI.DOUBLE,
    torch.int32: MPI.INT32_T,
    torch.int64: MPI.INT64_T,
    torch.uint8: MPI.UINT8_T,
    torch.int8: MPI.INT8_T,
    torch.int16: MPI.INT16_T,
    torch.bool: MPI.C_BOOL,
}


def mpi_datatype(tensor: torch.Tensor) -> Any:
    """The MPI datatype of a contiguous tensor; clear errors for anything MPI cannot take."""
    if not tensor.is_contiguous():
        raise ValueError("MPI buffers must be contiguous tensors; call .contiguous() first")
    try:
        return _MPI_TYPES[tensor.dtype]
    except KeyError:
        raise TypeError(f"no MPI datatype for torch dtype {tensor.dtype}; "
                        f"supported: {sorted(str(d) for d in _MPI_TYPES)}") from None


class TensorBuffers:
    """One communicator's way of handing tensors to MPI: its settings, its staging pool, its copy streams."""

    def __init__(self, gpu_aware: bool, force_host_staging: bool, staging_pool: StagingPool) -> None:
        self.gpu_aware, self.force_host_staging, self.staging_pool = gpu_aware, force_host_staging, staging_pool
        self._side_streams: dict[int, Any] = {}

    def _side_stream(self, device: torch.device) -> Any:
        """The copy stream on ``device``, created on first use."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index not in self._side_streams:
            self._side_streams[index] = torch.cuda.Stream(device=index)
        return self._side_streams[index]

    def buffer(self, pending: Pending, tensor: torch.Tensor, *, reads: bool, writes_back: bool) -> tuple[Any, Any]:
        """A flat MPI buffer for ``tensor`` and its datatype.

        ``reads``: MPI reads the tensor's data (a send, an in-place or
        allreduce buffer); ``writes_back``: MPI's result must land in the
        tensor. Staged buffers are copied in now and back by ``pending``'s
        finishers.
        """
        mpi_type = mpi_datatype(tensor)
        flat = tensor.detach().view(-1)
        if tensor.is_cuda and self.gpu_aware:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(tensor.device))
            pending._ready.append(ready)  # MPI starts after the producer's queued kernels, not after the whole device
            pending._keep_alive.append(tensor)
            return flat, mpi_type
        if not tensor.is_cuda and not self.force_host_staging:
            pending._keep_alive.append(tensor)
            return flat.numpy(), mpi_type
        loan = self.staging_pool.acquire(flat.numel(), flat.dtype, pinned=tensor.is_cuda)
        pending._loans.append((self.staging_pool, loan))
        pending._keep_alive.append(tensor)
        pending._staged = True
        host = loan.tensor
        if tensor.is_cuda:
            self._stage_cuda(pending, flat, loan, reads=reads, writes_back=writes_back)
        else:
            if reads:
                host.copy_(flat)
            if writes_back:
                pending._finishers.append(lambda: flat.copy_(host))
        return host.numpy(), mpi_type

    def _stage_cuda(self, pending: Pending, flat: torch.Tensor, loan: _Loan, *, reads: bool,
                    writes_back: bool) -> None:
        """Queue the copies between a CUDA tensor and its pinned host buffer on the side stream."""
        host = loan.tensor
        side = self._side_stream(flat.device)
        if reads:
            produced = torch.cuda.Event()
            produced.record(torch.cuda.current_stream(flat.device))
            side.wait_event(produced)
            with torch.cuda.device(flat.device), torch.cuda.stream(side):
                host.copy_(flat, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(side)
            flat.record_stream(side)
            pending._ready.append(copied)
        if writes_back:
            def write_back() -> None:
                consumer = torch.cuda.current_stream(flat.device)
                side.wait_stream(consumer)  # after the consumer's queued work on this memory
                with torch.cuda.device(flat.device), torch.cuda.stream(side):
                    flat.copy_(host, non_blocking=True)
                done = torch.cuda.Event()
                done.record(side)
                consumer.wait_event(done)  # later kernels on the current stream see the data
                flat.record_stream(side)
                loan.copy_done = done      # the pool waits for it before lending the buffer again

            pending._finishers.append(write_back)
