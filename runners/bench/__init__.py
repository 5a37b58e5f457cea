"""``sparse-dist bench``: SpMM, training (against PyG), the network, and the policies' savings."""
