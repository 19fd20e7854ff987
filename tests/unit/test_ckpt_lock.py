"""One writing job per checkpoint folder (hpcdp/io/lock.py), and the checks a run
makes before it reads data or makes its run directory: a live holder's lock is
refused with one line naming job, host and pid; a dead one's is taken over; a bad
``--resume`` target leaves nothing behind; a resumed run logs its first step. Also:
``ckpt ls`` of a run directory whose checkpoints went elsewhere says where. The
takeover is atomic (two processes racing for a stale lock: one takes it), an empty lock
does not block the folder, and a second ``hpcdp train`` cannot write into another run's
checkpoint folder (its run directory's included). Wall time: about 25 s."""

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
    import hpcdp.io.lock as lockmod
    monkeypatch.setattr(lockmod, "WATCH_S", 1.5)  # watched this long (30 s in a job)
    path = tmp_path / LOCK_FILE
    proc = _sleeper()
    try:
        line = _lock_of(proc, host="node-elsewhere", slurm="41")
        path.write_text(line)
    finally:
        proc.kill()
        proc.wait()
    # its holder touches it (a live job on another host): refused once a touch is seen
    beat = subprocess.Popen([sys.executable, "-c", "import os, sys, time\n"
                             "while True: os.utime(sys.argv[1]); time.sleep(0.1)", str(path)])
    try:
        with pytest.raises(CheckpointError, match="host node-elsewhere.*Slurm job 41"):
            acquire(tmp_path, "me")
    finally:
        beat.kill()
        beat.wait()
    monkeypatch.setenv("SLURM_JOB_ID", "41")  # a requeued attempt of the same job: at once
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    t0 = time.monotonic()
    lock = acquire(tmp_path, "me", keeper=False)
    assert "earlier attempt of this Slurm job (41, restart 0)" in lock.took_over
    assert time.monotonic() - t0 < 1.5  # not watched
    lock.release()
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    path.write_text(line)  # untouched: stale after the watch
    lock = acquire(tmp_path, "me", keeper=False)
    assert "heartbeat stopped (not touched for 2 s)" in lock.took_over
    lock.release()
    path.write_text(line)
    old = time.time() - STALE_S - 60
    os.utime(path, (old, old))
    lock = acquire(tmp_path, "me", keeper=False)  # old by our clock: no watching
    assert "heartbeat stopped 16 min ago" in lock.took_over
    lock.release()


def test_an_empty_lock_file_does_not_block_the_folder(tmp_path):
    (tmp_path / LOCK_FILE).write_text("")
    old = time.time() - 30
    os.utime(tmp_path / LOCK_FILE, (old, old))
    lock = acquire(tmp_path, "me")
    assert "an empty lock file" in lock.took_over and "no line hpcdp writes" in lock.took_over
    assert "token" in (tmp_path / LOCK_FILE).read_text()
    lock.release()


RACER = r"""
import sys, time
import hpcdp.io.lock as L
from hpcdp.io.errors import CheckpointError
judge = L.stale_reason
def slow(*a, **k):  # widen the window between judging the lock stale and taking it over
    reason = judge(*a, **k)
    time.sleep(0.5)
    return reason
L.stale_reason = slow
go = float(sys.argv[2])
while time.time() < go:
    time.sleep(0.002)
try:
    lock = L.acquire(sys.argv[1], "racer")
except CheckpointError as e:
    print("refused", flush=True)
    sys.exit(0)
print("took", flush=True)
time.sleep(2.0)  # hold it while the other one tries
lock.release()
"""


def test_two_jobs_racing_for_a_stale_lock_one_takes_it(tmp_path):
    """Two restarts of a crashed job judge its lock stale at the same moment: exactly
    one takes the folder (before: each removed what was there, the other's fresh lock
    too, and both wrote into the folder)."""
    proc = _sleeper()
    line = _lock_of(proc)
    proc.kill()
    proc.wait()
    for _ in range(2):
        (tmp_path / LOCK_FILE).write_text(line)  # a crashed job's lock
        go = time.time() + 1.0
        racers = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), str(go)], stdout=subprocess.PIPE,
                                   text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}) for _ in range(2)]
        said = sorted(r.communicate(timeout=60)[0].strip() for r in racers)
        assert said == ["refused", "took"], said
        assert not (tmp_path / LOCK_FILE).exists()
        assert not list(tmp_path.glob(LOCK_FILE + ".*")), list(tmp_path.iterdir())  # no claim, no private file


