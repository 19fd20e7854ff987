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
    for r in data["rows"]:  # vs_mpi: the median of per-round paired ratios, with its quartiles
        assert r["vs_mpi_q1"] <= r["vs_mpi"] <= r["vs_mpi_q3"], r
        if r["algorithm"] == "mpi":
            assert r["vs_mpi"] == r["vs_mpi_q1"] == r["vs_mpi_q3"] == 1.0, r


def test_vs_mpi_pairs_each_round_with_the_baseline_of_the_same_round():
    from hpcdp.bench.collectives import paired_ratios

    # rounds 1 and 3 ran in slow spells of the machine that hit both: paired, the ring is
    # 0.5x MPI in two rounds of three; the ratio of the two medians (4 / 3) would say 1.33x
    ring, mpi = [1.0, 4.0, 9.0], [2.0, 3.0, 18.0]
    q1, med, q3 = paired_ratios(ring, mpi)
    assert (q1, med) == (0.5, 0.5) and abs(q3 - (0.5 + 0.5 * (4.0 / 3.0 - 0.5))) < 1e-12
