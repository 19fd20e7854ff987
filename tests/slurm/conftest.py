"""A real one-node Slurm for the job-script tests (the `slurm` fixture).

The ``slurm`` fixture uses a Slurm that already answers (``tests/run_slurm.sh`` starts
one), or starts the local one itself with ``start-local-slurm`` from
``$HPCDP_SLURM_DIR`` (default ``../shared/slurm`` beside the repository) and stops it
at the end. If the daemons do not come up the tests fail with the starter's output
and the daemon logs. Without Slurm's commands installed the tests are skipped with
the command that installs them, unless ``HPCDP_SLURM_REQUIRED=1`` (CI): then they fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REQUIRED = os.environ.get("HPCDP_SLURM_REQUIRED") == "1"


def slurm_dir() -> Path:
    return Path(os.environ.get("HPCDP_SLURM_DIR") or REPO.parent / "shared" / "slurm")


def _slurm_answers() -> bool:
    try:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0 and "idle" in r.stdout


def _daemon_logs() -> str:
    out = []
    for name in ("slurmctld.log", "slurmd.log"):
        p = Path("/var/log/slurm") / name
        if p.exists():
            out.append(f"--- tail of {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-20:]))
    return "\n".join(out) or "(no logs under /var/log/slurm)"


@pytest.fixture(scope="session")
def slurm():
    """A Slurm that accepts jobs; started here (and stopped after) if none answers."""
    if shutil.which("sbatch") is None:
        msg = "Slurm is not installed: run 'bash .ci/slurm-setup.sh' (Debian's slurmctld slurmd slurm-client munge)"
        if REQUIRED:
            pytest.fail(msg)
        pytest.skip(msg)
    if _slurm_answers():
        yield
        return
    start, stop = slurm_dir() / "start-local-slurm", slurm_dir() / "stop-local-slurm"
    if not start.is_file():
        pytest.fail(f"no Slurm answers and the starter {start} is missing: set HPCDP_SLURM_DIR to the "
                    "folder with start-local-slurm / stop-local-slurm")
    try:
        r = subprocess.run(["bash", str(start)], capture_output=True, text=True, timeout=60)
        rc, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout after 60 s", f"{e.stdout or ''}{e.stderr or ''}"
    try:
        if rc != 0 or not _slurm_answers():
            pytest.fail(f"the local Slurm did not start ({start}: exit {rc}):\n{out}\n{_daemon_logs()}")
        yield
    finally:
        _drain()
        subprocess.run(["bash", str(stop)], capture_output=True, timeout=60)


def _drain(seconds: float = 10) -> None:
    """Cancel the jobs left on the Slurm we started and let their steps end while munge
    still runs (a step that outlives munge keeps slurmd from exiting)."""
    q = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=10)
    if q.stdout.split():
        subprocess.run(["scancel", *q.stdout.split()], capture_output=True, timeout=10)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        busy = subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=10).stdout.strip()
        if not busy and subprocess.run(["pgrep", "-x", "slurmstepd"], capture_output=True).returncode != 0:
            return
        time.sleep(0.5)
