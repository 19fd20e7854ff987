"""``hpcdp`` without a known command: the list of commands and one error line that
says what was wrong (an unknown command, with the closest one; no command); ``-h``
prints the list with status 0; ``--version`` prints the version."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp import __version__
from hpcdp.cli import main


@pytest.mark.parametrize("argv, last", [(["trian"], "hpcdp: error: unknown command 'trian'; did you mean 'train'?"),
                                        (["xyz"], "hpcdp: error: unknown command 'xyz'"),
                                        ([], "hpcdp: error: no command given")])
def test_an_unknown_or_missing_command_is_named(argv, last, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == last and any(line.strip().startswith("hpcdp train") for line in err)


def test_help_and_version(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr()
    assert "hpcdp ckpt" in out.out and out.err == "" and "error" not in out.out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"hpcdp {__version__}\n"


def test_output_cut_short_by_a_pipe_is_no_traceback():
    """``hpcdp ... | head``: the reader goes away before the output is written; the
    command ends quietly with status 141."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "hpcdp.cli", "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(root)})
    proc.stdout.close()  # like `| head -0`: nobody reads
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err
