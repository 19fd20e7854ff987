"""jobs/train.sbatch under a real Slurm: the time-limit signal saves a checkpoint, the
script requeues the job, and the next start resumes from it.

The test sends SIGUSR1 itself (``scancel --signal=USR1``: what ``#SBATCH
--signal=USR1@120`` makes Slurm send two minutes before the limit), twice: the first
start stops, saves and requeues; the second resumes, stops, saves and, with
HPCDP_MAX_REQUEUE=1, ends the job. Slurm holds a requeued job for about two minutes
before it may start again; the test lifts that hold (``scontrol update
StartTime=now``) instead of waiting.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from slurm_jobs import Job, venv_python

CONFIG = """
[run]
name = "requeue-test"
log_every = 1
[model]
kind = "mlp"
sizes = [32, 48, 8]
[data]
kind = "synthetic_classification"
n_samples = 512
[train]
steps = 1000000
global_batch = 32
[parallel]
strategy = "ddp"
"""


def _steps(run_dir: Path) -> list[int]:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return []
    return [json.loads(x)["step"] for x in metrics.read_text().splitlines() if '"step"' in x]


def _wait(what: str, ok, timeout: float = 150, tmp: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ok()
        if value:
            return value
        time.sleep(0.5)
    said = ""
    if tmp is not None:  # what the job and Slurm say: the output's tail, the queue, the node
        outs = sorted(tmp.glob("job-*.out"))
        said = "\n" + (outs[-1].read_text()[-3000:] if outs else "(no job output)")
        for cmd in (["squeue", "-h", "-o", "%i %T %r"], ["sinfo", "-h", "-N", "-o", "%N %T"]):
            said += "\n" + subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
    pytest.fail(f"timed out after {timeout} s waiting for {what}{said}")


def _state(job_id: str) -> str:
    r = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=20)
    return r.stdout.strip()


def _node_busy_ending_a_job() -> bool:
    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=20)
    return r.returncode != 0 or "completing" in r.stdout


def test_time_limit_signal_saves_requeues_and_resumes(slurm, tmp_path):
    from hpcdp.io.interop.inspect import verify

    cfg = tmp_path / "job.toml"
    cfg.write_text(CONFIG)
    runs = tmp_path / "runs"
    job = Job(tmp_path, ["-n", "2"], ["--config", str(cfg)],
              {"HPCDP_PYTHON": venv_python(), "HPCDP_RUN_ROOT": str(runs), "HPCDP_MAX_REQUEUE": "1",
               "HPCDP_SET": None, "HPCDP_LAUNCHER": None})
    try:
        job_id = _wait("the job id", lambda: (tmp_path / "sbatch.stdout").read_text().strip().split(";")[0], 30)
        first, second = runs / f"slurm-{job_id}", runs / f"slurm-{job_id}-r1"
        _wait("3 steps of the first start", lambda: len(_steps(first)) >= 3, tmp=tmp_path)
        subprocess.run(["scancel", "--signal=USR1", job_id], check=True, timeout=20)
        _wait("the requeued job to be pending", lambda: _state(job_id) == "PENDING")
        # Lifting Slurm's hold too early makes the controller start the job again at once
        # and slurmd refuse it ("Job credential revoked": the job fails): while the node
        # still cleans up the first start, and also in the second the requeue revoked the
        # job's credential, as slurmd compares the new credential's time with the
        # revocation's in whole seconds (seen 0.5 s after the first start ended, 1 of 21
        # runs). Slurm's own hold (about 2 minutes) never races; this shortcut must wait.
        _wait("the node to finish ending the first start", lambda: not _node_busy_ending_a_job())
        time.sleep(2.0)
        subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=True, timeout=20)
        stop1 = int((first / "stopped").read_text().split()[1])
        _wait("3 steps of the second start", lambda: len(_steps(second)) >= 3, tmp=tmp_path)
        subprocess.run(["scancel", "--signal=USR1", job_id], check=True, timeout=20)
        job.wait(timeout=180)
    finally:
        job.cancel()
    job.expect(0)
    out = job.output
    ckpts = runs / f"slurm-{job_id}" / "checkpoints"
    stop2 = int((second / "stopped").read_text().split()[1])
    assert f"stopped by SIGUSR1 after step {stop1}: checkpoint saved in {ckpts}/step-{stop1:08d}" in out
    assert "requeueing" in out and f"resuming from the newest checkpoint in {ckpts}" in out
    assert f"resumed from {ckpts}/step-{stop1:08d}: step {stop1}" in out
    assert "not requeued: HPCDP_MAX_REQUEUE=1 restarts reached" in out
    assert _steps(first)[-1] == stop1 and _steps(second)[0] == stop1 + 1 and _steps(second)[-1] == stop2
    for step in (stop1, stop2):
        assert verify(ckpts / f"step-{step:08d}")[0] == []
