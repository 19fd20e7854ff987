"""jobs/scaling_study_mpirun.sh with the venv's mpiexec (no Slurm): without --profile the
study first calibrates one on this machine, then predicts every point with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hpcdp.comm.model.cost import load_profile

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "jobs" / "scaling_study_mpirun.sh"
TINY = (ROOT / "tests" / "scaling_tiny.toml").read_text()


def run_script(args, env_changes, timeout=600):
    env = {**os.environ, "HPCDP_PYTHON": sys.executable, **env_changes}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_calibrates_then_studies(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    r = run_script(["--config", str(cfg), "--ranks", "1,2", "--steps", "4", "--warmup", "1",
                    "--variants", "bucketed", "--study", "weak", "--probe-max", "64K"],
                   {"HPCDP_RUN_ROOT": str(tmp_path / "runs"), "HPCDP_JOB_ID": "t1"})
    assert r.returncode == 0, r.stdout + r.stderr
    results = tmp_path / "runs" / "scaling-t1"
    prof = load_profile(str(results / "profile.toml"))
    assert prof.flops_per_s > 0 and set(prof.contention) == {1, 2}
    assert prof.provenance["config"] == str(cfg)
    # the probe's equal-bytes segments and mpi4py's own call are recorded and fitted; on
    # the compiled engine (the default) the few-step collectives stay Python requests, so
    # the probe measures the same segments on the Python engine too and fits their cost
    # per message apart (tests/unit/test_calibrate.py: 0 when the probe ran on Python)
    probe = prof.provenance["probe_intra"]
    assert [m for m, _ in probe["segments_small"]] == [16, 8, 4]
    assert [m for m, _ in probe["segments_small_python"]] == [16, 8, 4]
    assert 0 < probe["py_call_s"] < probe["exchange"][0][1]
    assert prof.msg_s > 0 and prof.few_step_msg_s > 0
    res = json.loads((results / "scale.json").read_text())
    assert res["profile"] == "profile"
    assert [p["ranks"] for p in res["weak"]] == [1, 2]
    assert all(p["pred_step_s"] > 0 for p in res["weak"] + res["baseline"])
    assert f"{Path(sys.executable).parent}/mpiexec -n 2 " in res["weak"][1]["command"]


def test_bad_arguments(tmp_path):
    r = run_script(["--ranks", "1,2"], {})
    assert r.returncode == 64 and "--config FILE is required" in r.stderr, r.stderr
    r = run_script(["--config", "x.toml", "--out", "y"], {})
    assert r.returncode == 64 and "--out is set by this script" in r.stderr, r.stderr
    r = run_script(["--config", "x.toml"], {"HPCDP_RANKS_PER_NODE": "four"})
    assert r.returncode == 64 and "HPCDP_RANKS_PER_NODE='four'" in r.stderr, r.stderr
    r = run_script(["--config", "x.toml"], {"HPCDP_PYTHON": str(tmp_path / "nope")})
    assert r.returncode == 127 and "is not an executable python" in r.stderr, r.stderr
