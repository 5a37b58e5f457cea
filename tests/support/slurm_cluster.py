"""A real single-node Slurm cluster on this machine, for testing the ``slurm/`` templates.

:func:`ensure_slurm_installed` installs Debian's ``slurm-wlm`` and ``munge``
when they are missing (root and apt-get needed) and returns why not when it
cannot. :class:`LocalSlurm` starts ``munged``, ``slurmctld`` and ``slurmd``
on localhost with everything (config, key, sockets, state, logs) under one
temporary directory and free ports, so it touches no system-wide Slurm, and
stops them again. The node advertises this machine's CPUs and two GPUs as a
count-only GRES (no device files) so the GPU templates can be scheduled.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("slurmctld", "slurmd", "munged", "sbatch", "scontrol", "sinfo")
INSTALL_TIMEOUT = 900


def _missing() -> list[str]:
    return [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def _binary(name: str) -> str:
    found = shutil.which(name)
    return found if found else str(Path("/usr/sbin", name))


def ensure_slurm_installed() -> str | None:
    """Install slurm-wlm and munge when absent; None when ready, else the reason they cannot be."""
    if not _missing():
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"Slurm programs {_missing()} are missing and cannot be installed here (needs root and apt-get)"
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", "slurm-wlm", "munge"]
    result = subprocess.run(install, capture_output=True, text=True, env=environment, timeout=INSTALL_TIMEOUT)
    if result.returncode != 0:  # a fresh machine may need the package lists first
        subprocess.run(["apt-get", "update"], capture_output=True, env=environment, timeout=INSTALL_TIMEOUT)
        result = subprocess.run(install, capture_output=True, text=True, env=environment, timeout=INSTALL_TIMEOUT)
    if result.returncode != 0 or _missing():
        return f"apt-get could not install slurm-wlm and munge: {result.stderr.strip()[-400:]}"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalSlurm:
    """``with LocalSlurm(tmp) as slurm: job = slurm.sbatch(...)``: a private one-node cluster."""

    def __init__(self, root: Path, cpus: int | None = None, gpus: int = 2) -> None:
        self.root = Path(root)
        self.cpus = cpus or os.cpu_count() or 1
        self.gpus = gpus
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for key in list(self.env):  # a test run inside a real allocation must not leak into this cluster
            if key.startswith("SLURM_") and key != "SLURM_CONF":
                del self.env[key]

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "LocalSlurm":
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start(self) -> None:
        munge = self.root / "munge"
        for folder in (munge, self.root / "state", self.root / "spool", self.root / "log"):
            folder.mkdir(parents=True, exist_ok=True)
        munge.chmod(0o755)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        subprocess.run([_binary("munged"), "--force", f"--socket={self.munge_socket}", f"--key-file={key}",
                        f"--log-file={self.root / 'log' / 'munged.log'}", f"--pid-file={munge / 'munged.pid'}",
                        f"--seed-file={munge / 'munged.seed'}"], check=True, capture_output=True, timeout=30)
        self.conf.write_text(self._config())
        # count-only GPUs: slurmd needs a device file per GPU; /dev/null and friends stand in
        fake_devices = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random"][: self.gpus]
        (self.root / "gres.conf").write_text("".join(f"NodeName={self.node} Name=gpu File={device}\n"
                                                     for device in fake_devices))
        subprocess.run([_binary("slurmctld"), "-i"], env=self.env, check=True, capture_output=True, timeout=30)
        subprocess.run([_binary("slurmd")], env=self.env, check=True, capture_output=True, timeout=30)
        self._wait_idle()

    def _config(self) -> str:
        r = self.root
        return "\n".join([
            "ClusterName=sparsedisttest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={self.munge_socket}",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SchedulerType=sched/backfill", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "GresTypes=gpu", "MpiDefault=none", "ReturnToService=2",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "MinJobAge=3600", "KillWait=5", "InactiveLimit=0",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=2000 "
            f"Gres=gpu:{self.gpus} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n"

    def _wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            result = self.command("sinfo", "-h", "-o", "%T", check=False)
            state = result.stdout.strip()
            if state.startswith("idle"):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the test Slurm node did not become idle in {timeout:.0f} s (state {state!r}); "
                           f"logs under {self.root / 'log'}")

    def stop(self) -> None:
        """Cancel jobs, stop slurmctld, slurmd and munged (by their pid files): SIGTERM to all three at once,
        SIGKILL to any still alive after 10 s."""
        if self.conf.exists():
            self.command("scancel", "--user", "root", check=False)
        pids = []
        for pid_file in (self.root / "slurmd.pid", self.root / "slurmctld.pid", self.root / "munge" / "munged.pid"):
            try:
                pids.append(int(pid_file.read_text().strip()))
            except (OSError, ValueError):
                continue
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
                time.sleep(0.05)
            pids = [pid for pid in pids if _alive(pid)]
            if not pids:
                break

    # ------------------------------------------------------------- commands
    def command(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([_binary(argv[0]), *argv[1:]], env=self.env, capture_output=True, text=True,
                              check=check, timeout=timeout)

    def sbatch(self, script: Path, *options: str, export: dict[str, str], cwd: Path) -> int:
        """Submit ``script`` from ``cwd`` with ``--export=ALL,K=V...``; returns the job id."""
        exported = ",".join(["ALL", *(f"{k}={v}" for k, v in export.items())])
        result = subprocess.run([_binary("sbatch"), "--parsable", f"--export={exported}", *options, str(script)],
                                env=self.env, cwd=cwd, capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise RuntimeError(f"sbatch {script.name} failed: {result.stderr.strip()}")
        return int(result.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job`` as a dict (JobState, ExitCode, RunTime, StdOut, ...)."""
        text = self.command("scontrol", "show", "job", "-o", str(job_id)).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job_id: int, timeout: float) -> dict[str, str]:
        """Poll until the job ends; a job still running at ``timeout`` is cancelled and reported."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.job(job_id)
            if info.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return info
            if time.monotonic() > deadline:
                self.command("scancel", str(job_id), check=False)
                raise TimeoutError(f"Slurm job {job_id} still {info.get('JobState')} after {timeout:.0f} s "
                                   f"(reason {info.get('Reason')}); cancelled")
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
