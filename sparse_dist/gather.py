"""Fetch per-row values from their owners by global row id (request/response exchange).

Used where a rank needs a few values of rows it does not own (e.g. the
degrees of its neighbours for GCN normalisation) without anyone holding a
global vector: one alltoallv sends the requested ids to their owners, a
second returns the values. Collective over ``comm``; bytes are booked under
``phase`` (``other`` by default).
"""

from __future__ import annotations

import numpy as np
import torch

from sparse_dist.comm import Communicator
from sparse_dist.layout import RowLayout


def fetch_by_global_id(comm: Communicator, layout: RowLayout, wanted: np.ndarray, owned_values: np.ndarray,
                       phase: str = "other") -> np.ndarray:
    """Values (``float64``, 1-D) of the global rows ``wanted``, read from their owners.

    ``layout`` has one part per rank of ``comm`` and ``owned_values[k]`` is the
    value of this rank's ``k``-th row. Collective: every rank of ``comm`` calls
    it, each with its own ``wanted`` ids (possibly none).
    """
    if layout.parts != comm.size:
        raise ValueError(f"fetch_by_global_id: layout has {layout.parts} parts for {comm.size} ranks")
    wanted = np.asarray(wanted, dtype=np.int64)
    owners = layout.owner_of(wanted)
    order = np.argsort(owners, kind="stable")
    request_rows = np.bincount(owners, minlength=comm.size).astype(np.int64)
    incoming_rows = comm.allgather_array(request_rows, phase)[:, comm.rank]
    requests = torch.from_numpy(wanted[order])
    incoming = torch.empty(int(incoming_rows.sum()), dtype=torch.int64)
    comm.alltoallv(requests, request_rows.tolist(), incoming, incoming_rows.tolist(), phase)
    local_ids = incoming.numpy() - layout.offsets[comm.rank]
    answers = torch.from_numpy(np.ascontiguousarray(np.asarray(owned_values, dtype=np.float64)[local_ids]))
    replies = torch.empty(wanted.size, dtype=torch.float64)
    comm.alltoallv(answers, incoming_rows.tolist(), replies, request_rows.tolist(), phase)
    result = np.empty(wanted.size, dtype=np.float64)
    result[order] = replies.numpy()
    return result
