"""The design pages' code runs, and their layout table names every module (issue 38, part 4).

Every ``python`` code block of docs/design.md and docs/design/extending.md that defines a policy, a layer
or an exchange plan is executed here, in this process, as a third party would paste it: it registers what it
defines, and the test then uses that as the page says (parsed by the one policy parser, refused by the plans
that cannot carry it, priced by the performance model, stacked by ``GraphModel``, trained for two epochs by
the real ``Trainer`` on one rank). A plan block's class is built on one rank and its product compared with
``A @ H``. Whatever the blocks registered is removed again after each test.

docs/design.md's repository layout table has one row per folder of ``sparse_dist/``, ``algorithms/`` and
``runners/``; each module of a folder (``*.py`` but ``__init__.py``) must be named in its folder's row.
"""

from __future__ import annotations

import re
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

ROOT = Path(__file__).resolve().parents[3]
PAGES = (ROOT / "docs" / "design.md", ROOT / "docs" / "design" / "extending.md")
DEFINES = re.compile(r"register_sampler|register_staleness|register_layer|class \w+\([\w.]*(ExchangePlan|Plan)\)")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def python_blocks(page: Path) -> list[Block]:
    """The fenced ``python`` blocks of ``page`` (outside other fences), each with the line of its first code line."""
    blocks, lines, start, language = [], [], 0, None
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        fence = line.strip()
        if fence.startswith("```"):
            if language is None:
                language, lines, start = fence[3:].strip() or "text", [], number + 1
            else:
                if language == "python":
                    blocks.append(Block(page.relative_to(ROOT).as_posix(), start, "\n".join(lines) + "\n"))
                language = None
            continue
        if language is not None:
            lines.append(line)
    return blocks


BLOCKS = [block for page in PAGES for block in python_blocks(page) if DEFINES.search(block.code)]


@pytest.fixture
def registries():
    """Remove, after the test, every layer kind and policy name a block registered (the built-in ones are
    registered first, by importing their modules, so that none of them is taken for a block's)."""
    import algorithms.model  # noqa: F401  (registers gcn, sage and gat)
    import algorithms.policies  # noqa: F401  (registers every built-in policy)
    from algorithms.layers import LAYER_TYPES
    from algorithms.policies.registry import KINDS

    layers, policies = dict(LAYER_TYPES), {axis: dict(kinds) for axis, kinds in KINDS.items()}
    yield
    for kind in set(LAYER_TYPES) - set(layers):
        del LAYER_TYPES[kind]
    for axis, kinds in KINDS.items():
        for name in set(kinds) - set(policies[axis]):
            del kinds[name]


@pytest.fixture(scope="module")
def comm():
    from sparse_dist.comm import world

    communicator = world(gpu_aware="off")
    yield communicator
    communicator.free()


def run_block(block: Block) -> dict:
    """Execute ``block`` as a module of its own (dataclasses look their module up in ``sys.modules``)."""
    name = f"docs_example_{Path(block.page).stem}_{block.line}"
    module = types.ModuleType(name)
    sys.modules[name] = module
    try:
        exec(compile(block.code, str(block), "exec"), module.__dict__)  # noqa: S102 - the page's code, as a reader runs it
    finally:
        del sys.modules[name]
    return module.__dict__


def tiny_graph():
    """12 nodes, undirected, 4 features, 3 classes; the split cut in three."""
    from algorithms.train import LocalGraph
    from sparse_dist.layout import RowLayout

    n, rng = 12, np.random.default_rng(0)
    upper = sp.random(n, n, density=0.3, random_state=1, format="csr")
    adjacency = sp.csr_matrix(((upper + upper.T) > 0).astype(np.float64))
    index = np.arange(n)
    masks = {"train": index < 6, "val": (index >= 6) & (index < 9), "test": index >= 9}
    return LocalGraph(RowLayout((0, n)), adjacency, rng.random((n, 4)), rng.integers(0, 3, n), masks, 3, False)


def train_two_epochs(comm, **config) -> list[float]:
    from algorithms.train import TrainConfig, Trainer

    trainer = Trainer(comm, tiny_graph(), TrainConfig(epochs=2, hidden=8, **config))
    losses = [trainer.train_epoch()["loss"] for _ in range(2)]
    assert all(np.isfinite(losses)), losses
    assert set(trainer.evaluate()) >= {"train_acc", "val_acc", "test_acc"}
    return losses


def test_the_pages_have_the_examples_this_file_runs() -> None:
    """A sampler and a layer on design.md, a staleness rule on extending.md (an empty list would pass nothing)."""
    found = {(block.page, kind) for block in BLOCKS
             for kind in ("register_sampler", "register_layer", "register_staleness") if kind in block.code}
    assert found >= {("docs/design.md", "register_sampler"), ("docs/design.md", "register_layer"),
                     ("docs/design/extending.md", "register_staleness")}, found


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_a_documented_example_runs_as_the_page_says(block: Block, registries, comm) -> None:
    from algorithms.layers import LAYER_TYPES, GraphLayer
    from algorithms.policies import PolicySpec
    from algorithms.policies.registry import KINDS
    from sparse_dist.plans import ExchangePlan

    layers_before = set(LAYER_TYPES)
    policies_before = {axis: set(kinds) for axis, kinds in KINDS.items()}
    namespace = run_block(block)

    new_layers = set(LAYER_TYPES) - layers_before
    new_policies = {axis: set(kinds) - policies_before[axis] for axis, kinds in KINDS.items()}
    plans = [value for value in namespace.values() if isinstance(value, type) and issubclass(value, ExchangePlan)
             and value.__module__ == namespace["__name__"]]
    assert new_layers or any(new_policies.values()) or plans, f"{block} registers nothing this test can run"

    for kind in new_layers:
        check_layer(comm, kind, LAYER_TYPES[kind], GraphLayer)
    for name in new_policies["sample"]:
        check_sampler(comm, name, PolicySpec)
    for name in new_policies["stale"]:
        check_rule(comm, name, PolicySpec)
    for plan in plans:
        check_plan(comm, plan)


