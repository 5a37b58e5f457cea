"""sparse_dist: distributed sparse linear algebra for full-graph GNN training.

The core: a communicator facade over mpi4py (:mod:`sparse_dist.comm`), row
layouts (:mod:`sparse_dist.layout`), the block-row distributed CSR
(:mod:`sparse_dist.dcsr`), the distributed SpMM and its exchange plans
(:mod:`sparse_dist.spmm`, :mod:`sparse_dist.plans`, built by
:mod:`sparse_dist.factory`), local CSR helpers (:mod:`sparse_dist.csr`),
byte/time accounting (:mod:`sparse_dist.accounting`) and the analytic byte
model (:mod:`sparse_dist.predict`).

Importing this package, or :mod:`sparse_dist.comm`, does not initialise
MPI: the first :func:`sparse_dist.comm.world` does.
"""

__version__ = "0.1.0"
