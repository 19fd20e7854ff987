"""jobs/train_continue.sbatch under the real one-node Slurm: sbatch --wait, 3 tasks, DDP on
the digits with failure.on_rank_loss = "continue" (Open MPI 5's mpirun --with-ft ulfm inside
the allocation, from the ULFM venv of tests/ulfm/setup_venv_ulfm.sh). Rank 2 is killed
with SIGKILL at step 5 (HPCDP_FAULT); the job must finish its 12 steps on the 2 survivors,
with one repair line, a run directory named after the Slurm job id and exit status 0.
tests/ulfm/test_ulfm_jobs.py runs the same script outside Slurm."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_jobs import REPO, Job

VENV = REPO / os.environ.get("HPCDP_ULFM_VENV", ".venv-ulfm")


def test_continue_job_finishes_under_slurm_after_a_rank_is_killed(slurm, tmp_path):
    if not (VENV / "bin" / "mpirun").exists():
        pytest.skip(f"no Open MPI venv at {VENV}: run bash tests/ulfm/setup_venv_ulfm.sh (tests/run_all.sh does)")
    env = {"HPCDP_ULFM_VENV": str(VENV), "HPCDP_RUN_ROOT": str(tmp_path / "runs"), "HPCDP_FAULT": "2:5:kill",
           "HPCDP_SET": "train.steps=12 run.log_every=1 run.eval_every=0 comm.timeout=30",
           "HPCDP_MPIEXEC_ARGS": "--oversubscribe", "HPCDP_PYTHON": None, "PYTHONPATH": None,
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    job = Job(tmp_path, ["-n", "3"], ["--config", "jobs/digits_ddp.toml"], env,
              script=REPO / "jobs" / "train_continue.sbatch").wait(timeout=200)
    job.expect(0)
    out = job.output
    assert f"hpcdp job {job.job_id}: 3 rank(s)" in out and " --with-ft ulfm -n 3 " in out, out
    assert "hpcdp: injected fault (HPCDP_FAULT: kill on rank 2 at step 5)" in out, out
    repairs = [ln for ln in out.splitlines() if ln.startswith("repair: rank 2 lost at step 5; 3 -> 2 ranks")]
    assert len(repairs) == 1, out
    assert "step 12/12" in out and not [ln for ln in out.splitlines() if ln.startswith("hpcdp: error:")], out
    run_dir = tmp_path / "runs" / f"slurm-{job.job_id}"
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert [r["repair"]["lost_ranks"] for r in recs if "repair" in r] == [[2]]
    assert max(r["step"] for r in recs if "loss" in r) == 12
