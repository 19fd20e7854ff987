"""jobs/train_mpirun.sh with the venv's mpiexec (no Slurm): 2 ranks, DDP, digits MLP."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from slurm_jobs import REPO, check_trained_run, tiny_config, venv_python

SCRIPT = REPO / "jobs" / "train_mpirun.sh"


def run_script(args, env_changes: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "HPCDP_TIMEOUT": "100", **env_changes}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def test_mpirun_script_trains_two_ranks(tmp_path):
    runs = tmp_path / "runs"
    r = run_script(["--config", str(tiny_config(tmp_path)), "--set", "train.steps=12"],
                   {"HPCDP_NP": "2", "HPCDP_JOB_ID": "t1", "HPCDP_RUN_ROOT": str(runs),
                    "HPCDP_PYTHON": venv_python(), "HPCDP_SET": "run.log_every=6"})
    assert r.returncode == 0, r.stdout + r.stderr
    check_trained_run(runs / "mpirun-t1", steps=12, ranks=2)
    # The venv's own mpiexec, found next to HPCDP_PYTHON, under the requested timeout.
    assert f"+ timeout --kill-after=10 100 {Path(venv_python()).parent}/mpiexec -n 2 " in r.stdout, r.stdout
    assert "step 12/12" in r.stdout and "eval @ step 12" in r.stdout, r.stdout


def test_mpirun_script_reports_a_broken_config(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(tiny_config(tmp_path).read_text().replace('strategy = "ddp"', 'strategy = "dpp"'))
    r = run_script(["--config", str(bad)], {"HPCDP_NP": "2", "HPCDP_PYTHON": venv_python(),
                                            "HPCDP_RUN_ROOT": str(tmp_path / "runs")})
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.count("hpcdp: error: parallel.strategy: 'dpp'") == 1, r.stderr
    assert "hpcdp: training failed (exit 2)" in r.stderr, r.stderr


def test_mpirun_script_rejects_bad_arguments(tmp_path):
    r = run_script(["--steps", "3"], {"HPCDP_PYTHON": venv_python()})
    assert r.returncode == 64 and "unknown argument '--steps'" in r.stderr, r.stderr
    r = run_script([], {"HPCDP_NP": "two", "HPCDP_PYTHON": venv_python()})
    assert r.returncode == 64 and "HPCDP_NP='two'" in r.stderr, r.stderr
    r = run_script([], {"HPCDP_PYTHON": str(tmp_path / "no-python")})
    assert r.returncode == 127 and "is not an executable python" in r.stderr, r.stderr
