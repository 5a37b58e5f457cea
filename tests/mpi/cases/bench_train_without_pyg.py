"""``bench train`` in a process where ``torch_geometric`` cannot be imported: the peer is skipped.

Arguments are those of ``sparse-dist bench train``; the module is driven
directly (not through ``runners.cli``) so the case does not depend on how
the command is registered.
"""

from __future__ import annotations

import argparse
import importlib.abc
import sys


class _HideTorchGeometric(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if name == "torch_geometric" or name.startswith("torch_geometric."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
        return None


sys.meta_path.insert(0, _HideTorchGeometric())

from runners.bench import train as bench_train  # noqa: E402
from sparse_dist.comm import run_or_abort, world  # noqa: E402

parser = argparse.ArgumentParser()
bench_train.add_arguments(parser)
arguments = parser.parse_args(sys.argv[1:])
sys.exit(run_or_abort(lambda: bench_train.main(world(), arguments)))
