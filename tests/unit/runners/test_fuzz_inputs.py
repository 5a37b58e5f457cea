"""Fuzzing every input format's reader (Hypothesis): any mutation of a valid file ends in success or in a
one-sentence refusal naming the file, never a traceback of another kind, a signal or a hang.

Formats: a shard (``part-NNNNN.npz``), ``meta.json``, ``permutation.npy``, a study file, an edge list (and its
features and labels), the Planetoid files (pickles read by a restricted unpickler) and an OGB dataset's raw
CSVs (read by OGB's own reader). What
"success" must then hold: a shard that passes is loaded and normalised (scipy and the GCN normalisation run
on it) with finite results. The mutations (:mod:`input_mutations`) are array-level (special values, dtypes,
shapes, lengths off by one, arrays dropped, renamed or compressed) and byte-level (bit flips, truncation,
garbage), with the checksum rewritten to match (a forger) or not (damage). A few dozen cases a format here;
the slow lane's campaign runs hundreds in subprocesses under an address-space limit
(``tests/cli/test_fuzz_campaign.py``).
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from input_mutations import ARRAY_OPS, BYTE_OPS, FORMATS, PART_NAMES, Mutation, apply, one_sentence
from ogb_layout import write_tiny_arxiv

from runners.data.datasets import DatasetError, load_edge_list, load_ogb, planted_classes
from runners.data.planetoid import BUILTIN_PLANETOID, load_planetoid
from runners.data.shards import ShardError, read_meta, read_part, read_permutation, write_shards
from runners.study.spec import StudyError, load_study

CASES = int(os.environ.get("SPARSE_DIST_FUZZ_CASES", "40"))
"""Cases a format: a few dozen in the main lane; the slow lane's campaign sets hundreds."""
SEED = os.environ.get("SPARSE_DIST_FUZZ_SEED")
"""Unset: the same cases every run (derandomised); the campaign passes a seed to draw others."""


def mutations(fmt: str) -> st.SearchStrategy[Mutation]:
    ops = ARRAY_OPS + BYTE_OPS if fmt in ("shard", "permutation", "edgelist", "planetoid") else BYTE_OPS + ("set", "drop")
    return st.builds(Mutation, st.just(fmt), st.sampled_from(ops), st.sampled_from(PART_NAMES),
                     st.floats(0, 1, exclude_max=True), st.integers(0, 63), st.booleans())


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid input of every format, written once (each case copies it)."""
    root = tmp_path_factory.mktemp("pristine")
    write_shards(planted_classes(nodes=60, classes=3, degree=4, features=5, community_size=20), root / "d", parts=2,
                 partitioner="block")
    (root / "study.toml").write_text('[study]\nname = "s"\noutput = "out"\nranks = [1, 2]\nepochs = 3\n\n'
                                     '[[dataset]]\nname = "c"\nsynthetic = { nodes = 300, degree = 4 }\n')
    np.savetxt(root / "edges.txt", np.array([[0, 1], [1, 2], [2, 0], [3, 1]]), fmt="%d")
    np.save(root / "features.npy", np.eye(4, 3, dtype=np.float32))
    np.save(root / "labels.npy", np.array([0, 1, 2, 1]))
    shutil.copytree(BUILTIN_PLANETOID, root / "planetoid")
    write_tiny_arxiv(root / "ogb", n=30)
    return root


def _copy(pristine: Path, tmp_path: Path) -> Path:
    case = tmp_path / f"case-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(pristine, case)
    return case


def read_input(m: Mutation, case: Path) -> None:
    """The reader of ``m.format`` on the mutated ``case``, and for a shard what training then does with it."""
    if m.format in ("shard", "meta"):
        meta = read_meta(case / "d")
        for index in range(meta["num_parts"]):
            arrays = read_part(case / "d", meta, index)
            _normalised(meta, index, arrays)
    elif m.format == "permutation":
        read_permutation(case / "d", read_meta(case / "d"))
    elif m.format == "planetoid":
        graph = load_planetoid(case / "planetoid", "cora")
        graph.adjacency.check_format(full_check=True)
        assert np.isfinite(graph.features).all() and graph.labels.min() >= 0
    elif m.format == "ogb":
        graph = load_ogb("ogbn-arxiv", case / "ogb")
        graph.adjacency.check_format(full_check=True)
        assert np.isfinite(graph.features).all() and graph.labels.min() >= 0
    elif m.format == "study":
        load_study(case / "study.toml")
    else:
        load_edge_list(case / "edges.txt", case / "features.npy", case / "labels.npy")


def _normalised(meta: dict, index: int, arrays: dict[str, np.ndarray]) -> None:
    """What training does first with a part that passed: scipy CSR rows, self-loops, the symmetric scaling."""
    import scipy.sparse as sp

    from algorithms.normalize import add_remaining_self_loops, inverse_sqrt, scale_symmetric

    rows = sp.csr_matrix((arrays["data"], arrays["indices"], arrays["indptr"]),
                         shape=(arrays["indptr"].size - 1, meta["num_nodes"]))
    loops = add_remaining_self_loops(rows, meta["row_offsets"][index])
    scale = inverse_sqrt(np.asarray(loops.sum(axis=1)).ravel())
    normalised = scale_symmetric(loops, scale, np.ones(loops.nnz))
    assert np.isfinite(normalised.data).all()
    assert np.isfinite(arrays["features"]).all()


REFUSALS = (ShardError, StudyError, DatasetError)


def check(m: Mutation, pristine: Path, tmp_path: Path) -> str:
    """``accepted`` or ``refused`` (in one sentence naming a file of the case); anything else fails."""
    case = _copy(pristine, tmp_path)
    apply(m, case / "d", study=case / "study.toml", edgelist=case / "edges.txt", planetoid=case / "planetoid", ogb=case / "ogb" / "ogbn_arxiv")
    try:
        read_input(m, case)
    except REFUSALS as exc:
        assert one_sentence(str(exc), str(case)), (m, str(exc))  # names the file (or the one it disagrees with)
        return "refused"
    return "accepted"


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "checkpoint"])
def test_any_mutation_is_read_or_refused_in_one_sentence(fmt: str, pristine: Path, tmp_path: Path) -> None:
    @settings(max_examples=CASES // 2 if fmt == "ogb" else CASES,  # OGB's reader: 0.4 s a case
              deadline=None, derandomize=SEED is None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(mutations(fmt))
    def case(m: Mutation) -> None:
        outcomes[check(m, pristine, tmp_path)] += 1

    outcomes: Counter[str] = Counter()
    if SEED is not None:
        case = seed(int(SEED))(case)
    case()
    print(f"fuzz {fmt}: {sum(outcomes.values())} cases, {outcomes['accepted']} accepted, "
          f"{outcomes['refused']} refused in one sentence")
    assert outcomes["refused"] > 0 and sum(outcomes.values()) >= min(CASES // 2, 10), outcomes
