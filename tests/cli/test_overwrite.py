"""``prepare --overwrite`` replaces only a sparse_dist dataset, by a swap; nothing else at ``--out`` is touched."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from mpirun import BIN, ROOT

from runners.data import shards, stream_synthetic
from runners.data.datasets import planted_classes
from runners.data.shards import ShardError, output_problem, read_meta, write_shards

SPARSE_DIST = str(BIN / "sparse-dist")


def _prepare(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPARSE_DIST, "prepare", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_directory_that_is_no_dataset_is_refused_and_its_files_survive(tmp_path: Path) -> None:
    victim = tmp_path / "v"
    (victim / "i").mkdir(parents=True)
    (victim / "i" / "thesis.tex").write_text("x\n")
    result = _prepare("planetoid", "--out", str(victim), "--parts", "2", "--overwrite")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines()[0] == (
        f"sparse-dist prepare: error: --out {victim} is not a dataset directory prepare may replace (a directory "
        f"with no meta.json, holding i/): --overwrite replaces only one holding just the files its meta.json "
        f"lists, so nothing was changed; choose another --out or move what is there yourself")
    assert _tree(tmp_path) == {"v/i/thesis.tex": b"x\n"}  # nothing removed, nothing left beside


@pytest.mark.slow
def test_a_previous_dataset_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "cora"
    assert _prepare("planetoid", "--out", str(out), "--parts", "4").returncode == 0
    again = _prepare("planetoid", "--out", str(out), "--parts", "2")
    assert again.returncode == 2 and f"--out {out} already exists (a sparse_dist dataset); pass --overwrite" \
        in again.stderr
    replaced = _prepare("planetoid", "--out", str(out), "--parts", "2", "--overwrite")
    assert replaced.returncode == 0, replaced.stderr
    assert read_meta(out)["num_parts"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "part-00000.npz", "part-00001.npz",
                                                      "permutation.npy"]  # parts 2 and 3 of the old one gone
    assert [p.name for p in tmp_path.iterdir()] == ["cora"]  # no temporary or old copy beside it


def test_a_dataset_holding_a_user_file_or_a_plain_file_is_not_replaced(tmp_path: Path) -> None:
    data = planted_classes(nodes=200, classes=2, features=4)
    write_shards(data, tmp_path / "d", parts=2)
    (tmp_path / "d" / "notes.txt").write_text("mine")
    before = _tree(tmp_path)
    with pytest.raises(ShardError, match=r"a dataset directory that also holds notes.txt, which prepare did not "
                                         r"write"):
        write_shards(data, tmp_path / "d", parts=3, overwrite=True)
    (tmp_path / "plain").write_text("data")
    with pytest.raises(ShardError, match=r"plain is not a dataset directory prepare may replace \(a file\)"):
        write_shards(data, tmp_path / "plain", parts=2, overwrite=True)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "meta.json").write_text("{}")
    assert "its meta.json is not one prepare wrote: missing fields" in output_problem(tmp_path / "bad", True)
    assert {k: v for k, v in _tree(tmp_path).items() if not k.startswith(("plain", "bad"))} == before
    (tmp_path / "empty").mkdir()
    assert output_problem(tmp_path / "empty", True) is None
    write_shards(data, tmp_path / "empty", parts=2, overwrite=True)  # an empty directory holds nothing to lose
    assert read_meta(tmp_path / "empty")["num_parts"] == 2


def test_a_user_file_that_appears_while_the_input_is_read_stops_the_swap(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    data = planted_classes(nodes=200, classes=2, features=4)
    write_shards(data, tmp_path / "d", parts=2)
    real = shards.partition

    def partition_and_meanwhile(*args, **kwargs):
        (tmp_path / "d" / "late.txt").write_text("arrived during prepare")
        return real(*args, **kwargs)

    monkeypatch.setattr(shards, "partition", partition_and_meanwhile)
    with pytest.raises(ShardError, match="late.txt"):
        write_shards(data, tmp_path / "d", parts=4, overwrite=True)
    assert read_meta(tmp_path / "d")["num_parts"] == 2 and (tmp_path / "d" / "late.txt").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # the new dataset's temporary is gone


def test_a_streamed_prepare_replaces_a_previous_dataset_too(tmp_path: Path) -> None:
    out = tmp_path / "s"
    stream_synthetic.write_streamed_synthetic(out, nodes=300, degree=3, parts=3, progress=False)
    with pytest.raises(ShardError, match="already exists"):
        stream_synthetic.write_streamed_synthetic(out, nodes=300, degree=3, parts=2, progress=False)
    stream_synthetic.write_streamed_synthetic(out, nodes=300, degree=3, parts=2, progress=False, overwrite=True)
    assert json.loads((out / "meta.json").read_text())["num_parts"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "part-00000.npz", "part-00001.npz",
                                                      "permutation.npy"]
    assert [p.name for p in tmp_path.iterdir()] == ["s"]
