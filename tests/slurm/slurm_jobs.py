"""Helpers for the job-script tests: submit with sbatch --wait, a tiny DDP config, run checks."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SBATCH_SCRIPT = REPO / "jobs" / "train.sbatch"


class Job:
    """One ``sbatch --wait`` of the job script, started at once and waited for later.

    sbatch --wait polls the controller 2, 10, 42, 74 ... s after submitting, so a job
    that needs 11 s is seen after 42 s: the tests submit all their jobs together and
    the whole file costs about one polling interval instead of one per job.
    """

    def __init__(self, tmp: Path, sbatch_opts, script_args, env_changes: dict,
                 script: Path = SBATCH_SCRIPT, minutes: int = 10):
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        env = dict(os.environ)
        for k, v in env_changes.items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        # The job gets a Slurm limit of ``minutes`` (10 by default: train.sbatch's
        # --signal=USR1@120 would stop a job under a 3-minute limit after 1 minute, and
        # a slow start on a loaded machine then looked like a failure); wait() bounds
        # the test's wait.
        self.cmd = ["sbatch", "--wait", "--parsable", f"--time={minutes}", f"--output={tmp}/job-%j.out",
                    f"--chdir={REPO}", *sbatch_opts, str(script), *script_args]
        self._out, self._err = open(tmp / "sbatch.stdout", "w"), open(tmp / "sbatch.stderr", "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._out, stderr=self._err, env=env, cwd=REPO)
        self.rc = self.job_id = self.output = None

    def _id(self) -> str:
        return (self.tmp / "sbatch.stdout").read_text().strip().split(";")[0]

    def wait(self, timeout: float = 120) -> "Job":
        """Exit code, job id and the job's output file; cancels the job after ``timeout`` s."""
        if self.rc is not None:
            return self
        try:
            self.rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            if self._id():
                subprocess.run(["scancel", self._id()], timeout=30)
            pytest.fail(f"job {self._id() or '?'} did not finish within {timeout} s (cancelled): {self.cmd}")
        finally:
            self._out.close()
            self._err.close()
        self.job_id = self._id()
        assert re.fullmatch(r"\d+", self.job_id), (f"sbatch printed no job id: {self.job_id!r}; "
                                                    f"stderr: {(self.tmp / 'sbatch.stderr').read_text()}")
        log = self.tmp / f"job-{self.job_id}.out"
        self.output = log.read_text() if log.exists() else f"(no output file {log})"
        return self

    def expect(self, rc: int) -> "Job":
        """Fail with the job's whole output (an assert message would be cut short) unless
        the job exited with ``rc``."""
        if self.rc != rc:
            pytest.fail(f"expected exit status {rc}, got {self!r}", pytrace=False)
        return self

    def cancel(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            if self._id():
                subprocess.run(["scancel", self._id()], timeout=30)

    def __repr__(self):
        return f"Job {self.job_id} exit {self.rc}; output:\n{self.output}"


def tiny_config(tmp: Path) -> Path:
    """2-rank DDP on the digits MLP, a few steps: seconds on two cores."""
    p = tmp / "tiny_ddp.toml"
    p.write_text("""
[run]
name = "slurm-test"
seed = 0
log_every = 4
[model]
kind = "mlp"
sizes = [64, 32, 10]
[data]
kind = "digits"
[train]
steps = 40
global_batch = 32
[optim]
kind = "sgd"
lr = 0.2
momentum = 0.9
[parallel]
strategy = "ddp"
[comm]
timeout = 30  # a stuck rank names itself before srun's --wait (60 s) ends the step
""")
    return p


def read_metrics(run_dir: Path):
    """(step records, eval records) of a run's metrics.jsonl."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [x for x in lines if "step" in x], [x["eval"] for x in lines if "eval" in x]


def check_trained_run(run_dir: Path, steps: int, ranks: int) -> None:
    """The run directory of a finished DDP run on ``ranks`` ranks with ``steps`` steps."""
    assert (run_dir / "config.toml").is_file(), f"no config.toml in {run_dir}"
    recs, evals = read_metrics(run_dir)
    assert [r["step"] for r in recs] == list(range(1, steps + 1))
    for r in recs:
        assert math.isfinite(r["loss"])
        assert len(r["ranks"]["samples"]) == ranks, r["ranks"]
        assert sum(r["ranks"]["samples"]) == r["global_batch"]
        if ranks > 1:  # DDP really moved gradients between the ranks
            assert all(b > 0 for b in r["ranks"]["bytes_sent"]), r["ranks"]["bytes_sent"]
    assert evals[-1]["loss"] < 0.8 * recs[0]["loss"], f"the loss did not go down: {recs[0]['loss']} -> {evals[-1]}"
    assert evals and evals[-1]["step"] == steps and 0.0 <= evals[-1]["accuracy"] <= 1.0


def venv_python() -> str:
    return os.environ.get("HPCDP_PYTHON") or sys.executable
