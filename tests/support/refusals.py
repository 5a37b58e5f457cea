"""A command line refused before MPI starts, as every rank checks it: exit status 2 and one sentence, said once."""

from __future__ import annotations

import pytest

from runners import cli


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``sparse-dist ARGV`` in this process; check it stopped with status 2, one ``error:`` and no traceback;
    return what it said on stderr."""
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == 2
    said = capsys.readouterr().err
    assert said.count("error:") == 1 and "Traceback" not in said, said
    return said
