"""The numpy kernel inside PyG's NeighborSampler (runners/bench/minibatch_peer.py) against a plain loop, and the
kinds the mini-batch peers mirror."""

import numpy as np
import pytest
import scipy.sparse as sp

from runners.bench.minibatch import MINIBATCH_KINDS
from runners.bench.minibatch_peer import PEER_KINDS, peer_problem, sample_hops


def _graph(n: int = 60, seed: int = 4) -> sp.csc_matrix:
    rng = np.random.default_rng(seed)
    dense = (rng.random((n, n)) < 0.12).astype(np.float64)
    dense[5] = 0.0  # node 5 is nobody's in-neighbour (row u, column v: an edge u -> v)
    dense[:, 7] = 0.0  # node 7 has no in-neighbours
    return sp.csc_matrix(dense)


@pytest.mark.parametrize("fanouts", [[3, 2], [-1, -1], [1, -1, 4]])
def test_each_hop_keeps_min_fanout_degree_distinct_in_neighbours_and_numbers_nodes_in_order(fanouts) -> None:
    csc = _graph()
    colptr, sources = csc.indptr.astype(np.int64), csc.indices.astype(np.int64)
    seeds = np.array([7, 3, 11, 5])
    node, row, col, edge, nodes_per_hop, edges_per_hop = sample_hops(colptr, sources, seeds, fanouts,
                                                                     np.random.default_rng(0))
    assert node[:seeds.size].tolist() == seeds.tolist() and len(set(node.tolist())) == node.size
    assert sum(nodes_per_hop) == node.size and sum(edges_per_hop) == edge.size == row.size == col.size
    assert np.array_equal(sources[edge], node[row])  # each edge's source is the in-neighbour it names
    frontier, first_edge, first_node = seeds, 0, seeds.size
    for hop, fanout in enumerate(fanouts):
        hop_edges = slice(first_edge, first_edge + edges_per_hop[hop])
        for v in frontier:
            mine = edge[hop_edges][node[col[hop_edges]] == v]
            degree = colptr[v + 1] - colptr[v]
            assert mine.size == (degree if fanout < 0 else min(fanout, degree)), (hop, v)
            assert len(set(mine.tolist())) == mine.size
            assert np.all((mine >= colptr[v]) & (mine < colptr[v + 1]))  # v's own in-edges
        new = node[first_node:first_node + nodes_per_hop[hop + 1]]
        reached = set(node[row[hop_edges]].tolist())
        assert set(new.tolist()) == reached - set(node[:first_node].tolist())  # new = reached, not seen before
        frontier, first_edge, first_node = new, first_edge + edges_per_hop[hop], first_node + new.size


def test_a_sampled_neighbour_is_uniform() -> None:
    csc = sp.csc_matrix(np.ones((8, 8)))  # node 0 has 8 in-neighbours, one of which is kept per draw
    colptr, sources = csc.indptr.astype(np.int64), csc.indices.astype(np.int64)
    rng = np.random.default_rng(3)
    counts = np.zeros(8)
    for _ in range(4000):
        node, row, *_ = sample_hops(colptr, sources, np.array([0]), [1], rng)
        counts[node[row[0]]] += 1
    expected = 4000 / 8
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected)), counts


def test_the_minibatch_peers_mirror_their_table_and_refuse_any_other_kind_in_one_sentence() -> None:
    assert PEER_KINDS == ("sage",) and all(peer_problem(kind) is None for kind in PEER_KINDS)
    assert set(PEER_KINDS) <= set(MINIBATCH_KINDS) and "gat" not in MINIBATCH_KINDS  # attention takes the operator
    assert peer_problem("gcn") == ("the mini-batch peers mirror --layer-kind sage only (SAGEConv, mean): they have "
                                   "no layer to copy the weights of --layer-kind gcn into")
