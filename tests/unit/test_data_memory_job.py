"""A rank's memory does not grow with the dataset: the same 2-rank training job on a
16 MB and on a 410 MB HDF5 file (an epoch each, so every sample is read) peaks at
nearly the same resident memory per rank (VmHWM), within an allowance of 48 MB that
the large file exceeds 8 times over. The control: the large file read into memory
(data.storage = "memory") raises the peak by more than the file's size, so the
measurement does see data held in memory. Files are written in pieces and removed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np

from hpcdp.launch import THREAD_ENV, find_mpiexec

ROOT = Path(__file__).resolve().parents[2]
FEATURES = 1024          # 4 KiB float32 rows
ALLOWANCE_MB = 48

JOB = r"""
import io, sys
from hpcdp.config import load_config
from hpcdp.train import run_training
cfg = load_config(None, sys.argv[1:])
run_training(cfg, out=io.StringIO())
from mpi4py import MPI
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(f"HWM {MPI.COMM_WORLD.Get_rank()} {hwm}", flush=True)
"""


def _write(path: Path, n: int) -> int:
    """n rows of FEATURES float32 + labels, written 8192 rows at a time; returns file bytes."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        x = f.create_dataset("x", shape=(n, FEATURES), dtype=np.float32)
        y = f.create_dataset("y", shape=(n,), dtype=np.int64)
        for lo in range(0, n, 8192):
            hi = min(lo + 8192, n)
            x[lo:hi] = rng.random((hi - lo, FEATURES), dtype=np.float32)
            y[lo:hi] = np.arange(lo, hi) % 10
    return path.stat().st_size


def _peaks(tmp_path, name, path, n, ranks, storage="disk") -> list[int]:
    """Per-rank peak resident memory in MB of one epoch of training on ``path``."""
    args = [f'run.out_dir="{tmp_path / name}"', "data.kind=hdf5", f'data.path="{path}"',
            f"data.storage={storage}", f"model.sizes=[{FEATURES}, 16, 10]", "train.epochs=1",
            f"train.global_batch={min(1000, int(n * 0.8))}", "parallel.strategy=ddp", "run.log_every=1000"]
    cmd = [sys.executable, "-c", JOB, *args]
    if ranks > 1:
        cmd = [find_mpiexec(), "-n", str(ranks)] + cmd
    env = {**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = dict(re.findall(r"HWM (\d+) (\d+)", proc.stdout))
    assert len(found) == ranks, proc.stdout
    return [int(found[str(r)]) // 1024 for r in range(ranks)]


def test_peak_memory_per_rank_does_not_grow_with_the_dataset(tmp_path):
    small, big = tmp_path / "small.h5", tmp_path / "big.h5"
    try:
        _write(small, 4_000)
        big_mb = _write(big, 100_000) / 2**20
        assert big_mb > 8 * ALLOWANCE_MB
        base = _peaks(tmp_path, "small", small, 4_000, 2)
        large = _peaks(tmp_path, "big", big, 100_000, 2)
        for r in range(2):
            assert large[r] - base[r] < ALLOWANCE_MB, (base, large, big_mb)
        control = _peaks(tmp_path, "big-memory", big, 100_000, 1, storage="memory")
        assert control[0] - base[0] > big_mb, (base, control, big_mb)
    finally:
        for p in (small, big):
            p.unlink(missing_ok=True)
