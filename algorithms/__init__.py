"""GNN math on top of sparse_dist: normalisation, layers, training, policies (filled by later issues)."""
