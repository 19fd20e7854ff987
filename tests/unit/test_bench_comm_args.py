"""Bad arguments to the collective benchmarks end at once with one line naming the
flag and exit status 2 (``--factor 1`` used to loop forever allocating, ``--repeats 0``
to raise ZeroDivisionError)."""

import subprocess
import sys

import pytest


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
    (["comm-overhead", "--rounds", "0"], "--rounds must be >= 1"),
    (["comm-overhead", "--bytes", "0"], "--bytes must be >= 1"),
])
def test_bad_arguments_fail_fast(args, flag):
    proc = subprocess.run([sys.executable, "-m", "hpcdp.cli", "bench", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert flag in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
