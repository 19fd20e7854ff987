"""The job scripts of failure.on_rank_loss = "continue", run as a user runs them
(Open MPI 5 of the ULFM venv, tests/ulfm/setup_venv_ulfm.sh): jobs/train_continue_mpirun.sh
and jobs/train_continue.sbatch (outside Slurm: bash, HPCDP_NP) each start DDP on the
digits with 3 ranks, rank 2 is killed with SIGKILL at step 5 (HPCDP_FAULT), and the job
finishes its 12 steps on the 2 survivors with status 0; a launcher that is not Open MPI 5
is refused with one line before anything starts."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / os.environ.get("HPCDP_ULFM_VENV", ".venv-ulfm")  # relative: to the repository root
SETS = "train.steps=12 run.log_every=1 run.eval_every=0 comm.timeout=30"


def _script(tmp_path, script, env_changes, *args):
    if not (VENV / "bin" / "mpirun").exists():
        pytest.skip(f"no Open MPI venv at {VENV}: run bash tests/ulfm/setup_venv_ulfm.sh (tests/run_all.sh does)")
    env = {k: v for k, v in os.environ.items() if k not in ("HPCDP_FAULT", "PYTHONPATH", "HPCDP_PYTHON")}
    env.update({"HPCDP_ULFM_VENV": str(VENV), "HPCDP_RUN_ROOT": str(tmp_path / "runs"), "HPCDP_SET": SETS,
                "HPCDP_MPIEXEC_ARGS": "--oversubscribe", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **env_changes})
    proc = subprocess.run(["bash", str(ROOT / "jobs" / script), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    return proc, proc.stdout + proc.stderr


def _check_went_on(out: str, run_dir: Path) -> None:
    assert "hpcdp: injected fault (HPCDP_FAULT: kill on rank 2 at step 5)" in out, out[-4000:]
    repairs = [ln for ln in out.splitlines() if ln.startswith("repair: rank 2 lost at step 5; 3 -> 2 ranks")]
    assert len(repairs) == 1, out[-4000:]
    assert "step 12/12" in out and not [ln for ln in out.splitlines() if ln.startswith("hpcdp: error:")], out[-4000:]
    recs = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["repair"]["lost_ranks"] for r in recs if "repair" in r] == [[2]]
    assert max(r["step"] for r in recs if "loss" in r) == 12


@pytest.mark.parametrize("script", ["train_continue_mpirun.sh", "train_continue.sbatch"])
def test_the_continue_job_script_finishes_after_a_rank_is_killed(tmp_path, script):
    proc, out = _script(tmp_path, script, {"HPCDP_NP": "3", "HPCDP_JOB_ID": "t1", "HPCDP_FAULT": "2:5:kill"},
                        "--config", "jobs/digits_ddp.toml")
    assert proc.returncode == 0, out[-6000:]
    assert " --with-ft ulfm " in out and 'failure.on_rank_loss="continue"' in out, out[:2000]
    run_dir = Path(re.search(r"; run dir (\S+)", out).group(1))
    assert run_dir.parent == tmp_path / "runs", run_dir
    _check_went_on(out, run_dir)


def test_the_continue_job_scripts_refuse_a_launcher_without_ulfm(tmp_path):
    mpich = Path(os.environ.get("VIRTUAL_ENV", "/nonexistent")) / "bin" / "mpiexec"
    fake = tmp_path / "mpiexec"  # MPICH's answer to --version
    fake.write_text("#!/bin/sh\necho 'HYDRA build details:'\necho '    Version:  4.3.0'\n")
    fake.chmod(0o755)
    for script in ("train_continue_mpirun.sh", "train_continue.sbatch"):
        proc, out = _script(tmp_path, script, {"HPCDP_MPIEXEC": str(mpich if mpich.exists() else fake)})
        assert proc.returncode == 127, out
        said = [ln for ln in out.splitlines() if "error:" in ln]
        assert len(said) == 1 and "is not Open MPI 5" in said[0] and "--with-ft ulfm" in said[0], out
