"""A save that fails while training runs (one rank, real files, real limits):

- the file-size limit (``ulimit -f``: RLIMIT_FSIZE, EFBIG) stops the run with one line
  that says which save failed and what to do, exit status 1 (a failure, not bad input);
- a background save that failed is said at the next step; ``checkpoint.on_save_error``
  stops the run there ("stop") or trains on and saves again ("continue");
- a checkpoint folder this job cannot write is one line naming it (as root a
  folder is made unwritable with ``chattr +i``; skipped where that is not possible).
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp.launch import THREAD_ENV

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--set", 'data.kind="synthetic_classification"', "--set", "run.eval_every=0"]


def _train(tmp, *args, preexec_fn=None):
    cmd = [sys.executable, "-m", "hpcdp.cli", "train", *SMALL, "--set", f'run.out_dir="{tmp / "run"}"', *args]
    return subprocess.run(cmd, env={**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}, cwd=tmp,
                          capture_output=True, text=True, timeout=300, preexec_fn=preexec_fn)


def _errors(proc) -> list:
    return [x for x in proc.stderr.splitlines() if x.startswith("hpcdp: error:")]


def test_a_save_that_hits_the_file_size_limit_fails_with_its_own_line_and_status_1(tmp_path):
    from hpcdp.io.format.commit import list_checkpoints

    limit = 16 << 20  # the rank file of 5.4 M float32 parameters is 21 MB

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = _train(tmp_path, "--set", "model.sizes=[32, 131072, 8]", "--set", "train.steps=4",
                  "--set", "checkpoint.every=2", preexec_fn=small_files)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = _errors(proc)
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "the checkpoint of step 2 could not be saved in" in errors[0]
    assert f"file-size limit (ulimit -f: {limit} bytes)" in errors[0]
    assert "Traceback" not in proc.stderr
    assert [ok for _, _, ok in list_checkpoints(tmp_path / "run" / "checkpoints")] in ([], [False])


@pytest.mark.parametrize("mode", ["stop", "continue"])
def test_a_background_save_that_failed_is_said_at_once(tmp_path, mode):
    from hpcdp.io.format.commit import list_checkpoints

    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / ".step-00000010.tmp").write_text("")  # where the save of step 10 must make its folder
    proc = _train(tmp_path, "--set", "model.sizes=[32, 64, 8]", "--set", "train.steps=40",
                  "--set", "run.log_every=1", "--set", "checkpoint.every=10", "--set", "checkpoint.asynchronous=true",
                  "--set", f'checkpoint.dir="{ck}"', "--set", f'checkpoint.on_save_error="{mode}"')
    said = "the checkpoint of step 10 could not be saved in"
    if mode == "stop":
        assert proc.returncode == 1, proc.stderr[-3000:]
        errors = _errors(proc)
        m = re.match(r"hpcdp: error: at step (\d+): " + re.escape(said), errors[0]) if len(errors) == 1 else None
        assert m, proc.stderr[-3000:]
        at = int(m.group(1))  # the first step that ends after the background thread failed
        assert 11 <= at <= 20 and f"(written in the background); the run stops after step {at}" in errors[0]
        assert list_checkpoints(ck) == []
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
        warned = [x for x in proc.stdout.splitlines() if said in x]
        assert len(warned) == 1 and "training goes on" in warned[0] and "the next save is at step 20" in warned[0]
        assert [(s, ok) for s, _, ok in list_checkpoints(ck)] == [(20, True), (30, True), (40, True)]


def test_a_checkpoint_folder_this_job_cannot_write_is_one_line(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    if subprocess.run(["chattr", "+i", str(ck)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        if os.access(ck, os.W_OK) and _can_create(ck):
            pytest.skip("the folder is still writable here")
        proc = _train(tmp_path, "--set", "model.sizes=[32, 64, 8]", "--set", "train.steps=4",
                      "--set", f'checkpoint.dir="{ck}"')
    finally:
        subprocess.run(["chattr", "-i", str(ck)], capture_output=True)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _errors(proc) == [f"hpcdp: error: checkpoint.dir = {str(ck)!r}: cannot write in it (Operation not "
                             "permitted): the run's checkpoints are saved there; choose a folder this job can "
                             "write"], proc.stderr[-3000:]


def _can_create(folder: Path) -> bool:
    try:
        (folder / "probe").write_text("")
    except OSError:
        return False
    (folder / "probe").unlink()
    return True
