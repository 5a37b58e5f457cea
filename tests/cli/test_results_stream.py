"""Results streamed: every record is on disk when written, a killed run keeps a valid JSON-lines prefix in
``NAME.partial``, a full disk is one sentence at the end of the epoch it happened in, and the sweep counts only
complete runs."""

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
from runners.results import ResultsWriter, partial_beside
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
    records = _records(partial_beside(out))
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
