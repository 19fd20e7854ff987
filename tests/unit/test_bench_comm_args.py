"""Bad arguments to the collective benchmarks end at once with one line naming the
flag and exit status 2 (``--factor 1`` used to loop forever allocating, ``--repeats 0``
to raise ZeroDivisionError)."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args,flag", [
    (["collectives", "--factor", "1"], "--factor must be an integer >= 2"),
    (["collectives", "--factor", "0"], "--factor must be an integer >= 2"),
    (["collectives", "--repeats", "0"], "--repeats must be >= 1"),
    (["collectives", "--iters", "-1"], "--iters and --warmup must be >= 0"),
    (["collectives", "--min", "1K", "--max", "8"], "--max >= --min"),
    (["collectives", "--max", "4X"], "'4X' is not a size in bytes"),
    (["collectives", "--segment-bytes", "0"], "--segment-bytes must be >= 1"),
    (["collectives", "--dtype", "bool"], "--dtype must be numeric"),
    (["collectives", "--dtype", "floaty"], "is not a NumPy dtype"),
    (["collectives", "--algorithms", "tree"], "unknown ['tree']"),
    (["collectives", "--timeout", "inf"], "--timeout must be between 1 and 604800 seconds"),
    (["comm-overhead", "--rounds", "0"], "--rounds must be >= 1"),
    (["comm-overhead", "--bytes", "0"], "--bytes must be >= 1"),
])
def test_bad_arguments_fail_fast(args, flag):
    proc = subprocess.run([sys.executable, "-m", "hpcdp.cli", "bench", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert flag in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("algorithms", ["mpi", "ring"], ids=["baseline", "ring"])
def test_a_stopped_rank_ends_the_collectives_benchmark_naming_it(tmp_path, algorithms):
    """SIGSTOP one rank of ``hpcdp bench collectives`` mid-run: the job ends near its
    deadline (--timeout 3) with one line naming the stopped rank, whether the live rank
    waits in MPI's own blocking call (the baseline) or in hpcdp's ring."""
    from hpcdp.bench.faults import rank_pid
    from hpcdp.launch import THREAD_ENV, find_mpiexec

    marker = str(tmp_path / "rows.json")
    cmd = [find_mpiexec(), "-n", "2", sys.executable, "-m", "hpcdp.cli", "bench", "collectives", "--min", "8",
           "--max", "8", "--iters", "200", "--repeats", "100000", "--algorithms", algorithms, "--timeout", "3",
           "--json", marker]
    proc = subprocess.Popen(cmd, env={**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT)}, cwd=tmp_path,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stopped = None
    try:
        assert proc.stdout.readline().startswith("# hpcdp bench collectives"), "no header"
        while stopped is None:  # the ranks run (rank 0 printed the header)
            stopped = rank_pid(marker, 1)
            time.sleep(0.1)
        os.kill(stopped, signal.SIGSTOP)
        out, _ = proc.communicate(timeout=120)
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0, out[-3000:]
    errors = [x for x in out.splitlines() if x.startswith("hpcdp: error:")]
    assert errors and re.search(r"ranks? \[?1\b", errors[0].split(":", 2)[2]), out[-3000:]
    assert "Traceback" not in out