def test_a_job_whose_lock_was_taken_over_does_not_save(tmp_path):
    import hpcdp.io.lock as lockmod
    lock = acquire(tmp_path, "me", keeper=False)
    assert lockmod.check_held(tmp_path) is None
    other = tmp_path / "other"
    other.write_text(holder_line("thief", "f" * 32).replace("host ", "host node-elsewhere-"))
    os.rename(other, tmp_path / LOCK_FILE)  # as a takeover does
    with pytest.raises(CheckpointError, match="this job's lock was taken over by job thief"):
        lockmod.check_held(tmp_path)
    lock.release()
    assert (tmp_path / LOCK_FILE).exists()  # not ours: left alone


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


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "T"
    except OSError:
        return False


def test_a_second_job_cannot_write_into_another_runs_checkpoints(tmp_path):
    """Job A saves into its run directory; job B is pointed at A's checkpoints folder:
    refused while A runs (its lock), and after A ended (A's checkpoints are there: B's
    saves of the same steps would replace them). Before: B trained and replaced A's
    steps, both exiting 0. Also: A killed outright leaves no lock behind."""
    from hpcdp.launch import THREAD_ENV

    args = ["train", "--set", "train.steps=6", "--set", "train.epochs=0", "--set", "run.eval_every=0",
            "--set", "checkpoint.every=1"]
    env = {**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}
    a = subprocess.Popen([sys.executable, "-m", "hpcdp.cli", *args, "--set", 'run.out_dir="runA"'], cwd=tmp_path,
                         env={**env, "HPCDP_FAULT": "0:3:stop"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    try:
        deadline = time.monotonic() + 180
        while not _stopped(a.pid):  # stopped at step 3: steps 1 and 2 saved
            assert a.poll() is None and time.monotonic() < deadline, a.communicate()[0][-3000:]
            time.sleep(0.1)
        ck = tmp_path / "runA" / "checkpoints"
        assert (ck / "step-00000002" / "COMMITTED").is_file() and (ck / LOCK_FILE).is_file()
        b_args = [*args, "--set", 'checkpoint.dir="runA/checkpoints"', "--set", 'run.out_dir="runB"']
        b = _hpcdp(tmp_path, *b_args)
        err = b.stderr.strip().splitlines()
        assert b.returncode == 2 and len(err) == 1 and "is in use by another job" in err[0], b.stderr[-3000:]
        assert f"pid {a.pid}" in err[0] and not (tmp_path / "runB").exists()
    finally:
        a.kill()
        a.wait()
    deadline = time.monotonic() + 10  # A's keeper removes its lock once A is gone
    while (ck / LOCK_FILE).exists():
        assert time.monotonic() < deadline, "the lock of a killed job was left behind"
        time.sleep(0.05)
    index = (ck / "step-00000002" / "index.h5").read_bytes()
    b = _hpcdp(tmp_path, *b_args)
    err = b.stderr.strip().splitlines()
    assert b.returncode == 2 and len(err) == 1, b.stderr[-3000:]
    assert ("step-00000002 there was written by another training run (run directory runA)" in err[0]
            and "--resume runA/checkpoints" in err[0]), err
    assert (ck / "step-00000002" / "index.h5").read_bytes() == index and not (tmp_path / "runB").exists()
    assert not (ck / LOCK_FILE).exists()
    # the last guard, at the commit itself: a save of step 2 by another run is refused
    from hpcdp.io.format.commit import commit, prepare
    tmp = prepare(ck, 2)
    with pytest.raises(CheckpointError, match="would replace it with its step 2"):
        commit(tmp, 2, lineage="another-run")
    assert (ck / "step-00000002" / "index.h5").read_bytes() == index and not tmp.exists()
    # continuing A's run in its folder is what the line advises: that works
    c = _hpcdp(tmp_path, *b_args[:-2], "--set", 'run.out_dir="runC"', "--resume", "runA/checkpoints")
    assert c.returncode == 0, c.stderr[-3000:]
    assert "resumed from runA/checkpoints/step-00000002" in c.stdout
