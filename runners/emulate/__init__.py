"""An emulated cluster on one machine: network namespaces as nodes, capped veth links, MPICH over TCP.

* :mod:`runners.emulate.network`: builds and tears down the namespaces, veth pairs, bridge and qdiscs
  (pyroute2, netlink), reads the links' byte counters, and removes what a killed run left behind;
* :mod:`runners.emulate.launcher`: the ``ssh`` stand-in hydra's ``mpiexec`` calls to start one node's
  proxy inside that node's namespace;
* :mod:`runners.emulate.command`: ``sparse-dist emulate``.
"""
