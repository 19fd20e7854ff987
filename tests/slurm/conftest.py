"""A real one-node Slurm for the job-script tests (the `slurm` fixture).

The ``slurm`` fixture runs ``tests/slurm/local-slurm.sh start``: a Slurm that already
answers (``tests/run_slurm.sh`` starts one, or someone else's) is used and left
running; otherwise the script starts munged, slurmctld and slurmd on loopback for
this pytest process, and ``stop`` at the end stops only those. If the daemons do not
come up the tests fail with the script's output and the daemon logs. Without Slurm
installed the tests are skipped with the command that installs it, unless
``HPCDP_SLURM_REQUIRED=1`` (``tests/run_slurm.sh``): then they fail.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
LOCAL_SLURM = HERE / "local-slurm.sh"
REQUIRED = os.environ.get("HPCDP_SLURM_REQUIRED") == "1"
NOT_INSTALLED = 3  # local-slurm.sh's exit status when programs are missing


def _local_slurm(*args: str, timeout: float) -> tuple[int | str, str]:
    try:
        r = subprocess.run(["bash", str(LOCAL_SLURM), *args], capture_output=True, text=True,
                           timeout=timeout)
        return r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        return f"timeout after {timeout:g} s", f"{e.stdout or ''}{e.stderr or ''}"


@pytest.fixture(scope="session")
def slurm():
    """A Slurm that accepts jobs; started here (and stopped after) if none answers."""
    holder = f"pytest-{os.getpid()}"
    rc, out = _local_slurm("start", "--holder", holder, timeout=180)
    if rc == NOT_INSTALLED and not REQUIRED:
        pytest.skip(out.strip())
    try:
        if rc != 0:
            pytest.fail(f"no Slurm to run the job scripts on ({LOCAL_SLURM} start: exit {rc}):\n{out}")
        yield
    finally:
        _local_slurm("stop", "--holder", holder, timeout=180)


