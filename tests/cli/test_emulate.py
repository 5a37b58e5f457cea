"""``sparse-dist emulate``: set-up and tear-down (also after timeout, Ctrl-C and SIGKILL), the refusals, and a
P = 2 run over two emulated nodes that moves the same bytes and computes the same losses as under plain
``mpiexec``, its traffic crossing the capped links. Every launch carries a timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from datasets_for_tests import cora, write
from emulation import needs_namespaces
from mpirun import BIN, ROOT, finish, run_mpi

from runners import cli
from runners.emulate import command as emulate_command
from runners.emulate.network import NETNS_DIR, prefix_of

SPARSE_DIST = str(BIN / "sparse-dist")


def _ours(pid: int) -> list[str]:
    """Namespaces of the emulate process ``pid`` still listed (what ``ip netns list`` shows)."""
    names = os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []
    return sorted(name for name in names if name.startswith(prefix_of(pid)))


def _root_links() -> list[str]:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        return sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links())


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if marker.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _emulate(*args: str, timeout: float = 120.0) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    return subprocess.Popen([SPARSE_DIST, "emulate", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(process: subprocess.Popen[str], timeout: float = 120.0) -> tuple[int, str, str]:
    result = finish(process, timeout, "emulate")
    return result.returncode, result.stdout, result.stderr


def _wait_for(condition, seconds: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.1)


@pytest.fixture
def signals_restored():  # type: ignore[no-untyped-def]
    """emulate's main installs its SIGINT/SIGTERM handlers; give pytest its own back."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _refusal(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """Run ``sparse-dist emulate`` in this process with nothing allowed to be launched; its one stderr line."""
    def no_launch(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"emulate launched {args} although it should have refused")

    monkeypatch.setattr(emulate_command.subprocess, "Popen", no_launch)
    before = sorted(os.listdir(NETNS_DIR)) if os.path.isdir(NETNS_DIR) else []
    args = cli._parser().parse_args(["emulate", *argv])
    assert emulate_command.main(None, args) == 2
    after = sorted(os.listdir(NETNS_DIR)) if os.path.isdir(NETNS_DIR) else []
    assert after == before
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("sparse-dist emulate: "), err
    return err


def test_refuses_in_one_sentence_without_root(capsys, monkeypatch, signals_restored) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    err = _refusal(["--nodes", "2", "--bandwidth", "1gbit", "--", "true"], capsys, monkeypatch)
    assert "needs root" in err and "uid 1000" in err


def test_refuses_in_one_sentence_without_pyroute2(capsys, monkeypatch, signals_restored) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setitem(sys.modules, "pyroute2", None)  # import pyroute2 now raises ImportError
    err = _refusal(["--nodes", "2", "--bandwidth", "1gbit", "--", "true"], capsys, monkeypatch)
    assert "needs pyroute2" in err


@needs_namespaces
def test_refuses_latency_where_the_kernel_has_no_netem(tmp_path: Path) -> None:
    from pyroute2 import NetNS, netns

    probe = f"sdemu-test-{uuid.uuid4().hex[:8]}"
    netns.create(probe)
    try:
        with NetNS(probe) as ipr:
            ipr.link("add", ifname="a", kind="veth", peer={"ifname": "b"})
            try:
                ipr.tc("add", "netem", index=ipr.link_lookup(ifname="a")[0], handle="1:", delay=50)
                pytest.skip("this kernel has netem: --latency is not refused here")
            except pytest.skip.Exception:
                raise
            except Exception:
                pass
    finally:
        netns.remove(probe)
    marker = tmp_path / "launched"
    process = _emulate("--nodes", "2", "--bandwidth", "1gbit", "--latency", "50us", "--",
                       sys.executable, "-c", f"open({str(marker)!r}, 'w')")
    rc, _, stderr = _finish(process)
    assert rc == 2, stderr
    assert stderr.strip() == ("sparse-dist emulate: error: this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), which "
                              "--latency needs; leave --latency out to emulate bandwidth only")
    assert not marker.exists() and _ours(process.pid) == []


