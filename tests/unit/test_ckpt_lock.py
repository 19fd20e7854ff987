"""One writing job per checkpoint folder (hpcdp/io/lock.py), and the checks a run
makes before it reads data or makes its run directory: a live holder's lock is
refused with one line naming job, host and pid; a dead one's is taken over; a bad
``--resume`` target leaves nothing behind; a resumed run logs its first step. Also:
``ckpt ls`` of a run directory whose checkpoints went elsewhere says where. Wall
time: about 15 s."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdp.io.errors import CheckpointError
from hpcdp.io.lock import LOCK_FILE, STALE_S, acquire, holder_line

ROOT = Path(__file__).resolve().parents[2]


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _lock_of(proc, job="other-job", host=None, slurm="-") -> str:
    """The line a job running as ``proc`` would have written."""
    line = holder_line(job).split()
    fields = dict(zip(line[0::2], line[1::2]))
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    fields.update(pid=str(proc.pid), start=stat.rpartition(")")[2].split()[19], slurm=slurm)
    if host:
        fields["host"] = host
    return " ".join(f"{k} {v}" for k, v in fields.items()) + "\n"


def test_a_live_holder_is_refused_and_a_dead_ones_lock_taken_over(tmp_path):
    proc = _sleeper()
    try:
        (tmp_path / LOCK_FILE).write_text(_lock_of(proc))
        with pytest.raises(CheckpointError) as e:
            acquire(tmp_path, "me")
        msg = str(e.value)
        assert f"pid {proc.pid}" in msg and socket.gethostname() in msg and "job other-job" in msg
        assert "--set checkpoint.dir" in msg and "\n" not in msg
    finally:
        proc.kill()
        proc.wait()
    lock = acquire(tmp_path, "me")
    assert f"process {proc.pid} on this host has ended" in lock.took_over
    assert f"pid {os.getpid()}" in (tmp_path / LOCK_FILE).read_text()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_another_hosts_lock_is_stale_once_its_heartbeat_stops(tmp_path, monkeypatch):
    path = tmp_path / LOCK_FILE
    proc = _sleeper()
    try:
        line = _lock_of(proc, host="node-elsewhere", slurm="41")
        path.write_text(line)
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(CheckpointError, match="host node-elsewhere.*Slurm job 41"):
        acquire(tmp_path, "me")  # fresh heartbeat: maybe alive
    monkeypatch.setenv("SLURM_JOB_ID", "41")  # a requeued attempt of the same job
    lock = acquire(tmp_path, "me")
    assert "earlier attempt of this Slurm job (41)" in lock.took_over
    lock.release()
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    path.write_text(line)
    old = time.time() - STALE_S - 60
    os.utime(path, (old, old))
    lock = acquire(tmp_path, "me")
    assert "heartbeat stopped" in lock.took_over
    lock.release()


def _hpcdp(cwd, *args):
    from hpcdp.launch import THREAD_ENV

    return subprocess.run([sys.executable, "-m", "hpcdp.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}, timeout=300)


JOB = ["train", "--set", "train.steps=2", "--set", "train.epochs=0", "--set", "run.eval_every=0",
       "--set", 'run.out_dir="run"', "--set", 'checkpoint.dir="ck"']


def test_train_refuses_a_folder_in_use_and_a_bad_resume_before_anything(tmp_path, capsys):
    (tmp_path / "ck").mkdir()
    proc = _sleeper()
    try:
        (tmp_path / "ck" / LOCK_FILE).write_text(_lock_of(proc))
        run = _hpcdp(tmp_path, *JOB)
        assert run.returncode == 2, run.stderr
        err = run.stderr.strip().splitlines()
        assert len(err) == 1 and "is in use by another job" in err[0] and f"pid {proc.pid}" in err[0], err
        assert not (tmp_path / "run").exists()  # refused before the run directory
    finally:
        proc.kill()
        proc.wait()
    run = _hpcdp(tmp_path, *JOB)  # the holder is gone: taken over, said in the log
    assert run.returncode == 0, run.stderr[-2000:]
    assert "took over a stale lock" in run.stdout and f"pid {proc.pid}" in run.stdout
    assert not (tmp_path / "ck" / LOCK_FILE).exists()  # released at the end
    # resumed into one more step: that first step has its log line (and memory line)
    run = _hpcdp(tmp_path, *JOB, "--set", "train.steps=3", "--set", 'run.out_dir="run1"', "--resume", "latest")
    assert run.returncode == 0, run.stderr[-2000:]
    assert re.search(r"^step +3/3 +loss", run.stdout, re.M) and "memory @ step 3" in run.stdout, run.stdout
    # a --resume target that holds no checkpoint: refused before data and run directory
    (tmp_path / "docs").mkdir()
    run = _hpcdp(tmp_path, "train", "--set", 'run.out_dir="run2"', "--resume", "docs")
    assert run.returncode == 2
    assert run.stderr.strip() == ("hpcdp: error: --resume docs: no complete checkpoint: docs holds no step-* "
                                  "checkpoint; train without --resume, or point it at a step-* directory")
    assert not (tmp_path / "run2").exists()
    (tmp_path / "plain").mkdir()  # a run directory of a run without checkpoints
    (tmp_path / "plain" / "config.toml").write_text("[checkpoint]\nevery = 0\ndir = \"\"\n")
    from hpcdp.commands.ckpt import main as ckpt_main
    assert ckpt_main(["ls", str(tmp_path / "plain")]) == 2
    assert "whose run saved no checkpoints" in capsys.readouterr().err
    # ckpt ls / --resume of the run directory: its checkpoints went to checkpoint.dir
    for args in (["ckpt", "ls", "run"], ["train", "--resume", "run", "--set", 'run.out_dir="run3"']):
        out = _hpcdp(tmp_path, *args)
        assert out.returncode == 2 and "checkpoint.dir = 'ck'" in out.stderr and "hpcdp ckpt ls ck" in out.stderr
