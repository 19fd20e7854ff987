"""hpcdp.bench.comm_overhead runs under mpiexec and reports every layer, restoring the tokens."""

import re
import shutil
import subprocess
import sys
from pathlib import Path


def test_overhead_breakdown_runs_on_two_ranks():
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    assert mpiexec, "mpiexec not found next to the Python or on PATH"
    proc = subprocess.run(["timeout", "120", mpiexec, "-n", "2", sys.executable, "-m",
                           "hpcdp.bench.comm_overhead", "--iters", "50"],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = re.findall(r"^(.+?)\s+([0-9.]+) us$", proc.stdout, re.M)
    names = [n.strip() for n, _ in rows]
    assert names == ["MPI_Allreduce (blocking, C)", "MPI_Iallreduce + Test loop", "hpcdp native",
                     "hpcdp recursive doubling"]
    assert all(float(us) > 0 for _, us in rows)