RANK_VIEW = """
import json, os, socket, sys, time
rank = os.environ["PMI_RANK"]
view = {"interfaces": sorted(name for _, name in socket.if_nameindex()), "cpus": sorted(os.sched_getaffinity(0)),
        "network": json.loads(os.environ["SPARSE_DIST_NETWORK"]), "namespaces": sorted(os.listdir("/run/netns"))}
open(sys.argv[1] + rank, "w").write(json.dumps(view))
time.sleep(120)
"""


@pytest.mark.slow  # the whole emulate command; its clean-up after kills stays in the main lane (below)
@needs_namespaces
def test_builds_the_nodes_and_leaves_nothing_after_a_timeout(tmp_path: Path) -> None:
    links = _root_links()
    marker = f"sdemu-test-{uuid.uuid4().hex}"
    process = _emulate("--nodes", "2", "--ranks-per-node", "1", "--bandwidth", "100mbit", "--timeout", "4", "--",
                       sys.executable, "-c", RANK_VIEW, str(tmp_path / "rank"), marker)
    rc, _, stderr = _finish(process)
    assert rc == 124 and "killed the job after --timeout 4 s" in stderr, stderr
    views = [json.loads((tmp_path / f"rank{r}").read_text()) for r in range(2)]
    prefix = prefix_of(process.pid)
    for view in views:
        assert view["interfaces"] == ["emu0", "lo"]  # each rank sees only its node's link
        assert view["network"]["bandwidth"] == "100mbit" and view["network"]["nodes"] == 2
        assert [n for n in view["namespaces"] if n.startswith(prefix)] == [f"{prefix}head", f"{prefix}n0",
                                                                           f"{prefix}n1", f"{prefix}sw"]
    if len(os.sched_getaffinity(0)) >= 2:
        assert set(views[0]["cpus"]).isdisjoint(views[1]["cpus"])  # each node its own cores
    assert _ours(process.pid) == [] and _root_links() == links and _processes_with(marker) == []


def _sleeping_job(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen[str], str]:
    """An emulated 2-node job whose ranks sleep, once both ranks run (files ``up0``, ``up1``); its marker."""
    marker = f"sdemu-test-{uuid.uuid4().hex}"
    process = _emulate("--nodes", "2", "--bandwidth", "1gbit", *flags, "--", sys.executable, "-c",
                       "import os, sys, time; open(sys.argv[1] + os.environ['PMI_RANK'], 'w'); time.sleep(120)",
                       str(tmp_path / "up"), marker)
    _wait_for(lambda: all((tmp_path / f"up{r}").exists() for r in range(2)) or process.poll() is not None)
    assert process.poll() is None, process.communicate()
    return process, marker


@needs_namespaces
@pytest.mark.parametrize("how", ["sigint", "sigterm"])
def test_tears_down_after_ctrl_c_and_sigterm(tmp_path: Path, how: str) -> None:
    process, marker = _sleeping_job(tmp_path)
    os.kill(process.pid, signal.SIGINT if how == "sigint" else signal.SIGTERM)
    rc, _, stderr = _finish(process, timeout=60)
    assert rc == {"sigint": 130, "sigterm": 143}[how], stderr
    assert _ours(process.pid) == [] and _processes_with(marker) == []
    if how == "sigterm":  # said once, by emulate (the program's name never printed as a list)
        # hydra's own banners ("[mpiexec@host] ... one of the processes terminated badly") are the job's, not ours
        said = [line for line in stderr.splitlines() if "terminated" in line.lower() and not line.startswith("[")]
        assert said == ["sparse-dist emulate: terminated (SIGTERM); the job and its network are gone"], stderr
        assert "['" not in stderr


