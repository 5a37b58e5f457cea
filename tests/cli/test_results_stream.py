"""Results streamed: every record is on disk when written, a killed run keeps a valid JSON-lines prefix in
``NAME.partial``, a full disk is one sentence at the end of the epoch it happened in, and the sweep counts only
complete runs; a resumed run keeps its earlier legs' records (the launches: tests/mpi/test_checkpoint.py), and a
file that is not a results file of ours is recognised."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from datasets_for_tests import cora, write
from mpirun import BIN, ROOT, mpiexec_path

from runners import results
from runners.results import (EarlierResultsError, ResultsWriter, foreign_results, is_results_file, partial_beside,
                             read_earlier_legs)
from runners.study.collect import is_complete

SPARSE_DIST = str(BIN / "sparse-dist")


@pytest.fixture(scope="module")
def cora_data(tmp_path_factory) -> Path:
    return write(cora(), tmp_path_factory.mktemp("stream") / "cora", parts=2, partitioner="block")


def _records(path: Path) -> list[dict]:
    """Every line of ``path`` parsed (a valid JSON-lines file: each line one JSON object, newline-terminated)."""
    text = path.read_text()
    assert text.endswith("\n"), "the last line is cut"
    return [json.loads(line) for line in text.splitlines()]


def _whole_lines(path: Path) -> list[dict]:
    """The records of a file whose writer was killed: every whole line parsed; a last line the kill cut inside
    its write (no newline: the kernel stops a file write at a page boundary on SIGKILL) is left out, as
    :func:`runners.results.read_earlier_legs` leaves it out, and must be the start of a record."""
    pieces = path.read_text().split("\n")
    torn = pieces.pop()
    assert torn == "" or torn.startswith('{"type": '), f"the torn last line is not a record's start: {torn[:80]!r}"
    return [json.loads(line) for line in pieces]


# ---------------------------------------------------------------- the writer
def test_each_record_is_on_disk_when_written_and_close_renames(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    writer = ResultsWriter(out)
    writer.write({"type": "config", "n": 1})
    assert _records(partial_beside(out)) == [{"type": "config", "n": 1}] and not out.exists()
    writer.write({"type": "final"})
    assert [r["type"] for r in _records(partial_beside(out))] == ["config", "final"]
    writer.close()
    assert [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]
    assert is_complete(out)


def test_a_new_run_replaces_an_old_partial_file_and_keeps_a_complete_one_until_it_completes(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    out.write_text('{"type": "config"}\n{"type": "final"}\n')  # an earlier complete run
    partial_beside(out).write_text('{"type": "config"}\n{"type": "epoch", "epoch": 1}\n{"type": "ep')  # killed
    writer = ResultsWriter(out)
    writer.write({"type": "config", "run": 2})
    assert _records(partial_beside(out)) == [{"type": "config", "run": 2}]  # truncated, not appended to
    assert is_complete(out) and "run" not in _records(out)[0]  # the old complete file is still there
    writer.write({"type": "final", "run": 2})
    writer.close()
    assert _records(out) == [{"type": "config", "run": 2}, {"type": "final", "run": 2}]
    assert not partial_beside(out).exists()


def test_a_failed_write_keeps_whole_lines_and_says_one_sentence(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "r.jsonl"
    writer = ResultsWriter(out)
    writer.write({"type": "config"})
    real_write = os.write

    def half_then_enospc(fd: int, data) -> int:  # the disk fills inside the second record
        if len(data) > 8:
            real_write(fd, bytes(data[:8]))
            return 8
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results.os, "write", half_then_enospc)
    writer.write({"type": "epoch", "epoch": 1, "loss": 0.5})
    monkeypatch.setattr(results.os, "write", real_write)
    assert writer.error == (f"--out {out}: cannot write the results file: No space left on device; the 1 record(s) "
                            f"written so far are in {partial_beside(out)}")
    writer.write({"type": "epoch", "epoch": 2})  # ignored after the failure
    assert _records(partial_beside(out)) == [{"type": "config"}]  # the cut line was removed
    with pytest.raises(results.ResultsWriteError, match="No space left on device"):
        writer.close()
    assert not out.exists()


def test_a_partial_file_is_not_a_complete_run(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    writer = ResultsWriter(out)
    writer.write({"type": "config"})
    writer.write({"type": "epoch", "epoch": 1})
    assert not is_complete(out) and not is_complete(partial_beside(out))


def _leg_file(path: Path, epochs: int, *, final: bool = False, torn: bool = False, hidden: int = 16) -> list[dict]:
    """A results file as a leg of ``train`` writes it: config, environment, setup, ``epochs`` epoch records."""
    records = [{"type": "config", "hidden": hidden, "seed": 0, "epochs": 300}, {"type": "environment"},
               {"type": "setup"}]
    records += [{"type": "epoch", "epoch": e, "wall": 1.0 + e, "val_acc": 0.1 * e} for e in range(1, epochs + 1)]
    records += [{"type": "final"}] if final else []
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + ('{"type": "epoch", "ep' if torn else ""))
    return records


def test_a_resumed_run_keeps_the_earlier_records_up_to_its_epoch_and_leaves_out_a_torn_line(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    written = _leg_file(partial_beside(out), 7, torn=True)  # killed at epoch 7 inside a write; checkpoint at 5
    out.write_text('{"type": "config", "hidden": 16}\n{"type": "final"}\n')  # an older complete run: not used
    earlier = read_earlier_legs(out, 5, {"hidden": 16, "seed": 0})
    assert earlier is not None and earlier.source == partial_beside(out) and earlier.torn and earlier.legs == 1
    assert [json.loads(line) for line in earlier.lines] == written[:3 + 5]
    assert earlier.wall == 6.0 and earlier.missing(5) == []
    writer = ResultsWriter(out, earlier.lines)  # the resumed leg: the kept lines first, then its own
    writer.write({"type": "leg", "start_epoch": 5})
    assert [r["type"] for r in _records(partial_beside(out))][-2:] == ["epoch", "leg"]
    writer.write({"type": "final"})
    writer.close()
    assert len(_records(out)) == 3 + 5 + 2 and not partial_beside(out).exists()


def test_a_leg_that_completed_is_continued_from_its_complete_file(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    _leg_file(out, 4, final=True)
    earlier = read_earlier_legs(out, 4, {"hidden": 16})
    assert earlier is not None and earlier.source == out and not earlier.torn
    assert [json.loads(line)["type"] for line in earlier.lines][-1] == "epoch"  # final left out
    assert read_earlier_legs(tmp_path / "none.jsonl", 4, {}) is None


def test_earlier_records_of_another_run_or_out_of_order_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    _leg_file(partial_beside(out), 3, hidden=32)
    with pytest.raises(EarlierResultsError, match=r"holds the records of another run \(hidden 32 there, 16 in this "
                                                 r"run\); resuming would mix two runs in one file"):
        read_earlier_legs(out, 3, {"hidden": 16})
    lines = partial_beside(out).read_text().splitlines(keepends=True)
    partial_beside(out).write_text("".join(lines[:4] + lines[3:]))  # epoch 1 twice: two writers
    with pytest.raises(EarlierResultsError, match="out of order at line 5"):
        read_earlier_legs(out, 3, {"hidden": 32})
    partial_beside(out).write_text(lines[0] + '{"type": "epo{"type": "epoch"}\n' + lines[1])
    with pytest.raises(EarlierResultsError, match="line 2 of .* is not a record of ours"):
        read_earlier_legs(out, 3, {"hidden": 32})


def test_a_results_file_of_ours_is_recognised_by_its_first_bytes(tmp_path: Path) -> None:
    ours, theirs, empty = tmp_path / "r.jsonl", tmp_path / "table.csv", tmp_path / "empty"
    _leg_file(ours, 1)
    theirs.write_text("a,b\n1,2\n")
    empty.write_text("")
    assert is_results_file(ours) and is_results_file(empty) and not is_results_file(theirs)
    assert foreign_results(ours) is None and foreign_results(tmp_path / "new.jsonl") is None
    assert foreign_results(theirs) == (f"--out {theirs}: {theirs} exists and is not a results file of sparse_dist "
                                       f"(its first line is not a config record); pass --overwrite to replace it, "
                                       f"or choose another --out")
    partial_beside(ours).write_text("notes\n")
    assert "r.jsonl.partial exists and is not a results file" in foreign_results(ours)


# ---------------------------------------------------------------- under mpiexec
def test_a_run_killed_midway_keeps_a_valid_prefix_of_its_records(cora_data: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    command = [mpiexec_path(), "-n", "2", SPARSE_DIST, "train", "--data", str(cora_data), "--epochs", "100000",
               "--out", str(out)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            partial = partial_beside(out)
            if partial.exists() and partial.read_text().count('"type": "epoch"') >= 5:
                break
            time.sleep(0.1)
        assert process.poll() is None, process.communicate()[1]
        os.killpg(process.pid, signal.SIGKILL)  # as a walltime limit's or scancel's last word
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    records = _whole_lines(partial_beside(out))
    types = [r["type"] for r in records]
    assert types[:3] == ["config", "environment", "setup"] and "final" not in types
    epochs = [r["epoch"] for r in records if r["type"] == "epoch"]
    assert len(epochs) >= 5 and epochs == list(range(1, len(epochs) + 1))
    assert not out.exists() and not is_complete(out)


def _mount_tiny_tmpfs(directory: Path, size: str = "64k") -> None:
    directory.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")


def _fill(directory: Path) -> None:
    """Write zeros into ``directory`` until its file system is full (as another process filling the disk would)."""
    with open(directory / "filler", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def test_a_full_disk_is_one_sentence_as_soon_as_it_happens(cora_data: Path, tmp_path: Path) -> None:
    """The disk fills up while the run writes (train's estimate before work passed: the disk had room then)."""
    tiny = tmp_path / "tiny"
    _mount_tiny_tmpfs(tiny, "4m")  # room for the estimate of 400 epoch records; filled once 3 are written
    try:
        out = tiny / "r.jsonl"
        process = subprocess.Popen([mpiexec_path(), "-n", "2", SPARSE_DIST, "train", "--data", str(cora_data),
                                    "--epochs", "400", "--print-every", "1", "--out", str(out)], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                   env=dict(os.environ, OMP_NUM_THREADS="1", MPIEXEC_TIMEOUT="240"))
        try:
            deadline = time.monotonic() + 200
            partial = partial_beside(out)
            while time.monotonic() < deadline and process.poll() is None:
                if partial.exists() and partial.read_text().count('"type": "epoch"') >= 3:
                    break
                time.sleep(0.05)
            _fill(tiny)
            stdout, stderr = process.communicate(timeout=240)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()
        assert process.returncode == 2, stderr
        said = stdout + stderr
        assert said.count("No space left on device") == 1 and "Traceback" not in said, said
        assert (f"sparse-dist train: error: --out {out}: cannot write the results file: No space left on device; "
                f"the ") in stderr
        records = _records(partial_beside(out))
        written = [r["epoch"] for r in records if r["type"] == "epoch"]
        assert len(written) >= 3 and written == list(range(1, len(written) + 1))
        assert f"epoch {written[-1] + 2:4d}" not in stdout  # stopped at the next epoch's gather
        assert "final" not in [r["type"] for r in records] and not out.exists()
    finally:
        subprocess.run(["umount", str(tiny)], check=False)
