"""failure.on_rank_loss = "continue" measured on the emulated cluster (not a test; root):
tests/ulfm/measure_repair.py's kills and chaos run, with every rank on a node of its own.
It brings up a cluster of NODES nodes (tests/cluster/cluster.sh, its own prefix and
addresses, so the cluster group's tests can run beside it) and starts each job with Open
MPI 5 `mpirun --with-ft ulfm` and ULFM's heartbeat detector through the cluster's ssh
stand-in, as tests/cluster/test_cluster_ulfm_link.py does (rank i on node i); DDP on
jobs/gpt_small.toml. A rank is killed by its pid, found among the processes of its
node's namespace (`ip netns pids`). The cluster is taken down at the end, whatever
happened, and no process of the jobs is left.

    python tests/cluster/measure_cluster_repair.py [KILLS] [NODES]   # defaults: 10 kills, 4 nodes
    python tests/cluster/measure_cluster_repair.py --chaos [NODES] [MIN_WORLD] [EVERY_S]

Kills: KILLS jobs of NODES ranks; in each, once step 5 is logged, a rank drawn at random
among 1..NODES-1 (rank 0 writes the metrics: its loss ends the job) is killed at a random
moment of a step. Printed per kill and as p50 / p95 / max: the kill to the survivors'
first committed step (the redone step's record in metrics.jsonl), the kill to the error
(the repair record's time, on this machine's one clock, less the repair's own time),
the repair's detection (from the failed step's start) and repair times, and the
committed steps lost (steps logged before the repair later than the step agreed on).

``--chaos``: one job of NODES ranks (default 4); every EVERY_S seconds (default 30) a
live rank drawn at random (not rank 0) is killed until MIN_WORLD are left (default 2),
then it runs EVERY_S more; each stretch is compared with fault-free jobs of its world
size on as many nodes, timed over as long, before and after the chaos job (their mean).

Environment: HPCDP_ULFM_VENV (default .venv-ulfm: tests/ulfm/setup_venv_ulfm.sh);
HPCDP_MEASURE_SEED (default 0): the draws of the ranks and moments;
HPCDP_CLUSTER_PREFIX / HPCDP_CLUSTER_NET (defaults hpcdpm / 10.231.48).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
os.environ.setdefault("HPCDP_CLUSTER_PREFIX", "hpcdpm")  # read by conftest and cluster.sh
os.environ.setdefault("HPCDP_CLUSTER_NET", "10.231.48")
sys.path[:0] = [str(HERE), str(HERE.parent / "ulfm")]

import measure_repair as mr  # noqa: E402
from conftest import PREFIX, ROOT, Cluster, marked_pids  # noqa: E402

NET = os.environ["HPCDP_CLUSTER_NET"]
VENV = ROOT / os.environ.get("HPCDP_ULFM_VENV", ".venv-ulfm")  # relative: to the repository root
# ULFM's heartbeat detector, as in the link-cut test (a kill is also reported by the
# killed rank's daemon; a cut link only by this)
DETECTOR = ["--mca", "mpi_ft_detector", "true", "--mca", "mpi_ft_detector_thread", "true",
            "--mca", "mpi_ft_detector_period", "0.5", "--mca", "mpi_ft_detector_timeout", "2"]


class OnCluster:
    """measure_repair's launcher, on the emulated cluster: rank i on node i."""

    def __init__(self, cluster: Cluster, tmp: Path):
        self.cluster, self.tmp = cluster, tmp
        self.jobs = {}  # proc -> the job's marker

    def start(self, out: Path, ranks: int, marker: str, ft: bool, steps: int = 100000):
        hosts = self.tmp / f"hosts{ranks}"
        hosts.write_text("".join(f"{PREFIX}{i} slots=1\n" for i in range(ranks)))
        argv = [str(VENV / "bin" / "mpirun"), *(["--with-ft", "ulfm", *DETECTOR] if ft else []),
                "-x", "PYTHONPATH", "--hostfile", str(hosts), "-n", str(ranks),
                "--mca", "plm_rsh_agent", str(HERE / "netns-ssh"), "--mca", "btl_tcp_if_include", f"{NET}.0/24",
                str(VENV / "bin" / "python"), "-m", "hpcdp.cli", "train",
                "--config", str(ROOT / "jobs" / "gpt_small.toml"),
                "--set", "parallel.strategy=ddp", "--set", "run.log_every=1", "--set", "run.eval_every=0",
                "--set", f"train.steps={steps}", "--set", 'failure.on_rank_loss="continue"',
                "--set", f'run.out_dir="{out}"']
        key, value = marker.split("=")
        env = self.cluster.env(",".join(["1"] * ranks), HPCDP_CLUSTER_SSH_HOSTNAME=1, OMPI_ALLOW_RUN_AS_ROOT=1,
                               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1, **{key: value})
        for k in ("HPCDP_FAULT", "HPCDP_CKPT_FAILPOINT"):
            env.pop(k, None)
        proc = subprocess.Popen(argv, cwd=self.tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        self.jobs[proc] = value
        return proc

    def pid(self, marker: str, rank: int) -> int | None:
        """Rank ``rank``'s process, among those of node ``rank``'s namespace."""
        for pid in self.cluster.node_pids(rank):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if marker.encode() in env and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and b"hpcdp.cli" in cmd:
                return pid
        return None

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    def end(self, proc) -> str:
        """End a job whose figures were taken: its session (mpirun, the ssh stand-ins,
        which end their nodes' daemons and ranks), then anything of it left."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        text = "" if proc.stdout.closed else proc.communicate(timeout=60)[0]  # read already (a kill's job)
        self.reap(self.jobs.pop(proc, None))
        return text

    def reap(self, marker) -> None:
        deadline = time.monotonic() + 10
        while marker and marked_pids(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in marked_pids(marker) if marker else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self) -> None:
        for proc in list(self.jobs):
            self.end(proc)


def main() -> None:
    if not (VENV / "bin" / "mpirun").exists():
        raise SystemExit(f"no Open MPI venv at {VENV}: bash tests/ulfm/setup_venv_ulfm.sh "
                         "(or HPCDP_ULFM_VENV=/path/to/it)")
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces): sudo python tests/cluster/measure_cluster_repair.py ...")
    chaos = sys.argv[1:2] == ["--chaos"]
    args = [int(a) if a.isdigit() else float(a) for a in sys.argv[2 if chaos else 1:]]
    rng = random.Random(int(os.environ.get("HPCDP_MEASURE_SEED", "0")))
    random.seed(rng.random())  # measure_repair's moments of the kills
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through the finally below
    cluster = Cluster()
    cluster.sh("down", check=False)  # a previous run's leftovers (this prefix: this script's own)
    with tempfile.TemporaryDirectory() as tmp:
        launcher = OnCluster(cluster, Path(tmp))
        try:
            if chaos:
                nodes, min_world, every = (args + [4, 2, 30.0][len(args):])[:3]
                cluster.sh("up", "--nodes", str(nodes), "--ppn", "1")
                print(f"chaos on {nodes} emulated nodes x 1 rank: a kill every {every:g} s down to {min_world}",
                      flush=True)
                mr.chaos(Path(tmp), nodes, min_world, every, launcher, pick=rng.choice, both_sides=True)
                return
            kills, nodes = (args + [10, 4][len(args):])[:2]
            cluster.sh("up", "--nodes", str(nodes), "--ppn", "1")
            rows = []
            for i in range(kills):
                rows.append(mr.one(Path(tmp), nodes, 5, i, launcher, victim=rng.randrange(1, nodes)))
                print(json.dumps(rows[-1]), flush=True)
                launcher.close()  # the job is over: anything of it left is ended
            print(f"{kills} kills, {nodes} emulated nodes x 1 rank, Open MPI `--with-ft ulfm` + heartbeat detector:")
            mr.summary(rows)
        finally:
            launcher.close()
            cluster.sh("down", check=False)
            names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
            left = [ln for ln in names if ln.startswith(PREFIX)]
            if left:
                print(f"measure_cluster_repair: namespaces still there: {left}", file=sys.stderr)


if __name__ == "__main__":
    main()
