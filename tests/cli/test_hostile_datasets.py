"""A ``meta.json`` is data, never a path: hostile or damaged dataset directories are refused in one sentence.

Every name read from a ``meta.json`` must be a plain file name of the form ``prepare`` writes, inside the
dataset directory; a dataset that names anything else (``..``, an absolute path, a symbolic link leaving the
directory) is not ours, so ``prepare --overwrite`` refuses to replace it and ``train`` refuses to read it, and
the file it names outside survives byte for byte. A field of the wrong type or range, or a ``meta.json`` that
is not UTF-8, is one line naming the file and the field, exit status 2, no traceback, said once. What a killed
``prepare`` left beside ``--out`` is removed by the next one when provably its own, else named.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
from mpirun import BIN, ROOT, run_mpi, run_with_timeout

from runners.data.datasets import planted_classes
from runners.data.shards import ShardError, clear_leftovers, read_meta, write_shards

SPARSE_DIST = str(BIN / "sparse-dist")
VICTIM = b"my thesis, chapter 1\n"


def _dataset(tmp_path: Path, name: str = "d") -> Path:
    write_shards(planted_classes(nodes=120, classes=2, features=4), tmp_path / name, parts=2)
    return tmp_path / name


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim" / "thesis.txt"
    victim.parent.mkdir()
    victim.write_bytes(VICTIM)
    return victim


def _edit(directory: Path, change: Callable[[dict[str, Any]], None]) -> None:
    meta = json.loads((directory / "meta.json").read_text())
    change(meta)
    (directory / "meta.json").write_text(json.dumps(meta))


def _files_outside(name: str) -> Callable[[dict[str, Any]], None]:
    return lambda meta: meta["files"].__setitem__(name, "0" * 64)


HOSTILE: dict[str, tuple[Callable[[Path], str], str]] = {
    # variant: (makes the directory hostile given the victim's path -> the name it uses, field named)
    "files ..": (lambda victim: "../victim/thesis.txt", "files"),
    "files absolute": (lambda victim: str(victim), "files"),
    "permutation ..": (lambda victim: "../victim/thesis.txt", "permutation_file"),
    "permutation absolute": (lambda victim: str(victim), "permutation_file"),
}


def _make_hostile(directory: Path, victim: Path, variant: str) -> str:
    name, field = HOSTILE[variant][0](victim), HOSTILE[variant][1]
    if field == "files":
        _edit(directory, _files_outside(name))
    else:
        _edit(directory, lambda meta: meta.__setitem__("permutation_file", name))
    return field


@pytest.mark.parametrize("variant", sorted(HOSTILE))
def test_a_dataset_naming_a_path_outside_is_neither_replaced_nor_read(tmp_path: Path, variant: str) -> None:
    directory, victim = _dataset(tmp_path), _victim(tmp_path)
    field = _make_hostile(directory, victim, variant)
    with pytest.raises(ShardError, match=rf"field '{field}' names .*not a plain file name inside the dataset"):
        write_shards(planted_classes(nodes=120, classes=2, features=4), directory, parts=2, overwrite=True)
    with pytest.raises(ShardError, match=rf"meta.json: field '{field}' names"):
        read_meta(directory)
    assert victim.read_bytes() == VICTIM
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "victim"]  # no temporary or old copy left


@pytest.mark.parametrize("link", ["part-00001.npz", "permutation.npy", "meta.json"])
def test_a_symbolic_link_leaving_the_directory_is_neither_replaced_nor_read(tmp_path: Path, link: str) -> None:
    directory, victim = _dataset(tmp_path), _victim(tmp_path)
    if link == "meta.json":
        os.replace(directory / "meta.json", tmp_path / "victim" / "meta.json")
        victim = tmp_path / "victim" / "meta.json"
    else:
        (directory / link).unlink()
    before = victim.read_bytes()
    (directory / link).symlink_to(victim)
    with pytest.raises(ShardError, match="symbolic link"):
        write_shards(planted_classes(nodes=120, classes=2, features=4), directory, parts=2, overwrite=True)
    with pytest.raises(ShardError, match=rf"symbolic link"):
        read_meta(directory)
    assert victim.read_bytes() == before and (directory / link).is_symlink()


WRONG: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "num_parts text": (lambda m: m.__setitem__("num_parts", "four"), "field 'num_parts' is 'four', expected an "
                                                                      "integer >= 1"),
    "num_nodes negative": (lambda m: m.__setitem__("num_nodes", -3), "field 'num_nodes' is -3"),
    "num_classes float": (lambda m: m.__setitem__("num_classes", 2.0), "field 'num_classes' is 2.0"),
    "multilabel text": (lambda m: m.__setitem__("multilabel", "no"), "field 'multilabel' is 'no', expected true"),
    "format_version true": (lambda m: m.__setitem__("format_version", True), "format_version True, expected 1"),
    "row_offsets texts": (lambda m: m.__setitem__("row_offsets", ["0", "60", "120"]), "field 'row_offsets' is"),
    "row_offsets decreasing": (lambda m: m.__setitem__("row_offsets", [0, 130, 120]),
                               "field 'row_offsets' must have num_parts + 1 = 3 non-decreasing entries"),
    "files a list": (lambda m: m.__setitem__("files", ["part-00000.npz"]), "field 'files' is ['part-00000.npz']"),
    "files a foreign name": (lambda m: m["files"].__setitem__("notes.txt", "0" * 64),
                             "field 'files' names 'notes.txt', which is not a file prepare writes"),
    "files missing a part": (lambda m: m["files"].pop("part-00001.npz"), "part-00001.npz is amiss"),
    "feature_norm": (lambda m: m.__setitem__("feature_norm", 7), "field 'feature_norm' is 7"),
    "partition_stats edges": (lambda m: m["partition_stats"].__setitem__("edges", [1]),
                              "field 'partition_stats.edges' is [1]"),
    "not an object": (lambda m: (m.clear(), m.__setitem__("x", 1)), "missing fields"),
}


@pytest.mark.parametrize("variant", sorted(WRONG))
def test_a_field_of_the_wrong_type_or_range_is_one_sentence_naming_it(tmp_path: Path, variant: str) -> None:
    directory = _dataset(tmp_path)
    change, expected = WRONG[variant]
    _edit(directory, change)
    with pytest.raises(ShardError) as caught:
        read_meta(directory)
    message = str(caught.value)
    assert message.startswith(f"{directory / 'meta.json'}: ") and expected in message, message
    assert "\n" not in message
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    with pytest.raises(ShardError, match="is not a dataset directory prepare may replace"):
        write_shards(planted_classes(nodes=120, classes=2, features=4), directory, parts=2, overwrite=True)
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before


def test_a_meta_json_that_is_not_utf8_or_not_an_object_names_the_file(tmp_path: Path) -> None:
    directory = _dataset(tmp_path)
    raw = (directory / "meta.json").read_bytes()
    (directory / "meta.json").write_bytes(raw[:40] + b"\xff" + raw[40:])
    with pytest.raises(ShardError, match=r"meta.json: not UTF-8 text \(byte 0xff at offset 40\)"):
        read_meta(directory)
    (directory / "meta.json").write_text("[1, 2]")
    with pytest.raises(ShardError, match=r"meta.json: expected a JSON object, found list"):
        read_meta(directory)


def _one_error_line(stderr: str, command: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("(see ")]
    assert len(lines) == 1 and lines[0].startswith(f"sparse-dist {command}: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_prepare_overwrite_refuses_a_traversing_meta_json_and_the_victim_survives(tmp_path: Path) -> None:
    directory, victim = _dataset(tmp_path, "trav"), _victim(tmp_path)
    for path in directory.iterdir():
        if path.name != "meta.json":
            path.unlink()  # only a meta.json copied from a dataset, as F1 of issue 36 built it
    _edit(directory, _files_outside("../victim/thesis.txt"))
    result = run_with_timeout([SPARSE_DIST, "prepare", "planetoid", "--parts", "2", "--out", str(directory),
                               "--overwrite"], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    line = _one_error_line(result.stderr, "prepare")
    assert "meta.json is not one prepare wrote: field 'files' names '../victim/thesis.txt'" in line
    assert victim.read_bytes() == VICTIM


@pytest.mark.parametrize("variant", ["non-utf8", "num_parts text"])
def test_train_refuses_a_damaged_or_hostile_meta_json_once(tmp_path: Path, variant: str) -> None:
    directory = _dataset(tmp_path)
    if variant == "non-utf8":
        (directory / "meta.json").write_bytes(b"\xff" + (directory / "meta.json").read_bytes())
        expected = "meta.json: not UTF-8 text (byte 0xff at offset 0)"
    else:
        _edit(directory, WRONG[variant][0])
        expected = WRONG[variant][1]
    result = run_mpi(2, [SPARSE_DIST, "train", "--data", str(directory), "--epochs", "1"], timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert expected in _one_error_line(result.stderr, "train")


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_what_a_killed_prepare_left_is_removed_when_provably_its_own(tmp_path: Path) -> None:
    out = _dataset(tmp_path, "cora")
    dead = _dead_pid()
    stale = tmp_path / f".cora.tmp-{dead}"
    (stale / "buckets").mkdir(parents=True)
    for name in ("part-00000.npz", "permutation.npy", "buckets/0.bin"):
        (stale / name).write_bytes(b"x" * 100)
    foreign = tmp_path / f".cora.old-{dead}"
    foreign.mkdir()
    (foreign / "notes.txt").write_bytes(VICTIM)  # not a file prepare writes: kept, whoever left it
    sleeper = subprocess.Popen(["sleep", "60"])  # a process that runs and is no prepare: kept, named
    try:
        alive = tmp_path / f".cora.tmp-{sleeper.pid}"
        alive.mkdir()
        (alive / "meta.json").write_text("{}")
        found = {leftover.path.name: leftover for leftover in clear_leftovers(out)}
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)
    assert found[stale.name].removed and not stale.exists()
    assert not found[foreign.name].removed and "prepare did not write" in found[foreign.name].why
    assert (foreign / "notes.txt").read_bytes() == VICTIM
    assert not found[alive.name].removed and f"rm -r {alive}" in found[alive.name].why and alive.is_dir()
    assert sorted(found) == sorted([stale.name, foreign.name, alive.name])


def test_a_set_aside_dataset_is_kept_while_out_is_gone_and_the_next_prepare_names_leftovers(tmp_path: Path) -> None:
    out = _dataset(tmp_path, "cora")
    aside = tmp_path / f".cora.old-{_dead_pid()}"
    os.replace(out, aside)  # killed between prepare --overwrite's two renames
    [kept] = clear_leftovers(out)
    assert not kept.removed and f"`mv {aside} {out}` restores it" in kept.why and (aside / "meta.json").is_file()
    stale = tmp_path / f".cora.tmp-{_dead_pid()}"
    stale.mkdir()
    (stale / "part-00000.npz").write_bytes(b"x")
    result = run_with_timeout([SPARSE_DIST, "prepare", "planetoid", "--parts", "2", "--out", str(out)],
                              timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert f"sparse-dist prepare: removed {stale}: left by a prepare (process" in result.stdout
    assert f"sparse-dist prepare: kept {aside}: the dataset a killed `prepare --overwrite`" in result.stdout
    assert not stale.exists() and read_meta(out)["num_parts"] == 2
    [removed] = clear_leftovers(out)  # --out is a dataset again: the old one is the killed swap's garbage
    assert removed.removed and not aside.exists()