def check_layer(comm, kind: str, layer_class, base) -> None:
    """The layer stacks in a ``GraphModel``, runs forward with a dense stand-in SpMM, and trains on one rank."""
    from algorithms.model import GraphModel

    assert issubclass(layer_class, base)
    model = GraphModel(kind, [4, 8, 3], dropout=0.5, seed=0)
    out = model(torch.ones(5, 4), lambda h, context: h.clone(), first_row=0, epoch=0, training=True)
    assert out.shape == (5, 3)
    train_two_epochs(comm, model=kind)


def check_sampler(comm, name: str, policy_spec) -> None:
    """Parsed by the one parser, refused by ``dense-bcast``, accepted by the plans that carry samples, priced
    by the performance model, its strategy answering the sampler's mask; trains on one rank."""
    from runners.perf.cost_model import ExpectedTraffic
    from sparse_dist.factory import make_strategy

    spec = policy_spec.parse(name)
    assert spec.refusal("dense-bcast") and "dense-bcast" in spec.refusal("dense-bcast")
    assert spec.refusal("sparse-bcast") is None and spec.refusal("p2p") is None
    sampler = spec.sample.build(seed=3)
    assert ExpectedTraffic.of(spec).sample_p == pytest.approx(sampler.p)
    rows = np.arange(10)
    np.testing.assert_array_equal(make_strategy(sampler).keep(1, 0, rows), sampler.keep(1, 0, rows))
    for plan in ("sparse-bcast", "p2p"):
        train_two_epochs(comm, plan=plan, sample=name)


def check_rule(comm, name: str, policy_spec) -> None:
    """Parsed, refused by ``p2p`` where it caches blocks, priced by the performance model; trains on one rank."""
    from runners.perf.cost_model import ExpectedTraffic

    spec = policy_spec.parse(name)
    rule = spec.stale.build()
    if rule.caches:
        assert spec.refusal("p2p"), "a rule that caches blocks needs a broadcast plan"
    plan = "sparse-bcast" if rule.caches else "p2p"
    assert spec.refusal(plan) is None
    traffic = ExpectedTraffic.of(spec)
    assert traffic.active == pytest.approx(rule.scheduled_share() if not rule.pipelined else 1.0)
    train_two_epochs(comm, plan=plan, stale=name)


def check_plan(comm, plan_class) -> None:
    """Built on one rank, in ``PLANS`` for the call only; its product is ``A @ H``; its byte model has the shape
    of the contract."""
    from sparse_dist import plans
    from sparse_dist.dcsr import DistCSR
    from sparse_dist.spmm import DistSpMM

    graph = tiny_graph()
    rows = np.array([graph.rows.shape[0]])
    moved = np.asarray(plan_class.moved_rows(rows, np.zeros((1, 1)), np.zeros(1)))
    assert moved.shape == (1, 1)
    saved = dict(plans.PLANS)
    plans.PLANS[plan_class.name] = plan_class
    try:
        matrix = DistCSR(comm, graph.layout, graph.rows)
        spmm = DistSpMM(matrix, plan_class.name, dtype=torch.float64)
        h = torch.rand(rows[0], 3, dtype=torch.float64)
        torch.testing.assert_close(spmm.forward(h), torch.from_numpy(graph.rows.toarray()) @ h)
    finally:
        plans.PLANS.clear()
        plans.PLANS.update(saved)


# ----------------------------------------------------------------------------------------- layout
LAYOUT_PACKAGES = ("sparse_dist", "algorithms", "runners")


def layout_rows() -> dict[str, str]:
    """docs/design.md's repository layout table: folder (as written, ``sparse_dist/comm/``) -> its row."""
    text = (ROOT / "docs" / "design.md").read_text()
    section = text[text.index("## Repository layout"):]
    rows = {}
    for line in section.splitlines():
        match = re.match(r"\| `([\w/]+/)` \|(.*)\|\s*$", line)
        if match:
            rows[match.group(1)] = match.group(2)
    return rows


def modules() -> list[Path]:
    """Every module of the three packages (a new one fails until the table names it): the files git tracks, so
    that a module still being written in a shared checkout does not fail others' runs; without git, the files."""
    listed = subprocess.run(["git", "ls-files", "--", *LAYOUT_PACKAGES], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout.strip():
        paths = [Path(line) for line in listed.stdout.splitlines() if (ROOT / line).is_file()]
    else:
        paths = [path.relative_to(ROOT) for package in LAYOUT_PACKAGES for path in (ROOT / package).rglob("*.py")
                 if "__pycache__" not in path.parts]
    return sorted(path for path in paths if path.suffix == ".py" and path.name != "__init__.py")


def test_the_layout_table_names_every_module() -> None:
    rows = layout_rows()
    missing = []
    for module in modules():
        folder = module.parent.as_posix() + "/"
        row = rows.get(folder)
        if row is None:
            missing.append(f"{module} (no row for {folder})")
        elif f"`{module.name}`" not in row:
            missing.append(str(module))
    assert not missing, f"docs/design.md's repository layout table does not name: {missing}"


def test_the_layout_check_reads_the_table() -> None:
    """The check above must see the table and the modules (it would pass on a table it failed to read)."""
    rows = layout_rows()
    assert {"sparse_dist/", "sparse_dist/comm/", "algorithms/", "algorithms/policies/", "runners/",
            "runners/data/"} <= set(rows), sorted(rows)
    assert len(modules()) >= 90 and Path("sparse_dist/pipelined.py") in modules()