@needs_namespaces
def test_cleanup_removes_what_a_killed_run_left(tmp_path: Path) -> None:
    process, marker = _sleeping_job(tmp_path)
    os.kill(process.pid, signal.SIGKILL)
    _finish(process, timeout=30)
    assert len(_ours(process.pid)) == 4  # no tear-down ran
    cleanup = subprocess.run([SPARSE_DIST, "emulate", "--cleanup"], capture_output=True, text=True, timeout=60)
    assert cleanup.returncode == 0, cleanup.stderr
    assert f"{prefix_of(process.pid)}n0" in cleanup.stdout
    assert _ours(process.pid) == []
    scratch = list(Path(tempfile.gettempdir()).glob(f"{prefix_of(process.pid)}*"))
    assert scratch == [], scratch  # the killed run's launcher wrapper directory went with its namespaces
    _wait_for(lambda: _processes_with(marker) == [], seconds=10)


@needs_namespaces
def test_the_next_emulate_removes_and_names_what_a_killed_run_left(tmp_path: Path) -> None:
    process, marker = _sleeping_job(tmp_path)
    os.kill(process.pid, signal.SIGKILL)
    _finish(process, timeout=30)
    assert len(_ours(process.pid)) == 4
    scratch = list(Path(tempfile.gettempdir()).glob(f"{prefix_of(process.pid)}*"))
    assert len(scratch) == 1
    after = _emulate("--nodes", "1", "--bandwidth", "1gbit", "--", "true")
    rc, _, stderr = _finish(after, timeout=60)
    assert rc == 0, stderr
    [line] = [line for line in stderr.splitlines() if "killed runs left" in line]
    assert line.startswith("sparse-dist emulate: removed 4 namespace(s) and 1 scratch directory(ies) killed runs "
                           "left: ") and f"{prefix_of(process.pid)}n0" in line and str(scratch[0]) in line, line
    assert _ours(process.pid) == [] and not scratch[0].exists()
    _wait_for(lambda: _processes_with(marker) == [], seconds=10)


def test_a_scratch_directory_is_removed_only_when_it_holds_our_wrapper(tmp_path: Path) -> None:
    from runners.emulate.launcher import write_wrapper

    dead = subprocess.Popen(["true"])
    dead.wait()
    ours = Path(tempfile.mkdtemp(prefix=f"{prefix_of(dead.pid)}"))
    write_wrapper(ours, prefix_of(dead.pid), 2, pin=True)
    foreign = Path(tempfile.mkdtemp(prefix=f"{prefix_of(dead.pid)}"))
    (foreign / "ssh").write_bytes(b"#!/bin/sh\necho my own script\n")
    linked = Path(tempfile.mkdtemp(prefix=f"{prefix_of(dead.pid)}"))
    (tmp_path / "victim").write_bytes(b"mine")
    (linked / "ssh").symlink_to(tmp_path / "victim")
    try:
        removed = emulate_command._remove_stale_scratch()
        assert str(ours) in removed and not ours.exists()
        assert str(foreign) not in removed and (foreign / "ssh").read_bytes() == b"#!/bin/sh\necho my own script\n"
        assert str(linked) not in removed and (tmp_path / "victim").read_bytes() == b"mine"
    finally:
        for directory in (foreign, linked):
            (directory / "ssh").unlink(missing_ok=True)
            directory.rmdir()


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@needs_namespaces
def test_two_emulated_nodes_train_exactly_as_plain_mpiexec(tmp_path: Path) -> None:
    data = write(cora(), tmp_path / "cora", parts=2)
    # pipe: its flights progress by MPI_Test on one node and from a probe thread between nodes (--progress
    # auto), which must change no value. --audit-every fixes when the guard reads its exact reference: left to
    # itself it prices the interval from measured seconds, which differ between two runs, and so would the bytes
    train = [SPARSE_DIST, "train", "--data", str(data), "--plan", "p2p", "--stale", "pipe:tau=1", "--epochs", "3",
             "--threads", "1", "--print-every", "1000", "--seed", "0", "--audit-every", "2"]
    plain = run_mpi(2, [*train, "--out", str(tmp_path / "plain.jsonl")], timeout=200)
    assert plain.returncode == 0, plain.stderr
    process = _emulate("--nodes", "2", "--ranks-per-node", "1", "--bandwidth", "1gbit", "--timeout", "200",
                       "--report", str(tmp_path / "links.json"), "--", *train, "--out", str(tmp_path / "emu.jsonl"))
    rc, _, stderr = _finish(process, timeout=240)
    assert rc == 0, stderr
    a, b = _records(tmp_path / "plain.jsonl"), _records(tmp_path / "emu.jsonl")
    epochs_a = [r for r in a if r["type"] == "epoch"]
    epochs_b = [r for r in b if r["type"] == "epoch"]
    assert len(epochs_a) == len(epochs_b) == 3
    assert [e["loss"] for e in epochs_a] == [e["loss"] for e in epochs_b]  # bitwise: same ranks, same math
    assert [e["bytes"] for e in epochs_a] == [e["bytes"] for e in epochs_b]
    readings = [[r.get("epoch") for r in records if r.get("guard_reference") is not None] for records in (a, b)]
    assert readings[0] == readings[1] == [2]
    final_a, final_b = a[-1], b[-1]
    assert final_a["bytes_total"] == final_b["bytes_total"]
    assert [next(r for r in records if r["type"] == "setup")["progress"] for records in (a, b)] == ["test", "thread"]
    # the kernel splits run time into user and system at timer ticks: a short epoch may show all of it on one side
    assert all(e["cpu"]["user"]["min"] >= 0 and e["cpu"]["system"]["min"] >= 0 for e in epochs_b)
    assert all(e["cpu"]["user"]["max"] + e["cpu"]["system"]["max"] > 0 for e in epochs_b)
    assert len(b[-1]["cpu_seconds_per_rank"]) == 2
    environment = next(r for r in b if r["type"] == "environment")
    assert environment["network"]["bandwidth"] == "1gbit" and environment["ranks_on_node"] == 1
    assert "network" not in next(r for r in a if r["type"] == "environment")
    # what each rank sent went through its node's capped link: the node's interface and both token buckets
    # counted at least those bytes
    sent = final_b["bytes_total"]
    least = sum(sent[phase]["sent"]["min"] for phase in sent)
    links = json.loads((tmp_path / "links.json").read_text())["links"]
    for link in links:
        assert link["tx_bytes"] >= least and link["rx_bytes"] >= least, (links, least)
        assert link["sent_capped_bytes"] >= link["tx_bytes"] and link["received_capped_bytes"] >= link["rx_bytes"]
    assert _ours(process.pid) == []


