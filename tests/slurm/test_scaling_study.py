"""jobs/scaling_study.sbatch on a real one-node Slurm: one job, weak and strong sweeps over
1, 2 and 4 ranks (srun steps), every point in one results folder, the table and plot of
``hpcdp scale`` with the cost model's prediction beside each point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_jobs import REPO, Job, venv_python

TINY = (REPO / "tests" / "scaling_tiny.toml").read_text()


@pytest.fixture(scope="module")
def jobs(slurm, tmp_path_factory):
    root = tmp_path_factory.mktemp("scaling")
    cfg = root / "tiny.toml"
    cfg.write_text(TINY)
    env = {"HPCDP_PYTHON": venv_python(), "HPCDP_RUN_ROOT": str(root / "runs")}
    started = {
        "study": Job(root / "study", ["-n", "4"],
                     ["--config", str(cfg), "--ranks", "1,2,4", "--steps", "4", "--warmup", "1",
                      "--variants", "bucketed", "--profile", "example-cluster"],
                     env, script=REPO / "jobs" / "scaling_study.sbatch", minutes=5),
        "no_config": Job(root / "no_config", ["-n", "1"], ["--ranks", "1,2"], env,
                         script=REPO / "jobs" / "scaling_study.sbatch"),
    }
    try:
        yield started
    finally:
        for job in started.values():
            job.cancel()


def test_study_job_writes_table_plot_and_predictions(jobs):
    job = jobs["study"].wait(timeout=280)
    assert job.rc == 0, job
    results = job.tmp.parent / "runs" / f"scaling-{job.job_id}"
    res = json.loads((results / "scale.json").read_text())
    assert [p["ranks"] for p in res["weak"]] == [1, 2, 4]
    assert [p["ranks"] for p in res["strong"]] == [1, 2, 4]
    assert [p["global_batch"] for p in res["weak"]] == [8, 16, 32]
    assert [b["ranks"] for b in res["baseline"]] == [2, 4]
    for p in res["weak"] + res["strong"] + res["baseline"]:
        assert p["pred_step_s"] > 0 and p["step_time_s"] > 0, p
        assert p["pred_error"] == pytest.approx(p["step_time_s"] / p["pred_step_s"] - 1)
        if p["ranks"] > 1:  # every multi-rank point ran in this allocation, by the venv's
            # mpiexec (the default for the venv's own MPICH: jobs/train.sbatch says why)
            assert p["command"].startswith(f"{Path(venv_python()).parent}/mpiexec -n "), p["command"]
    for p in res["weak"][1:]:
        assert p["loss_contention"] + p["loss_comm"] == pytest.approx(1 - p["efficiency"])
        assert p["grad_bytes_sent"] > 0
    for b in res["baseline"]:
        assert b["grad_bytes_sent"] == 0 and b["compute_only"] == 1.0
    table = (results / "scale.txt").read_text()
    assert "pred ms" in table and "lost to contention" in table, table
    assert (results / "scale.png").stat().st_size > 0
    assert "--ranks-per-node 4" in job.output, job  # from the allocation's tasks per node
    assert "hpcdp scaling study, job" in job.output, job


def test_study_job_without_config_fails_before_running(jobs):
    job = jobs["no_config"].wait()
    assert job.rc == 64, job
    assert "scaling_study.sbatch: error: --config FILE is required" in job.output, job
    assert "+ " not in job.output, job
