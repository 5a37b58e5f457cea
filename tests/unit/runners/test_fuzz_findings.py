"""What the input fuzzer (test_fuzz_inputs.py) found, each kept as a regression: before its fix each was a
traceback of another kind (or, for the unpickled matrix, scipy left to write past an array); now one sentence
naming the file."""

from __future__ import annotations

import gzip
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from ogb_layout import write_tiny_arxiv

from runners.data.datasets import DatasetError, load_edge_list, load_ogb
from runners.data.planetoid import BUILTIN_PLANETOID, load_planetoid
from runners.study.spec import StudyError, load_study


def _edge_list(tmp_path: Path) -> tuple[Path, Path, Path]:
    np.savetxt(tmp_path / "edges.txt", np.array([[0, 1], [1, 2], [2, 0]]), fmt="%d")
    np.save(tmp_path / "features.npy", np.eye(3, 2, dtype=np.float32))
    np.save(tmp_path / "labels.npy", np.array([0, 1, 0]))
    return tmp_path / "edges.txt", tmp_path / "features.npy", tmp_path / "labels.npy"


def test_a_study_file_that_is_not_utf8_is_one_sentence(tmp_path: Path) -> None:
    """Found: a UnicodeDecodeError traceback."""
    path = tmp_path / "study.toml"
    path.write_bytes(b"[study]\nname = \"\x84\"\n")
    with pytest.raises(StudyError, match=rf"^{path}: not UTF-8 text \(byte 0x84 at offset 16\)"):
        load_study(path)


def test_an_npy_whose_header_does_not_parse_is_one_sentence(tmp_path: Path) -> None:
    """Found: a SyntaxError (tokenize.TokenError) traceback from numpy's header parser."""
    edges, features, labels = _edge_list(tmp_path)
    raw = bytearray(features.read_bytes())
    raw[raw.index(b"(")] = ord("{")
    features.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match=rf"^{features}: features has no readable .npy header"):
        load_edge_list(edges, features, labels)


@pytest.mark.parametrize("dtype", ["<U3", "complex64", "datetime64[s]"])
def test_non_numeric_features_are_one_sentence(tmp_path: Path, dtype: str) -> None:
    """Found: a TypeError traceback from np.isfinite on text features."""
    edges, features, labels = _edge_list(tmp_path)
    np.save(features, np.eye(3, 2).astype(dtype))
    with pytest.raises(DatasetError, match=rf"^{features}: features of type .*, expected numbers"):
        load_edge_list(edges, features, labels)


def test_an_unpickled_matrix_whose_indptr_falls_is_refused(tmp_path: Path) -> None:
    """Found: unpickling sets a CSR's arrays without scipy's checks; an indptr that falls (the shape of N1's heap
    corruption in a shard) then reached scipy's kernels."""
    directory = tmp_path / "planetoid"
    shutil.copytree(BUILTIN_PLANETOID, directory)
    path = directory / "ind.cora.allx"
    with open(path, "rb") as handle:
        allx = pickle.load(handle, encoding="latin1")
    allx.indptr = allx.indptr.copy()
    allx.indptr[100] = -1
    with open(path, "wb") as handle:
        pickle.dump(allx, handle, protocol=2)
    with pytest.raises(DatasetError, match=rf"^{path}: not a valid sparse matrix"):
        load_planetoid(directory, "cora")


@pytest.mark.parametrize("file, line, value, needle", [
    ("raw/edge.csv.gz", 0, "0,99", "raw/edge.csv.gz must hold integer node id pairs in [0, 30)"),
    ("split/time/test.csv.gz", 0, "31", "the test split must hold node ids in [0, 30)"),
    ("raw/node-label.csv.gz", 0, "40", "raw/node-label.csv.gz must hold class ids in [0, 40)"),
])
def test_ogb_files_that_do_not_fit_together_are_one_sentence(tmp_path: Path, file: str, line: int, value: str,
                                                              needle: str) -> None:
    """Found: IndexError and scipy ValueError tracebacks from ids beyond the nodes or the classes."""
    directory = write_tiny_arxiv(tmp_path, n=30)
    path = directory / file
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    lines[line] = value
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    with pytest.raises(DatasetError) as info:
        load_ogb("ogbn-arxiv", tmp_path)
    assert needle in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_a_pickle_that_asks_for_a_huge_memo_is_one_sentence_without_the_allocation(tmp_path: Path) -> None:
    """Found: seven bytes (``LONG_BINPUT 0xFFFFFFF0``) made the C unpickler size its memo for 2^32 entries, a
    MemoryError; the Python unpickler keeps a dict. Under a 6 GiB address-space limit in a subprocess (torch maps
    about 3 GiB on import), so that
    an allocation attempt of that size would fail the test rather than the machine."""
    import subprocess
    import sys

    directory = tmp_path / "planetoid"
    shutil.copytree(BUILTIN_PLANETOID, directory)
    (directory / "ind.cora.graph").write_bytes(b"\x80\x02N" + b"r" + (0xFFFFFFF0).to_bytes(4, "little") + b".")
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))\n"
              "from runners.data.datasets import DatasetError\nfrom runners.data.planetoid import load_planetoid\n"
              "try:\n    load_planetoid(sys.argv[1], 'cora')\nexcept DatasetError as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", script, str(directory)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{directory / 'ind.cora.graph'}: expected a dict of adjacency lists"), \
        result.stdout
