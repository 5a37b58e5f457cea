"""Everything a user launches: the ``sparse-dist`` command, dataset generators, benchmarks."""
