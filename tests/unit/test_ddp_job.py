"""The DDP example job end to end: ``mpiexec -n 4 hpcdp train --config jobs/digits_ddp.toml``
reaches the one-rank test accuracy (>= 95%), launched as its own MPI job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hpcdp.launch import THREAD_ENV, find_mpiexec

ROOT = Path(__file__).resolve().parents[2]


def _train(tmp_path, ranks):
    out = tmp_path / f"n{ranks}"
    cmd = [sys.executable, "-m", "hpcdp.cli", "train", "--config", str(ROOT / "jobs/digits_ddp.toml"),
           "--set", f'run.out_dir="{out}"', "--set", "run.eval_every=0"]
    if ranks > 1:
        cmd = [find_mpiexec(), "-n", str(ranks)] + cmd
    env = {**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "step" in x]
    return [x["eval"] for x in lines if "eval" in x][-1], steps


def test_digits_ddp_on_four_ranks_matches_one_rank(tmp_path):
    ev4, steps4 = _train(tmp_path, 4)
    ev1, steps1 = _train(tmp_path, 1)
    assert ev4["accuracy"] >= 0.95
    # same global batch, same seed: the same model up to float32 summation order
    assert abs(ev4["accuracy"] - ev1["accuracy"]) <= 2 / ev1["n"]
    assert abs(ev4["loss"] - ev1["loss"]) <= 1e-3 * ev1["loss"]
    assert len(steps4) == len(steps1)
    last = steps4[-1]["ranks"]
    assert last["samples"] == [16, 16, 16, 16]
    # every rank moved exactly 2(N-1)/N of the gradient bytes or the uneven-chunk figure
    numel = 64 * 128 + 128 + 128 * 10 + 10
    assert sum(last["grad_bytes_sent"]) == sum(last["grad_bytes_recv"]) == 2 * 3 * numel * 4
