"""jobs/scaling_study.sbatch with ``HPCDP_LAUNCHER=mpiexec`` and an Open MPI mpiexec.

The job script fills its launcher template with the ranks per node; MPICH's hydra
spells that ``-ppn``, Open MPI's mpiexec refuses ``-ppn`` ("unrecognized option") and
wants ``--npernode``. This runs the study (outside Slurm: bash, the ranks per node given)
with Open MPI 5 of the ULFM venv (tests/ulfm/setup_venv_ulfm.sh; this group is the one
that has Open MPI's hpcdp venv) and checks that every point ran under Open MPI's option.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / os.environ.get("HPCDP_ULFM_VENV", ".venv-ulfm")  # relative: to the repository root

TINY = (ROOT / "tests" / "scaling_tiny.toml").read_text()  # the scaling-job tests' tiny job


def test_the_scaling_job_runs_its_points_with_open_mpis_option(tmp_path):
    mpiexec = VENV / "bin" / "mpiexec"
    if not mpiexec.exists():
        pytest.skip(f"no Open MPI venv at {VENV}: run bash tests/ulfm/setup_venv_ulfm.sh (tests/run_all.sh does)")
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCDP_"))}
    env.update({"HPCDP_PYTHON": str(VENV / "bin" / "python"), "PYTHONPATH": str(ROOT),
                "HPCDP_RUN_ROOT": str(tmp_path / "runs"), "HPCDP_LAUNCHER": "mpiexec",
                "HPCDP_MPIEXEC": str(mpiexec), "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1",
                "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"})
    proc = subprocess.run(["bash", str(ROOT / "jobs" / "scaling_study.sbatch"), "--config", str(cfg),
                           "--ranks", "1,2", "--steps", "4", "--warmup", "1", "--variants", "bucketed",
                           "--profile", "example-cluster", "--ranks-per-node", "2"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    res = json.loads((tmp_path / "runs" / "scaling-local" / "scale.json").read_text())
    points = res["weak"] + res["strong"] + res["baseline"]
    assert [p["ranks"] for p in res["weak"]] == [1, 2], res["weak"]
    for p in points:
        assert p["command"].startswith(f"{mpiexec} -n {p['ranks']} --npernode {p['ranks']} "), p["command"]
        assert p["step_time_s"] > 0, p
