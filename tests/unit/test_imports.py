"""The package import graph has no circles and points one way: runners -> algorithms -> sparse_dist.

The graph is read with ``ast`` from the source, so every ``import`` / ``from ... import`` counts wherever it
sits: at module level, inside a function (a lazy import is still an import), or under ``TYPE_CHECKING``.
``from package.module import name`` is an edge to ``package.module.name`` when that is a module of the
project, else to ``package.module``. Only the project's own packages are nodes.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sparse_dist", "algorithms", "runners")


def module_name(path: Path) -> str:
    """``sparse_dist/comm.py`` -> ``sparse_dist.comm``; ``runners/data/__init__.py`` -> ``runners.data``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    """Every module of the three packages, by dotted name."""
    return {module_name(path): path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))}


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its source (functions and TYPE_CHECKING included)."""
    is_package = path.name == "__init__.py"
    own_package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def nearest_module(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = own_package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            module = nearest_module(target)
            if module is not None and module != name:
                found.add(module)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Concrete cycles covering every strongly connected component of more than one module (Tarjan, iterative):
    the shortest cycle through each member, each cycle once (rotated to start at its smallest name)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    cycles: list[list[str]] = []
    for component in sorted(components):
        for member in component:
            cycle = shortest_cycle(graph, set(component), member)[:-1]
            first = cycle.index(min(cycle))
            cycle = cycle[first:] + cycle[:first] + [cycle[first]]
            if cycle not in cycles:
                cycles.append(cycle)
    return cycles


def shortest_cycle(graph: dict[str, set[str]], component: set[str], start: str) -> list[str]:
    """The shortest path ``start -> ... -> start`` inside ``component`` (breadth first)."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if child not in parent:
                    parent[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def test_the_graph_sees_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    """The walker finds an import inside a function and under TYPE_CHECKING, and reports a cycle as a path."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import X\n"
              "def f():\n    from pkg import c\n")
    (tmp_path / "a.py").write_text(source)
    modules = {"pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py", "pkg.c": tmp_path / "c.py"}
    assert imported_modules("pkg.a", modules["pkg.a"], modules) == {"pkg.b", "pkg.c"}
    graph = {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}, "pkg.d": {"pkg.a"}}
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert import_cycles({"pkg.a": {"pkg.b"}, "pkg.b": set()}) == []


def test_no_import_cycles() -> None:
    cycles = import_cycles(import_graph())
    assert not cycles, "import circles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_layers_point_one_way() -> None:
    """sparse_dist never imports algorithms or runners; algorithms never imports runners."""
    forbidden = {"sparse_dist": ("algorithms", "runners"), "algorithms": ("runners",)}
    wrong = [f"{name} imports {target}" for name, targets in sorted(import_graph().items())
             for target in sorted(targets) if target.split(".")[0] in forbidden.get(name.split(".")[0], ())]
    assert not wrong, "\n".join(wrong)


def test_the_byte_model_does_not_load_mpi4py() -> None:
    """The analytic byte model (``sparse_dist.predict``, and the plan and strategy factory above the plans)
    imports without MPI. ``runners.perf_model_cmd`` as a whole still loads mpi4py: it reads shards through
    ``runners.data.shards``, which imports the trainer (``algorithms.train``, ``LocalGraph``)."""
    code = ("import sys, sparse_dist.predict, sparse_dist.factory; "
            "assert 'mpi4py' not in sys.modules, 'mpi4py was imported'")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
