"""``hpcdp bench collectives --engine compiled`` runs the compiled ring under mpiexec and
says so in its header (the command docs/results.md uses)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path


def test_bench_collectives_runs_the_compiled_engine(tmp_path):
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    out = tmp_path / "c.json"
    proc = subprocess.run(["timeout", "120", mpiexec, "-n", "2", sys.executable, "-m", "hpcdp.cli",
                           "bench", "collectives", "--collective", "all", "--min", "8",
                           "--max", "64", "--factor", "8", "--algorithms", "mpi,ring",
                           "--repeats", "1", "--iters", "3", "--warmup", "1",
                           "--engine", "compiled", "--json", str(out)],
                          capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("engine compiled") == 3, proc.stdout
    data = json.loads(out.read_text())
    assert data["meta"]["engine"] == "compiled"
    assert {r["algorithm"] for r in data["rows"]} == {"mpi", "ring"}
