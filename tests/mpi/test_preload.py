"""The suite's launch preloader (tests/support/preload): a launched process forked from a zygote behaves as a
fresh interpreter would where the suite can see it: its command line, directory, environment, umask and file
descriptors, its exit status (a death by a signal included), signals sent to it, its death with its launcher,
distinct hash seeds for the ranks of one ``mpiexec`` job, and its end without the module teardown (the same
status, output and MPI finalisation as a fresh interpreter's); and what must start as usual does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mpirun import mpiexec_path, run_with_timeout

pytestmark = pytest.mark.skipif(os.environ.get("SPARSE_DIST_TEST_PRELOAD", "off") == "off",
                                reason="the suite runs without its preloader (SPARSE_DIST_TEST_PRELOAD=off)")

REPORT = """
import json, os, sys
parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")
mask = os.umask(0)
extra = int(os.environ.get("EXTRA_FD", "-1"))
report = json.dumps({"forked": any(part.endswith(b"zygote.py") for part in parent), "argv": sys.argv,
                     "cwd": os.getcwd(), "variable": os.environ.get("PRELOAD_PROBE"), "umask": mask,
                     "rank": os.environ.get("PMI_RANK"), "hash": hash("sparse-dist"),
                     "torch_loaded": "torch" in sys.modules, "main": __name__,
                     "extra": os.read(extra, 100).decode() if extra >= 0 else None})
if os.environ.get("REPORT_DIR"):  # one file a rank: ranks' lines on one stdout may interleave
    open(os.path.join(os.environ["REPORT_DIR"], "rank-" + os.environ["PMI_RANK"]), "w").write(report)
else:
    print(report)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


def _script(tmp_path: Path, text: str = REPORT) -> Path:
    path = tmp_path / "probe.py"
    path.write_text(text)
    return path


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def test_a_launched_script_gets_its_own_argv_directory_environment_umask_and_descriptors(tmp_path: Path) -> None:
    script = _script(tmp_path)
    read_end, write_end = os.pipe()
    os.write(write_end, b"through fd")
    os.close(write_end)
    try:
        result = subprocess.run([sys.executable, str(script), "a b", "--c"], cwd=tmp_path, capture_output=True,
                                text=True, timeout=60, pass_fds=(read_end,), umask=0o027,
                                env=_env(PRELOAD_PROBE="x y", EXIT_WITH="7", EXTRA_FD=str(read_end)))
    finally:
        os.close(read_end)
    assert result.returncode == 7, result.stderr
    report = json.loads(result.stdout)
    assert report["forked"], "the probe started as a fresh interpreter: the preloader did not take it"
    assert report["argv"] == [str(script), "a b", "--c"] and report["cwd"] == str(tmp_path)
    assert report["variable"] == "x y" and report["umask"] == 0o027 and report["extra"] == "through fd"
    assert report["torch_loaded"] and report["main"] == "__main__"


def test_the_ranks_of_a_job_are_forked_with_distinct_hash_seeds(tmp_path: Path) -> None:
    script = _script(tmp_path)
    result = run_with_timeout([mpiexec_path(), "-n", "3", sys.executable, str(script)], timeout=120,
                              env={**_env(), "MPIEXEC_TIMEOUT": "120", "REPORT_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    reports = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank-*"))]
    assert sorted(report["rank"] for report in reports) == ["0", "1", "2"]
    assert all(report["forked"] for report in reports)
    assert len({report["hash"] for report in reports}) == 3  # a set of strings iterates differently on each


