"""The emulated-cluster group (tests/run_cluster.sh): pytest runs here in the root
namespace, brings up one cluster of 3 nodes x 2 ranks for the whole session
(tests/cluster/cluster.sh; it is taken down at the end, whatever happened) and starts
real jobs on it with tests/cluster/mpiexec. The in-job test modules are in jobs/
(check_*.py, run with pytest --with-mpi on the ranks), not collected here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

collect_ignore = ["jobs"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CLUSTER_SH = HERE / "cluster.sh"
MPIEXEC = HERE / "mpiexec"
PREFIX = os.environ.get("HPCDP_CLUSTER_PREFIX", "hpcdpn")
NODES, PPN = 3, 2


@dataclass
class Job:
    status: int | None
    out: str
    timed_out: bool
    leftovers: list
    lines: list          # (monotonic time, text)
    t_exit: float


def marked_pids(marker: str) -> list[int]:
    """Processes whose command line or environment holds ``marker`` (one job's)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker.encode() in (d / "cmdline").read_bytes() + (d / "environ").read_bytes():
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


class Cluster:
    nodes = NODES
    ppn = PPN

    def sh(self, *args, check=True):
        res = subprocess.run(["bash", str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=120)
        if check and res.returncode:
            raise AssertionError(f"cluster.sh {' '.join(args)}: exit {res.returncode}\n{res.stdout}{res.stderr}")
        return res

    def link_bytes(self) -> list[int]:
        """Bytes each node's link carried so far (its veth's rx + tx in the root namespace)."""
        out = []
        for i in range(self.nodes):
            stats = Path(f"/sys/class/net/{PREFIX}v{i}/statistics")
            out.append(int((stats / "rx_bytes").read_text()) + int((stats / "tx_bytes").read_text()))
        return out

    def node_pids(self, i: int) -> list[int]:
        """Processes running inside node ``i``'s namespace."""
        res = subprocess.run(["ip", "netns", "pids", f"{PREFIX}{i}"], capture_output=True, text=True)
        return [int(p) for p in res.stdout.split()]

    def env(self, layout: str, **extra) -> dict:
        env = {**os.environ, "HPCDP_CLUSTER_LAYOUT": layout, "PYTHONPATH": str(ROOT),
               "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
               "PYTHONUNBUFFERED": "1",
               "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
        env.pop("HPCDP_TRACEBACK", None)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def start(self, layout: str, argv: list, *, cwd=None, env=None, marker=None):
        """Start ``tests/cluster/mpiexec -n <ranks of layout> argv`` in its own session."""
        n = sum(int(p) for p in layout.split(","))
        return self.launch([str(MPIEXEC), "-n", str(n), *map(str, argv)], cwd=cwd,
                           env=env or self.env(layout), marker=marker)

    def launch(self, cmd: list, *, cwd=None, env: dict, marker=None):
        """Start any launcher command line (``start``'s MPICH one, or another MPI's
        mpirun with its own arguments) in its own session, its output read into
        ``lines`` with the time of each line; the job is marked by ``HPCDP_CLUSTER_JOB``."""
        marker = marker or f"hpcdpjob{uuid.uuid4().hex[:10]}"
        env = {**env, "HPCDP_CLUSTER_JOB": marker}
        proc = subprocess.Popen(cmd, cwd=cwd or ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines: list = []

        def read():
            for line in proc.stdout:
                lines.append((time.monotonic(), line))
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        return proc, lines, reader, marker

    def finish(self, proc, lines, reader, marker, timeout: float, reap: bool = True) -> Job:
        """Wait for the launcher (SIGKILL to its session after ``timeout``); with ``reap``
        look for the job's processes left behind (10 s grace) and kill them."""
        timed_out = False
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        t_exit = time.monotonic()
        reader.join(timeout=10)
        if not reap:
            return Job(proc.returncode, "".join(t for _, t in lines), timed_out, [], lines, t_exit)
        deadline = time.monotonic() + 10  # the launcher's cleanup: a moment, then look
        left = marked_pids(marker)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = marked_pids(marker)
        for pid in left:  # never leave them running, whatever the verdict
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return Job(proc.returncode, "".join(t for _, t in lines), timed_out, left, lines, t_exit)

    def run(self, layout: str, argv: list, *, timeout: float = 300, **kw) -> Job:
        return self.finish(*self.start(layout, argv, **kw), timeout=timeout)


@pytest.fixture(scope="session")
def cluster():
    c = Cluster()
    c.sh("down", check=False)  # a previous run's leftovers (same prefix: this group's own)
    c.sh("up", "--nodes", str(NODES), "--ppn", str(PPN))
    try:
        yield c
    finally:
        c.sh("down", check=False)


@pytest.fixture
def unlimited(cluster):
    """The link at full speed for this test (and back to it afterwards)."""
    cluster.sh("rate", "none")
    yield cluster
    cluster.sh("rate", "none")
    for i in range(cluster.nodes):
        cluster.sh("link", str(i), "up")
