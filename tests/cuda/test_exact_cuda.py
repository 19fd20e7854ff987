"""Exact mode with device = "cuda": one rank and two ranks sharing one GPU (or the
simulator) end with the same weights' SHA-256, the gradients staged through the
host for the integer sum. (A small MLP: a GPT step takes about a minute in the
simulator; the CUDA dropout mask is checked against the CPU one bit for bit in
test_ops_cuda.py.)"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

SETS = ["model.sizes=[64, 8, 10]", "train.steps=3", "train.epochs=0", "train.global_batch=8",
        'train.reproducible="exact"', "train.exact_micro_batch=4", 'optim.kind="adamw"',
        "run.log_every=1", "run.eval_every=0", 'parallel.strategy="ddp"', 'run.device="cuda"']


def _hash(tmp_path, n):
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    assert mpiexec, "mpiexec not found next to the Python or on PATH"
    out = tmp_path / f"n{n}"
    cmd = ["timeout", "900", mpiexec, "-n", str(n), sys.executable, "-m", "hpcdp.cli", "train"]
    for s in SETS + [f'run.out_dir="{out}"']:
        cmd += ["--set", s]
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=960)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["eval"]["weights_sha256"] for r in rows if "eval" in r]


def test_one_and_two_ranks_on_cuda_end_with_the_same_weights(tmp_path):
    one, two = _hash(tmp_path, 1), _hash(tmp_path, 2)
    assert len(one) == 1 and one == two
