"""Per-step rows are held in bounded blocks whatever ``run.log_every`` and
``run.metrics_flush_s`` say: a run with both huge still writes its rows to
metrics.jsonl every :data:`hpcdp.metrics.MAX_BLOCK_ROWS` steps (memory bounded), and
a SIGTERM stop leaves every step's row written once, in order."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdp.launch import THREAD_ENV

ROOT = Path(__file__).resolve().parents[2]


def test_the_gather_holds_at_most_a_block_of_rows():
    from mpi4py import MPI

    from hpcdp.metrics import MAX_BLOCK_ROWS, StepGather

    g = StepGather(MPI.COMM_SELF, flush_every_s=1e9)
    for _ in range(2):  # the count the first flush sets is in force from the second on
        g.add(1.0, 1, 0.1, {"x": 0.0})
        g.flush()
    held = 0
    while not g.due():
        g.add(1.0, 1, 0.1, {"x": float(held)})
        held += 1
        assert held <= MAX_BLOCK_ROWS
    rows = g.flush()
    assert [r[1]["x"][0] for r in rows] == list(range(held))
    g.finish()


def test_a_huge_log_every_still_flushes_in_blocks_and_a_stop_writes_every_row(tmp_path):
    from hpcdp.metrics import MAX_BLOCK_ROWS

    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "hpcdp.cli", "train", "--set", 'data.kind="synthetic_classification"',
           "--set", "model.sizes=[32, 16, 8]", "--set", "run.eval_every=0", "--set", "train.steps=100000000",
           "--set", "run.log_every=1000000000", "--set", "run.metrics_flush_s=1e9",
           "--set", f'checkpoint.dir="{tmp_path / "ck"}"', "--set", f'run.out_dir="{run}"']
    proc = subprocess.Popen(cmd, env={**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}, cwd=tmp_path,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    metrics = run / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 240
        while not (metrics.exists() and any(json.loads(x).get("step") == 2 * MAX_BLOCK_ROWS
                                            for x in metrics.read_text().splitlines() if x.strip())):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no block of rows in {metrics} (exit {proc.poll()})")
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines() if '"step"' in x]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > 2 * MAX_BLOCK_ROWS
    assert f"after step {steps[-1]}: checkpoint saved" in out
