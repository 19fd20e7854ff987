"""The float16 gradient wire never fails silently: real 2-rank DDP jobs under
``mpiexec`` with ``parallel.ddp.comm_dtype = "float16"``.

- Features of 1e6 make the first layer's gradient overflow float16 (65504) on the wire
  (float32 holds it): with ``train.on_nonfinite = "skip"`` every update is dropped, and
  ``train.max_consecutive_skips`` (here 3) steps in a row end the run with status 1 and
  a line naming the wire key and its remedy (bfloat16 / float32), not the learning rate
  alone.
- Features of 1e-9 make the first layer's gradient flush to zero on the wire (below
  float16's 6e-8): the run goes on, and one warning line names the parameter and the key.

Each job: about 4 s on 2 loaded cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcdp.failure.nonfinite import NonFiniteError, NonFiniteGuard
from hpcdp.launch import THREAD_ENV, find_mpiexec

ROOT = Path(__file__).resolve().parents[2]
KEY = "parallel.ddp.comm_dtype"


def _job(tmp_path, scale, *sets):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x * scale, y=rng.integers(0, 4, 256))
    cmd = [find_mpiexec(), "-n", "2", sys.executable, "-m", "hpcdp.cli", "train"]
    for s in ("data.kind=npz", "data.path=d.npz", "model.sizes=[16, 32, 4]", "train.global_batch=32",
              "train.epochs=0", "train.steps=8", "run.eval_every=0", "run.log_every=1", "run.out_dir=run", "parallel.strategy=ddp",
              f"{KEY}=float16", *sets):
        cmd += ["--set", s]
    env = {**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)


def test_an_overflowing_float16_wire_that_skips_every_step_ends_the_run(tmp_path):
    proc = _job(tmp_path, 1e6, "train.on_nonfinite=skip", "train.max_consecutive_skips=3")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpcdp: error:")]
    assert errors and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for line in errors:  # every rank dropped the same steps: each line says the same
        assert "at step 3" in line and "3 steps in a row" in line and "max_consecutive_skips = 3" in line, line
        assert f'{KEY} = "float16"' in line and f'set {KEY} = "bfloat16"' in line and '"float32"' in line, line
    steps = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # the steps before the one that ended the run: every update dropped on both ranks
    assert {s["step"]: s["ranks"]["nonfinite_skipped"] for s in steps if "step" in s} == {1: [1, 1], 2: [1, 1]}


def test_a_float16_wire_that_flushes_a_layer_to_zero_is_named(tmp_path):
    proc = _job(tmp_path, 1e-9)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpcdp: warning:")]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert "fc0.weight" in warnings[0] and "flush to zero" in warnings[0], warnings
    assert f'set {KEY} = "bfloat16"' in warnings[0], warnings


def test_the_guard_names_the_wire_in_its_remedy():
    """"stop": the gradient's and the loss's lines name a float16 wire; bfloat16 and
    float32 wires keep the learning-rate remedy; a float32 run never checks for zeros."""
    class Opt:
        def step(self, param, grad):
            pass

    for wire, named in ((("parallel.zero.comm_dtype", "float16"), True),
                        (("parallel.zero.comm_dtype", "bfloat16"), False), (None, False)):
        guard = NonFiniteGuard("stop", 1, wire=wire)
        opt = Opt()
        guard.guard(opt)
        guard.check_loss(2, 1.0)
        with pytest.raises(NonFiniteError) as e:
            opt.step(np.zeros(3, np.float32), np.array([1, np.inf, 0], np.float32))
        assert ('set parallel.zero.comm_dtype = "bfloat16"' in str(e.value)) == named, str(e.value)
        assert "lower optim.lr" in str(e.value)
        with pytest.raises(NonFiniteError) as e:
            guard.check_loss(3, float("nan"))
        assert ('parallel.zero.comm_dtype = "float16"' in str(e.value)) == named, str(e.value)
