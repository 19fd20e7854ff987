"""hpcdp bench startup: real launches under the venv's mpiexec (one rank, one repeat)."""

from __future__ import annotations

import json
import subprocess
import sys


def _bench(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "hpcdp.cli", "bench", "startup", "--ranks", "1",
                           "--repeats", "1", "--warmup", "0", "--json", str(tmp_path / "s.json"), *args],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)


def test_startup_bench_times_first_step_and_exit(tmp_path):
    r = _bench(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads((tmp_path / "s.json").read_text())
    (row,) = out["rows"]
    assert row["ranks"] == 1 and row["repeats"] == 1 and len(row["runs"]) == 1
    assert 0 < row["first_step_s"]["median"] < row["exit_s"]["median"]
    assert out["command"][-4:] == ["--set", "parallel.strategy=ddp", "--set", "train.steps=1"]
    assert len(out["load_before"]) == 3 and "load average before" in r.stdout
    assert not (tmp_path / "runs").exists()  # run directories go to a temporary folder


def test_a_failing_launch_is_reported_with_its_output(tmp_path):
    r = _bench(tmp_path, "--set", "optim.kind=adam")
    assert r.returncode == 1
    assert "a launch failed" in r.stderr and "optim.kind: 'adam' is not allowed" in r.stderr
    assert "Traceback" not in r.stderr
