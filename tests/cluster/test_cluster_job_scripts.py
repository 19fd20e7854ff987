"""The job scripts on two nodes of the emulated cluster, with its launcher as their
mpiexec and a hosts file naming the nodes (what a cluster without Slurm gives them):
jobs/train_mpirun.sh trains on 2 nodes x 2 ranks; jobs/scaling_study_mpirun.sh runs a
study at 1 and 2 nodes with the cost model's prediction beside each point."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import MPIEXEC, PREFIX, ROOT

TINY = """
[run]
name = "cluster-script-test"
log_every = 4
eval_every = 0
[model]
kind = "mlp"
sizes = [8, 16, 3]
[data]
kind = "synthetic_classification"
n_samples = 256
n_features = 8
n_classes = 3
[train]
steps = 8
global_batch = 16
[optim]
kind = "sgd"
lr = 0.05
[parallel]
strategy = "ddp"
"""


def _script(name, args, tmp_path, **env):
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{PREFIX}0\n{PREFIX}1\n")
    full = {**os.environ, "HPCDP_PYTHON": sys.executable, "HPCDP_MPIEXEC": str(MPIEXEC),
            "HPCDP_HOSTFILE": str(hosts), "HPCDP_RUN_ROOT": str(tmp_path / "runs"),
            "HPCDP_JOB_ID": "t1", "HPCDP_TIMEOUT": "200", "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(["bash", str(ROOT / "jobs" / name), *args], env=full, cwd=ROOT,
                          capture_output=True, text=True, timeout=400)


def test_train_mpirun_script_on_two_nodes(unlimited, tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    before = unlimited.link_bytes()
    r = _script("train_mpirun.sh", ["--config", str(cfg)], tmp_path, HPCDP_NP="4")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert f"{MPIEXEC} -n 4 -hostfile" in r.stdout, r.stdout[:2000]
    steps = [json.loads(x) for x in (tmp_path / "runs" / "mpirun-t1" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "step" in s]
    assert [s["step"] for s in steps] == list(range(1, 9))
    assert all(len(s["ranks"]["bytes_sent"]) == 4 for s in steps if "ranks" in s and "bytes_sent" in s["ranks"])
    carried = [a - b for a, b in zip(unlimited.link_bytes(), before)]
    assert carried[0] > 0 and carried[1] > 0, f"bytes over the nodes' links: {carried}"


def test_scaling_study_mpirun_script_on_one_and_two_nodes(unlimited, tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    r = _script("scaling_study_mpirun.sh",
                ["--config", str(cfg), "--nodes", "1,2", "--steps", "4", "--warmup", "1",
                 "--variants", "bucketed", "--study", "weak", "--no-baseline",
                 "--profile", "example-cluster"],
                tmp_path, HPCDP_RANKS_PER_NODE="2")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    res = json.loads((tmp_path / "runs" / "scaling-t1" / "scale.json").read_text())
    assert [p["ranks"] for p in res["weak"]] == [1, 2, 4]  # the one-rank base, 1 node, 2 nodes
    assert all(p["pred_step_s"] > 0 for p in res["weak"])
    multi = [p for p in res["weak"] if p["ranks"] > 1]
    assert all(f"{MPIEXEC} -n {p['ranks']} -hostfile" in p["command"] and "-ppn 2" in p["command"]
               for p in multi), [p["command"] for p in multi]