@pytest.mark.parametrize("ending, expected", [("raise RuntimeError('probe failed')", 1),
                                              ("os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
                                              ("os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM),
                                              ("os.abort()", -signal.SIGABRT)])
def test_an_uncaught_exception_and_a_signal_end_the_launcher_as_they_end_the_child(tmp_path: Path, ending: str,
                                                                                   expected: int) -> None:
    runs = tmp_path / "runs"
    script = _script(tmp_path, "import os, signal, sys\n"
                               f"open({str(runs)!r}, 'a').write(str(os.getpid()) + '\\n')\n" + ending + "\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=_env())
    assert result.returncode == expected, result.stderr
    assert len(runs.read_text().splitlines()) == 1  # the child's end is the launcher's: it never runs it again
    assert expected != 1 or "RuntimeError: probe failed" in result.stderr


def test_a_signal_to_the_launcher_reaches_the_child_and_its_death_takes_the_child(tmp_path: Path) -> None:
    waiting = _script(tmp_path, "import os, signal, sys, time\n"
                                "signal.signal(signal.SIGTERM, lambda *_: sys.exit(5))\n"
                                "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
                                "time.sleep(60)\n")
    for how, expected in ((signal.SIGTERM, 5), (signal.SIGKILL, -signal.SIGKILL)):
        marker = tmp_path / f"pid-{how}"
        process = subprocess.Popen([sys.executable, str(waiting), str(marker)], env=_env())
        try:
            deadline = time.monotonic() + 30
            while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
                time.sleep(0.05)
            child = int(marker.read_text())
            assert child != process.pid  # forked, not the launcher itself
            process.send_signal(how)
            assert process.wait(timeout=30) == expected
            deadline = time.monotonic() + 10
            while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not Path(f"/proc/{child}").exists(), f"the forked child {child} outlived its launcher"
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_what_differs_at_import_time_or_runs_code_from_the_command_line_starts_as_usual(tmp_path: Path) -> None:
    script = _script(tmp_path)
    for argv, env in (([sys.executable, str(script)], _env(OMP_NUM_THREADS="2")),
                      ([sys.executable, "-c", REPORT], _env())):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        assert result.returncode == 0, result.stderr
        assert not json.loads(result.stdout)["forked"]
    limited = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=_env(),
                             preexec_fn=lambda: __import__("resource").setrlimit(
                                 __import__("resource").RLIMIT_NOFILE, (512, 512)))
    assert limited.returncode == 0 and not json.loads(limited.stdout)["forked"]


ENDING = """
import atexit, os, sys, threading, time
parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read()
open(os.environ["MARK"], "w").write(str(b"zygote.py" in parent))
atexit.register(lambda: sys.stdout.write("atexit ran\\n"))
threading.Thread(target=lambda: (time.sleep(0.3), sys.stdout.write("thread finished\\n"))).start()
sys.stdout.write("no newline, buffered")
if os.environ.get("WITH_MPI"):
    from sparse_dist.comm import world
    world().barrier()
ending = os.environ["ENDING"]
if ending.startswith("raise "):
    exec(ending)
elif ending != "return":
    sys.exit(eval(ending))
"""


def _forked_and_fresh(**extra: str) -> dict[str, dict[str, str]]:
    """The environment of a launch forked from a zygote and of the same launch started afresh."""
    return {"forked": _env(**extra), "off": _env(SPARSE_DIST_TEST_PRELOAD="off", **extra)}


@pytest.mark.parametrize("ending", ["return", "None", "300", "'a message'", "True", "raise RuntimeError('probe')",
                                    "raise KeyboardInterrupt"])
def test_a_forked_child_ends_as_a_fresh_interpreter_would(tmp_path: Path, ending: str) -> None:
    """Its end skips the module teardown and the preloaded libraries' exit handlers
    (zygote.end_as_the_interpreter) but keeps what a program sees: the exit status of ``sys.exit`` (none, an int
    past 255, a message), an uncaught exception's traceback and status (a ``KeyboardInterrupt``'s death by
    SIGINT), atexit handlers, non-daemon threads joined, buffered output flushed."""
    script = _script(tmp_path, ENDING)
    ends = {}
    for preload in ("forked", "off"):
        env = _forked_and_fresh(ENDING=ending, MARK=str(tmp_path / preload))[preload]
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
        ends[preload] = (result.returncode, result.stdout, result.stderr)
    assert (tmp_path / "forked").read_text() == "True" and (tmp_path / "off").read_text() == "False"
    assert ends["forked"] == ends["off"]
    assert "atexit ran" in ends["forked"][1] and "thread finished" in ends["forked"][1], ends


def test_a_forked_job_finalises_mpi_and_says_nothing_a_fresh_job_would_not(tmp_path: Path) -> None:
    """Two ranks that started MPI end with status 0 and the same stderr as fresh interpreters, and so do a real
    command's ranks (``sparse-dist train``: whatever a fresh interpreter's whole teardown would say on stderr, a
    forked child must say too)."""
    from datasets_for_tests import random_directed, write
    from mpirun import BIN

    script = _script(tmp_path, ENDING)
    data = write(random_directed(n=60), tmp_path / "d", parts=2, partitioner="block")
    train = [str(BIN / "sparse-dist"), "train", "--data", str(data), "--epochs", "2", "--hidden", "8",
             "--print-every", "100", "--out", str(tmp_path / "r.jsonl")]
    probe = {"ENDING": "return", "WITH_MPI": "1", "MARK": str(tmp_path / "mark")}
    for argv, extra in (([sys.executable, str(script)], probe), (train, {})):
        ends = {}
        for preload, env in _forked_and_fresh(**extra).items():
            result = run_with_timeout([mpiexec_path(), "-n", "2", *argv], timeout=120, env=env)
            ends[preload] = (result.returncode, result.stderr)
            assert result.returncode == 0, (preload, result.stdout, result.stderr)
        assert ends["forked"] == ends["off"], ends
