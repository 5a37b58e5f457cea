"""The slow lane's fuzz campaign: the main lane's property (any mutation of any input format is read or refused in
one sentence) over hundreds of cases a format, in a subprocess under an address-space limit, so that a crash
(a signal) or an allocation beyond the limit is a failing test with its output, not a dead pytest worker; and
mutated checkpoints resumed end to end by ``sparse-dist train --resume``."""

from __future__ import annotations

import random
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from datasets_for_tests import random_directed, write
from input_mutations import FORMATS, apply, random_mutation
from mpirun import BIN, ROOT, run_mpi

CAMPAIGN_CASES = 200
CAMPAIGN_SEED = 20261128
ADDRESS_SPACE = 8 << 30
"""Bytes of virtual memory the campaign's process may map: torch and numba map about 3 GiB on import; a
reader that believed a forged header (10^12 entries) would ask for terabytes and fail here."""
SPARSE_DIST = str(BIN / "sparse-dist")


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.mark.slow
def test_the_campaign_reads_or_refuses_every_case_under_an_address_space_limit() -> None:
    env = {"SPARSE_DIST_FUZZ_CASES": str(CAMPAIGN_CASES), "SPARSE_DIST_FUZZ_SEED": str(CAMPAIGN_SEED),
           "PATH": str(BIN), "OMP_NUM_THREADS": "1", "HOME": str(Path.home()),
           # the campaign reads inputs in its own process: no launches, so no zygotes (eight torch imports)
           "SPARSE_DIST_TEST_PRELOAD": "off", "SPARSE_DIST_TEST_IDLE_SLEEP": "off"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:xdist", "-p", "no:cacheprovider",
                             str(ROOT / "tests" / "unit" / "runners" / "test_fuzz_inputs.py")],
                            cwd=ROOT, env=env, preexec_fn=_limited, capture_output=True, text=True, timeout=1200)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-6000:]
    counts = dict(re.findall(r"fuzz (\w+): (\d+) cases", said))
    assert counts == {fmt: str(CAMPAIGN_CASES // 2 if fmt == "ogb" else CAMPAIGN_CASES)
                      for fmt in FORMATS if fmt != "checkpoint"}, said[-3000:]


@pytest.mark.slow
def test_mutated_checkpoints_resume_or_are_refused_in_one_sentence(tmp_path: Path) -> None:
    """Eight mutations of a checkpoint set's main file (bytes or one weight; digests rewritten or not), each
    resumed at P = 2: the run goes on (exit 0) or exit 2 with one line naming the checkpoint; never a signal."""
    data = write(random_directed(n=80), tmp_path / "d", parts=2, partitioner="block")
    pristine = tmp_path / "pristine"
    pristine.mkdir()
    argv = [SPARSE_DIST, "train", "--data", str(data), "--hidden", "8", "--checkpoint-every", "1"]
    first = run_mpi(1, [*argv, "--epochs", "2", "--checkpoint", str(pristine / "run.ckpt"),
                        "--out", str(tmp_path / "first.jsonl")], timeout=120)
    assert first.returncode == 0, first.stdout + first.stderr
    rng = random.Random(CAMPAIGN_SEED)
    outcomes = []
    for case in range(8):
        directory = tmp_path / f"case{case}"
        shutil.copytree(pristine, directory, symlinks=True)
        mutation = random_mutation(rng, "checkpoint")
        apply(mutation, data, checkpoint=directory / "run.ckpt")
        result = run_mpi(2, [*argv, "--epochs", "3", "--resume", "--checkpoint", str(directory / "run.ckpt"),
                             "--out", str(directory / "r.jsonl")], timeout=120)
        lines = result.stderr.strip().splitlines()
        assert result.returncode in (0, 2), (mutation, result.returncode, result.stderr[-3000:])
        if result.returncode == 2:
            assert len(lines) == 1 and "run.ckpt" in lines[0] and "Traceback" not in lines[0], (mutation, lines)
        outcomes.append(result.returncode)
    assert 2 in outcomes, outcomes
