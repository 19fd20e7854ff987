"""jobs/train.sbatch on a real one-node Slurm: sbatch --wait, 2 ranks, DDP, digits MLP.

The four jobs are submitted together by one fixture (see ``Job``); each test then
waits for its own and checks it. About one sbatch polling interval in all.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from slurm_jobs import Job, check_trained_run, tiny_config, venv_python


@pytest.fixture(scope="module")
def jobs(slurm, tmp_path_factory):
    root = tmp_path_factory.mktemp("sbatch")
    cfg = tiny_config(root)
    bad = root / "bad.toml"
    bad.write_text(cfg.read_text().replace('kind = "sgd"', 'kind = "adam"'))
    py = venv_python()
    bindir = str(Path(py).parent)
    assert Path(bindir, "hpcdp").exists(), f"no hpcdp console script in {bindir}: pip install -e ."
    specs = {
        # srun (chosen: the default picks the venv's hydra for the venv's MPICH), HPCDP_PYTHON,
        # overrides from the environment and the arguments, 2 CPUs per task.
        "srun": (["-n", "2", "-c", "2"], ["--config", str(cfg), "--set", "train.steps=12"],
                 {"HPCDP_PYTHON": py, "HPCDP_SET": "optim.lr=0.25 run.log_every=6", "HPCDP_LAUNCHER": "srun"}),
        # the default launcher with the venv activated instead of HPCDP_PYTHON: the venv's
        # MPICH -> its mpiexec (hydra) inside the allocation.
        "mpiexec": (["-n", "2"], ["--config", str(cfg), "--set=train.steps=12"],
                    {"HPCDP_PYTHON": None, "HPCDP_SET": None, "HPCDP_LAUNCHER": None,
                     "VIRTUAL_ENV": str(Path(bindir).parent),
                     "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}),
        "bad_value": (["-n", "2"], ["--config", str(bad)],
                      {"HPCDP_PYTHON": py, "HPCDP_SET": None, "HPCDP_LAUNCHER": None}),
        "no_file": (["-n", "1"], ["--config", str(root / "nope.toml")],
                    {"HPCDP_PYTHON": py, "HPCDP_SET": None, "HPCDP_LAUNCHER": None}),
    }
    started = {}
    try:
        for name, (opts, args, env) in specs.items():
            env["HPCDP_RUN_ROOT"] = str(root / name / "runs")
            started[name] = Job(root / name, opts, args, env)
        yield started
    finally:
        for job in started.values():
            job.cancel()


def test_srun_job_trains_and_names_run_dir_after_job_id(jobs):
    job = jobs["srun"].wait()
    job.expect(0)
    run_dir = job.tmp / "runs" / f"slurm-{job.job_id}"
    check_trained_run(run_dir, steps=12, ranks=2)

    # The overrides from the environment and from the arguments both arrived.
    cfg = tomllib.loads((run_dir / "config.toml").read_text())
    assert cfg["optim"]["lr"] == 0.25 and cfg["train"]["steps"] == 12
    assert cfg["run"]["log_every"] == 6 and cfg["parallel"]["strategy"] == "ddp"
    assert cfg["run"]["out_dir"] == str(run_dir)

    # The log: the launcher (srun, pmi2, threads from -c) and rank 0's lines, once.
    out = job.output
    assert f"hpcdp job {job.job_id}: 2 rank(s)" in out and "2 thread(s) per rank" in out, out
    assert "+ srun --mpi=pmi2 --wait=60 --cpus-per-task=2 " in out, out
    assert f"run dir: {run_dir}" in out, out
    assert "strategy ddp on 2 worker(s) of 2 rank(s)" in out, out
    assert "step 12/12" in out and "eval @ step 12" in out, out
    assert out.count("run dir: ") == 1, "only rank 0 logs"


def test_default_launcher_is_the_venvs_mpiexec_for_the_venvs_mpich(jobs):
    job = jobs["mpiexec"].wait()
    job.expect(0)
    bindir = Path(venv_python()).parent
    assert (f"hpcdp job {job.job_id}: launcher mpiexec: the venv's MPICH ({bindir}) speaks PMI-1, "
            "which srun's pmi2 plugin cuts at 1024 bytes") in job.output, job
    assert f"+ {bindir}/mpiexec -n 2 hpcdp train --config" in job.output, job
    assert "1 thread(s) per rank" in job.output, job
    check_trained_run(job.tmp / "runs" / f"slurm-{job.job_id}", steps=12, ranks=2)


def test_broken_config_fails_the_job_with_the_error(jobs):
    job = jobs["bad_value"].wait()
    job.expect(2)  # hpcdp's status for a config error, passed on by the launcher and the script
    assert job.output.count("hpcdp: error: optim.kind: 'adam' is not allowed; "
                            "choose one of 'sgd', 'adamw'") == 1, job
    assert "Traceback" not in job.output, job
    assert f"hpcdp job {job.job_id}: training failed (exit 2)" in job.output, job
    assert not (job.tmp / "runs" / f"slurm-{job.job_id}" / "metrics.jsonl").exists()


def test_missing_config_file_fails_before_launching(jobs):
    job = jobs["no_file"].wait()
    job.expect(64)
    assert f"train.sbatch: error: config file '{job.tmp.parent / 'nope.toml'}' not found" in job.output, job
    assert "+ srun" not in job.output, job