NETWORK_STUDY = """
[study]
name = "net"
ranks = [1, 2, 3, 4]
plans = ["p2p"]
policies = ["exact"]
epochs = 2
timeout = 100

[network]
bandwidth = ["unlimited", "1gbit"]
ranks_per_node = 2

[[dataset]]
name = "cora"
path = "cora"
"""


def test_network_table_runs_each_job_through_emulate_once_per_bandwidth(tmp_path: Path) -> None:
    from runners.study.spec import StudyError, load_study
    from runners.sweep_cmd import launcher_for, run_command

    path = tmp_path / "net.toml"
    path.write_text(NETWORK_STUDY)
    study = load_study(path)
    runs, skipped = study.runs()
    assert [(r.ranks, r.bandwidth) for r in runs] == [(2, "unlimited"), (2, "1gbit"), (4, "unlimited"), (4, "1gbit")]
    assert [line.split(":")[0] for line in skipped] == ["P=1", "P=3"]
    assert runs[1].run_id.endswith("_bw1gbit")
    command = run_command(study, runs[3], launcher_for(study))
    emulate = command[command.index("emulate"):command.index("--")]
    assert emulate[emulate.index("--nodes") + 1] == "2" and emulate[emulate.index("--ranks-per-node") + 1] == "2"
    assert emulate[emulate.index("--bandwidth") + 1] == "1gbit" and "mpiexec" not in " ".join(command)
    for bad, field in (('bandwidth = ["1gbyte"]', "bandwidth"), ('bandwidth = ["1gbit"]\nlatency = "fast"', "latency"),
                       ('bandwidth = ["1gbit"]\nspeed = 1', "unknown field")):
        path.write_text(NETWORK_STUDY.replace('bandwidth = ["unlimited", "1gbit"]', bad))
        with pytest.raises(StudyError, match=field):
            load_study(path)
