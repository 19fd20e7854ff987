"""A --resume checkpoint of another model is refused before anything is made: one line,
status 2, no run directory, on one rank as on several (issue 37, item 6)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hpcdp.launch import THREAD_ENV, find_mpiexec

ROOT = Path(__file__).resolve().parents[2]


def _hpcdp(cwd, *args, ranks=1):
    cmd = [sys.executable, "-m", "hpcdp.cli", *args]
    if ranks > 1:
        cmd = [find_mpiexec(), "-n", str(ranks)] + cmd
    return subprocess.run(cmd, env={**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}, cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_a_mismatched_resume_is_one_line_status_2_and_no_run_dir(tmp_path):
    made = _hpcdp(tmp_path, "train", "--set", "model.sizes=[64, 16, 10]", "--set", "train.steps=1",
                  "--set", 'checkpoint.dir="ck-small"', "--set", 'run.out_dir="small"')
    assert made.returncode == 0, made.stdout + made.stderr
    for ranks in (2, 1):
        r = _hpcdp(tmp_path, "train", "--config", str(ROOT / "jobs/digits_ddp.toml"), "--resume", "ck-small",
                   ranks=ranks)
        assert r.returncode == 2, (ranks, r.stdout, r.stderr)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1, (ranks, r.stderr)
        assert re.match(r"hpcdp: error: (rank 0: )?checkpoint ck-small/step-00000001: tensor param/fc0\.weight "
                        r"has shape \(64, 16\) in the checkpoint, \(64, 128\) in this model", lines[0]), lines[0]
        assert not (tmp_path / "runs").exists(), (ranks, list((tmp_path / "runs").iterdir()))
