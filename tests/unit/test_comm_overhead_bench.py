"""hpcdp bench comm-overhead runs under mpiexec and reports every layer of one small call."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LAYERS = {
    "allreduce": ["MPI blocking", "MPI non-blocking + Test loop", "hpcdp auto",
                  "hpcdp auto, mpi4py lean path", "hpcdp native, general request", "hpcdp recursive doubling", "hpcdp ring",
                  "hpcdp ring, compiled engine", "hpcdp auto, debug mode"],
    "all_gather": ["MPI blocking", "MPI non-blocking + Test loop", "hpcdp auto",
                   "hpcdp auto, mpi4py lean path", "hpcdp native, general request", "hpcdp ring", "hpcdp ring, compiled engine",
                   "hpcdp auto, debug mode"],
}


@pytest.mark.parametrize("collective", sorted(LAYERS))
def test_overhead_breakdown_runs_on_two_ranks(collective, tmp_path):
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    assert mpiexec, "mpiexec not found next to the Python or on PATH"
    out = tmp_path / "o.json"
    proc = subprocess.run(["timeout", "120", mpiexec, "-n", "2", sys.executable, "-m", "hpcdp.cli",
                           "bench", "comm-overhead", "--collective", collective, "--iters", "20",
                           "--rounds", "2", "--bytes", "12", "--json", str(out)],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(r"^([^#].+?)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$", proc.stdout, re.M)
    assert [n.strip() for n, *_ in rows] == LAYERS[collective]
    assert all(float(med) > 0 and float(mn) <= float(med) for _, med, mn, _ in rows)
    data = json.loads(out.read_text())
    assert data["meta"]["bytes"] == 12 and [r["layer"] for r in data["rows"]] == LAYERS[collective]
    assert all(len(r["samples_us"]) == 2 for r in data["rows"])
