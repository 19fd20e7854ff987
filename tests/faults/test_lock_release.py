"""The checkpoint folder's writer lock is removed when a job fails on a rank other
than 0 (issue: ``HPCDP_FAULT=1:20:raise mpiexec -n 2 hpcdp train --config
jobs/digits_ddp.toml --set checkpoint.dir="ck-f1"`` left ``ck-f1/.hpcdp-writer.lock``,
and a job resubmitted on another node was refused for 15 minutes). The launcher ends
rank 0 with SIGKILL; its keeper process removes the lock. Wall time: about 25 s."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdp.io.lock import LOCK_FILE
from hpcdp.launch import THREAD_ENV, find_mpiexec

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kind", ["raise", "kill"])
def test_a_failure_on_rank_1_leaves_no_lock(kind, tmp_path):
    cmd = [find_mpiexec(), "-n", "2", sys.executable, "-m", "hpcdp.cli", "train", "--config",
           str(ROOT / "jobs" / "digits_ddp.toml"), "--set", 'checkpoint.dir="ck-f1"', "--set", "train.steps=8",
           "--set", 'run.out_dir="run"']
    env = {**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT), "HPCDP_FAULT": f"1:4:{kind}"}
    run = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
                         start_new_session=True)
    assert run.returncode != 0 and "step 4" in run.stdout + run.stderr, (run.stdout + run.stderr)[-3000:]
    lock = tmp_path / "ck-f1" / LOCK_FILE
    deadline = time.monotonic() + 10  # the keeper acts as rank 0 ends: at once
    while lock.exists():
        assert time.monotonic() < deadline, f"{lock} left behind: {lock.read_text()}"
        time.sleep(0.05)
    assert not list((tmp_path / "ck-f1").glob(LOCK_FILE + "*"))
