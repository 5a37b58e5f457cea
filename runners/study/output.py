"""Whose is a study's ``output`` directory: the sweep writes only into one it made or marked as its own.

The first sweep of a study writes ``OUTPUT/.sparse-dist-sweep.json`` (``{"written_by": "sparse-dist sweep",
"study": NAME}``) before anything else, into an output that is absent or empty. Later sweeps of the same
study (resuming, ``--collect-only``) find it and go on; an output that holds anything without that mark,
or the mark of another study, is refused in one sentence, so a ``results.csv`` or ``runs.jsonl`` the user
keeps there is never replaced, unless the study file says ``overwrite = true`` in ``[study]`` (the sweep
then marks the directory as its own and replaces its ``results.csv`` and ``runs.jsonl``; nothing else of
the user's there is touched). While a sweep runs, it holds the lock beside ``OUTPUT/results.csv``
(:mod:`runners.output_lock`, taken in :func:`runners.sweep_cmd.main`), so a second sweep of the same output is
refused rather than running every run twice into the same files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from runners.study.spec import Study

MARKER = ".sparse-dist-sweep.json"
WRITER = "sparse-dist sweep"


def _marked_by(output: Path) -> str | None:
    """The study name the marker of ``output`` gives, or None (no marker, or not one the sweep wrote)."""
    marker = output / MARKER
    if marker.is_symlink() or not marker.is_file():
        return None
    try:
        record = json.loads(marker.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, OSError):
        return None
    if not isinstance(record, dict) or record.get("written_by") != WRITER or not isinstance(record.get("study"), str):
        return None
    return record["study"]


def output_problem(study: Study) -> str | None:
    """Why the sweep may not write ``study.output`` (one sentence naming it and the study file), or None."""
    output = study.output
    if (output.exists() or output.is_symlink()) and not output.is_dir():
        return f"{study.source}: study.output {output} is not a directory; choose another output"
    if not output.exists() or not any(output.iterdir()):
        return None
    owner = _marked_by(output)
    if owner == study.name or study.overwrite:
        return None
    entries = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in output.iterdir())
    shown = ", ".join(entries[:3]) + (f", ... ({len(entries)} entries in all)" if len(entries) > 3 else "")
    whose = (f"the results of another study, {owner!r}" if owner is not None
             else f"files this study's sweep did not write ({shown})")
    return (f"{study.source}: study.output {output} holds {whose}, so nothing was written there; choose another "
            f"output, or set overwrite = true in [study] to let the sweep replace its results.csv and runs.jsonl "
            f"there")


def claim_output(study: Study) -> None:
    """Create ``study.output`` if needed and mark it as this study's (under a temporary name, then renamed);
    call once :func:`output_problem` found nothing."""
    study.output.mkdir(parents=True, exist_ok=True)
    if _marked_by(study.output) == study.name:
        return
    temporary = study.output / f"{MARKER}.tmp-{os.getpid()}"
    try:
        temporary.write_text(json.dumps({"written_by": WRITER, "study": study.name}) + "\n")
        os.replace(temporary, study.output / MARKER)
    finally:
        temporary.unlink(missing_ok=True)
