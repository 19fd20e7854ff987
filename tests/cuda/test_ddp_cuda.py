"""Multi-rank DDP with device = "cuda": two ranks share one GPU (or the simulator),
gradients go through hpcdp's ring on device buffers, and the run follows the CPU
run of the same job step for step."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SETS = ["run.dtype=float64", "model.sizes=[64, 8, 10]", "train.steps=3", "train.global_batch=8",
        "run.log_every=1", "run.eval_every=0", "parallel.strategy=ddp"]


def _run(tmp_path, device):
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    assert mpiexec, "mpiexec not found next to the Python or on PATH"
    out = tmp_path / device
    cmd = ["timeout", "600", mpiexec, "-n", "2", sys.executable, "-m", "hpcdp.cli", "train"]
    for s in SETS + [f"run.device={device}", f'run.out_dir="{out}"']:
        cmd += ["--set", s]
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=660)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "step" in r and "loss" in r]


def test_two_ranks_sharing_one_gpu_follow_the_cpu_run(tmp_path):
    gpu, cpu = _run(tmp_path, "cuda"), _run(tmp_path, "cpu")
    assert [r["step"] for r in gpu] == [1, 2, 3]
    np.testing.assert_allclose([r["loss"] for r in gpu], [r["loss"] for r in cpu], rtol=1e-9)
    # both ranks moved gradient bytes through the ring, the same on cuda as on cpu
    sent = [k for k in gpu[0]["ranks"] if "sent" in k]
    assert sent, gpu[0]["ranks"].keys()
    for k in sent:
        assert gpu[-1]["ranks"][k] == cpu[-1]["ranks"][k]
        assert all(v > 0 for v in gpu[-1]["ranks"][k])
