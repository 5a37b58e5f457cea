"""The receptive field of a rank's own rows, held by the rank: an exact forward of ``L`` layers with no exchange.

An exact evaluation forward exchanges every layer's boundary rows, every time, because the weights change between
evaluations. But what those rows are computed FROM does not change: the rows of ``Â`` and of ``X``. A rank that
holds, once, every row of ``Â`` and ``X`` its own rows' ``L``-layer outputs depend on computes those outputs
alone, with the replicated weights: the exchange is traded for repeated compute on the field's outer rings
(Sancus/DistGNN-style redundancy, applied to evaluation only). Whether that pays is a matter of the link: over a
slow one an evaluation's bytes take longer than computing the field (docs/guide/plans.md, "Evaluations from the
receptive field").

The sets, from the output down (``S_l``: the rows whose layer-``l`` input the forward reads):

* ``S_L`` = this rank's own rows (every split's, so the logits are the same as an exact forward's);
* ``S_l`` = ``S_{l+1}`` and every column of ``Â``'s rows ``S_{l+1}`` (``Â`` holds self-loops for GCN; for
  SAGE's ``D^-1 A`` the union keeps the self term's rows).

Rows are ordered own rows first (global id order), then each ring ``S_l \\ S_{l+1}`` (``l`` from ``L-1`` down to
``0``) in ascending global id, so every ``S_l`` is a prefix of the order and layer ``l``'s operator is the first
``|S_{l+1}|`` held rows of ``Â`` with their columns numbered in that order (``|S_{l+1}| x |S_l|``, own rows
first: a layer's self term reads the first rows of its input, :meth:`ExchangeContext.self_rows`).

Set-up (collective over the replica column, ``L - 1`` pulls of ``Â``'s rows and one of ``X``'s, every rank in
the same order even where its ring is empty): rows of ``Â`` travel packed, one entry as its column (``int32``
where the graph has fewer than 2^31 nodes) and its value in the run's dtype, which is what the local operators
hold (an owner's float64 value cast as the receiver would cast it: the same bits); rows of ``X`` in the narrowest
dtype that holds them bitwise where the caller gives one (:mod:`sparse_dist.lossless_wire`), and none that the
caller already holds (the static input's halo). Requests book under phase ``other``, rows under ``halo``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from sparse_dist.comm import Communicator
from sparse_dist.csr import csr_bytes, distinct_ids, torch_csr
from sparse_dist.fetch import FeatureFetcher
from sparse_dist.layout import RowLayout
from sparse_dist.lossless_wire import WireRows
from sparse_dist.products import BlockProducts
from sparse_dist.pull import Pull

__all__ = ["ReceptiveField", "entry_format"]


def entry_format(n_rows: int, dtype: torch.dtype) -> np.dtype:
    """How one stored entry of ``Â`` travels: its column and its value in the run's ``dtype``, padded to whole
    int64 words (a pull's answers are int64): 8 bytes for float32 on a graph under 2^31 nodes, else 16."""
    index = np.int32 if n_rows < 2**31 else np.int64
    value = {torch.float32: np.float32, torch.float64: np.float64}[dtype]
    size = np.dtype(index).itemsize + np.dtype(value).itemsize
    return np.dtype({"names": ["column", "value"], "formats": [index, value],
                     "offsets": [0, np.dtype(index).itemsize], "itemsize": -(-size // 8) * 8})


class ReceptiveField:
    """This rank's field (module docstring): ``sizes[l] = |S_l|`` for ``l = 0..L`` (``sizes[L]`` its own rows),
    the held rows' global ids in order (``ids``), layer ``l``'s operator (:meth:`operator`) and ``S_0``'s input
    rows (``inputs``, ``sizes[0] x F``)."""

    def __init__(self, comm: Communicator, layout: RowLayout, group: int, rows: sp.csr_matrix, layers: int,
                 own_inputs: torch.Tensor, products: BlockProducts, *,
                 held: tuple[np.ndarray, torch.Tensor] | None = None, wire: WireRows | None = None) -> None:
        """Gather the field (collective over ``comm``, the replica column: ``layout.parts == comm.size``).

        ``rows``: this row group's rows of ``Â`` (global column ids, float64 CSR); ``own_inputs``: its rows of
        layer 0's input (``n_g x F``, the run's dtype and device); ``held``: global ids (ascending) and rows of the
        input this rank holds already (the static input's halo), taken from there instead of pulled; ``wire``:
        ``own_inputs``' rows as they travel (else they travel as they are).
        """
        if layers < 1:
            raise ValueError(f"a receptive field needs at least one layer, got {layers}")
        self.products = products
        dtype, n_rows = products.dtype, layout.n_rows
        self.format = entry_format(n_rows, dtype)
        lo, hi = layout.row_range(group)
        own = sp.csr_matrix(rows)
        chunks = [own]  # rows of Â held, in the order of ``ids``: own rows, then each ring but the last
        rings: list[np.ndarray] = []
        member = np.zeros(n_rows, dtype=bool)  # S_{l+1}
        member[lo:hi] = True
        latest = own  # the rows whose columns make the next ring
        for step in range(layers):
            columns = distinct_ids(latest.indices, n_rows).astype(np.int64)
            ring = columns[~member[columns]]  # ascending
            rings.append(ring)
            member[ring] = True
            if step < layers - 1:  # the outermost ring's rows of Â are never read
                latest = self._pull_rows(comm, layout, ring, own, lo)
                chunks.append(latest)
        del member
        self.ids = np.concatenate([np.arange(lo, hi, dtype=np.int64), *rings])
        self.sizes = [hi - lo + sum(r.size for r in rings[:layers - level]) for level in range(layers + 1)]
        # layer 0's input rows in field order: own rows in place, the halo's from the caller, the rest pulled
        kept_rows = held if held is not None else (np.zeros(0, np.int64), own_inputs[:0])
        self.inputs = FeatureFetcher(comm, layout, group, own_inputs, phase="halo", wire=wire, held=kept_rows,
                                     request_phase="other").fetch(self.ids)
        held_rows = sp.vstack(chunks, format="csr") if len(chunks) > 1 else own
        index = np.int32 if self.ids.size < 2**31 else np.int64
        kept = sp.csr_matrix((held_rows.data.astype(self.format["value"]),
                              _positions(self.ids, held_rows.indices, n_rows).astype(index, copy=False),
                              held_rows.indptr), shape=(held_rows.shape[0], int(self.ids.size)))
        del held_rows, chunks
        # every layer's operator made now, the held rows then let go: an operator is its own copy of its rows
        self._operators = {layer: self._operator_of(kept, layer) for layer in range(layers)}

    def _pull_rows(self, comm: Communicator, layout: RowLayout, wanted: np.ndarray, own: sp.csr_matrix,
                   lo: int) -> sp.csr_matrix:
        """Rows ``wanted`` (ascending global ids) of ``Â`` from their owners, values in the run's dtype
        (collective: one pull; this rank answers what others ask of its ``own`` rows)."""
        pull = Pull(comm, layout, wanted, "halo", request_phase="other")
        replies, lengths = [], []
        for parts in pull.incoming:
            asked = np.concatenate(parts) - lo
            block = own[asked]
            entries = np.zeros(block.nnz, dtype=self.format)
            entries["column"], entries["value"] = block.indices, block.data
            reply = np.concatenate([np.diff(block.indptr).astype(np.int64), entries.view(np.int64)])
            replies.append(reply)
            lengths.append(reply.size)
        answers = pull.packed_answers(np.concatenate(replies + [np.zeros(0, np.int64)]), lengths)
        counts, columns, values = [], [], []
        for q, answer in enumerate(answers):  # owners in rank order: the ids come back ascending
            asked = int(sum(part.size for part in pull.asked[q]))
            entries = np.ascontiguousarray(answer[asked:]).view(self.format)
            counts.append(answer[:asked])
            columns.append(entries["column"].astype(np.int64))
            values.append(entries["value"])
        indptr = np.concatenate(([0], np.cumsum(np.concatenate(counts + [np.zeros(0, np.int64)]))))
        return sp.csr_matrix((np.concatenate(values + [np.zeros(0, self.format["value"])]),
                              np.concatenate(columns + [np.zeros(0, np.int64)]), indptr),
                             shape=(wanted.size, layout.n_rows))

    def _operator_of(self, kept: sp.csr_matrix, layer: int) -> torch.Tensor:
        """Layer ``layer``'s ``Â`` over the field from the held rows ``kept`` (their first ``sizes[layer + 1]``)."""
        rows, width = self.sizes[layer + 1], self.sizes[layer]
        indptr = kept.indptr[: rows + 1]
        block = sp.csr_matrix((kept.data[: indptr[-1]], kept.indices[: indptr[-1]], indptr), shape=(rows, width))
        return torch_csr(block, self.products.dtype, self.products.device)

    def operator(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s ``Â`` over the field (CSR, ``sizes[layer + 1] x sizes[layer]``)."""
        if layer not in self._operators:
            raise ValueError(f"layer {layer}'s operator over the receptive field was let go (drop_inputs)")
        return self._operators[layer]

    def multiply(self, layer: int, h: torch.Tensor) -> torch.Tensor:
        """``Â h`` of layer ``layer`` over the field (``sizes[layer] x F`` in, ``sizes[layer + 1] x F`` out; local)."""
        if h.shape[0] != self.sizes[layer]:
            raise ValueError(f"layer {layer} over the receptive field takes {self.sizes[layer]} rows, got "
                             f"{h.shape[0]}")
        return self.products.product(self.operator(layer), h.contiguous())

    def drop_inputs(self) -> None:
        """Forget ``inputs`` and layer 0's operator (a caller that keeps layer 0's product instead)."""
        self.inputs = self.inputs.new_empty((0, self.inputs.shape[1]))
        self._operators.pop(0, None)

    def memory(self) -> dict[str, int]:
        """What holding the field costs this rank: its rows beyond its own, and bytes of its inputs and of its
        layers' operators (each its own copy of its rows of ``Â``)."""
        return {"field_rows": int(self.ids.size - self.sizes[-1]),
                "input_bytes": self.inputs.numel() * self.inputs.element_size(),
                "matrix_bytes": sum(csr_bytes(m) for m in self._operators.values())}


def _positions(ids: np.ndarray, columns: np.ndarray, n_rows: int) -> np.ndarray:
    """Each of ``columns``' (global ids, all in ``ids``) position in ``ids`` (distinct, any order): from a dense
    map where ``n_rows`` is at most four times ``ids``' size (6M columns of the 200k-node graph: 0.46 s -> 0.03
    s), else by a sort."""
    if n_rows <= 4 * ids.size:
        where = np.empty(n_rows, dtype=np.int64)
        where[ids] = np.arange(ids.size)
        return where[columns]
    by_id = np.argsort(ids, kind="stable")
    return by_id[np.searchsorted(ids, columns, sorter=by_id)]
