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
    python tests/cluster/measure_cluster_repair.py --strategy hybrid-zero3 [--ppn 2] [KILLS] [NODES]
    python tests/cluster/measure_cluster_repair.py --chaos [NODES] [MIN_WORLD] [EVERY_S]

Kills: KILLS jobs of NODES ranks; in each, once step 5 is logged, a rank drawn at random
among 1..NODES-1 (rank 0 writes the metrics: its loss ends the job) is killed at a random
moment of a step. Printed per kill and as p50 / p95 / max: the kill to the survivors'
first committed step (the redone step's record in metrics.jsonl), the kill to the error
(the repair record's time, on this machine's one clock, less the repair's own time),
the repair's detection (from the failed step's start) and repair times, and the
committed steps lost (steps logged before the repair later than the step agreed on).

``--strategy hybrid-zero3`` (default ``ddp``): hybrid ZeRO-3 (parallel.zero.stage = 3,
parallel.zero.shard = "node") with ``--ppn`` ranks per node (default 2; ranks 0..ppn-1 on
node 0, and so on); the rank killed is drawn among those of nodes 1..NODES-1 (losing rank
0's node ends the job by design); its node leaves as a whole, and the lines its other
ranks print as they leave are reported with the figures.

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


# --strategy: the job's parallel settings (and how many ranks per node it wants by default)
STRATEGIES = {
    "ddp": (["parallel.strategy=ddp"], 1),
    # hybrid ZeRO-3: shards within a node, a full copy on each node; a node that loses a
    # rank leaves as a whole, the other nodes go on
    "hybrid-zero3": (["parallel.strategy=zero", "parallel.zero.stage=3", 'parallel.zero.shard="node"'], 2),
}


class OnCluster:
    """measure_repair's launcher, on the emulated cluster: ``ppn`` ranks per node, by
    slot (ranks 0..ppn-1 on node 0, and so on); ``sets``: the job's parallel settings."""

    def __init__(self, cluster: Cluster, tmp: Path, ppn: int = 1, sets: list | None = None):
        self.cluster, self.tmp, self.ppn = cluster, tmp, ppn
        self.sets = sets or STRATEGIES["ddp"][0]
        self.jobs = {}  # proc -> the job's marker

    def start(self, out: Path, ranks: int, marker: str, ft: bool, steps: int = 100000):
        hosts = self.tmp / f"hosts{ranks}"
        hosts.write_text("".join(f"{PREFIX}{i} slots={self.ppn}\n" for i in range(ranks // self.ppn)))
        argv = [str(VENV / "bin" / "mpirun"), *(["--with-ft", "ulfm", *DETECTOR] if ft else []),
                "-x", "PYTHONPATH", "--hostfile", str(hosts), "-n", str(ranks),
                *(["--map-by", "slot"] if self.ppn > 1 else []),
                "--mca", "plm_rsh_agent", str(HERE / "netns-ssh"), "--mca", "btl_tcp_if_include", f"{NET}.0/24",
                str(VENV / "bin" / "python"), "-m", "hpcdp.cli", "train",
                "--config", str(ROOT / "jobs" / "gpt_small.toml"),
                *[a for kv in self.sets for a in ("--set", kv)], "--set", "run.log_every=1", "--set", "run.eval_every=0",
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
        """Rank ``rank``'s process, among those of its node's namespace."""
        for pid in self.cluster.node_pids(rank // self.ppn):
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
    argv = sys.argv[1:]
    opts = {}
    for opt in ("--strategy", "--ppn"):
        if opt in argv:
            i = argv.index(opt)
            opts[opt] = argv[i + 1] if i + 1 < len(argv) else ""
            del argv[i:i + 2]
    strategy = opts.get("--strategy", "ddp")
    if strategy not in STRATEGIES:
        raise SystemExit(f"--strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
    sets, ppn = STRATEGIES[strategy]
    ppn = int(opts.get("--ppn", ppn))
    chaos = argv[:1] == ["--chaos"]
    args = [int(a) if a.isdigit() else float(a) for a in argv[1 if chaos else 0:]]
    rng = random.Random(int(os.environ.get("HPCDP_MEASURE_SEED", "0")))
    random.seed(rng.random())  # measure_repair's moments of the kills
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through the finally below
    cluster = Cluster()
    cluster.sh("down", check=False)  # a previous run's leftovers (this prefix: this script's own)
    with tempfile.TemporaryDirectory() as tmp:
        launcher = OnCluster(cluster, Path(tmp), ppn, sets)
        try:
            if chaos:
                nodes, min_world, every = (args + [4, 2, 30.0][len(args):])[:3]
                if ppn != 1:
                    raise SystemExit("--chaos: 1 rank per node (a hybrid job loses a node per kill)")
                cluster.sh("up", "--nodes", str(nodes), "--ppn", "1")
                print(f"chaos on {nodes} emulated nodes x 1 rank: a kill every {every:g} s down to {min_world}",
                      flush=True)
                mr.chaos(Path(tmp), nodes, min_world, every, launcher, pick=rng.choice, both_sides=True)
                return
            kills, nodes = (args + [10, 4][len(args):])[:2]
            cluster.sh("up", "--nodes", str(nodes), "--ppn", str(ppn))
            rows, failed_starts, i = [], [], 0
            while len(rows) < kills:
                # rank 0 writes the metrics: its loss (with ppn > 1, its node's) ends the job
                victim = rng.randrange(ppn, nodes * ppn)
                try:
                    rows.append(mr.one(Path(tmp), nodes * ppn, 5, i, launcher, victim=victim))
                    print(json.dumps(rows[-1]), flush=True)
                except SystemExit as err:
                    # a job that ended before the kill (Open MPI 5.0.11 with 2 ranks per node: a
                    # SIGSEGV in coll/han's communicator creation at start, 1 of 6 starts once) is
                    # counted and started again; any other failure ends the measurement
                    if "not found" not in str(err) or len(failed_starts) >= 3:
                        raise
                    failed_starts.append(str(err))
                    print(f"run {i}: the job ended before the kill (started again):\n" + "\n".join(
                        ln for ln in str(err).splitlines() if "hpcdp:" in ln or "Signal:" in ln or "han" in ln),
                        flush=True)
                i += 1
                launcher.close()  # the job is over: anything of it left is ended
            print(f"{kills} kills, {strategy}, {nodes} emulated nodes x {ppn} rank(s), Open MPI `--with-ft ulfm` "
                  "+ heartbeat detector:")
            mr.summary(rows)
            print(f"jobs that ended before their kill (started again): {len(failed_starts)}")
            if ppn > 1:
                print(f"ranks that left with their node: {[r['left_ranks'] for r in rows]}; leave lines per kill: "
                      f"{[len(r['leave_lines']) for r in rows]}")
                for line in sorted({ln for r in rows for ln in r["leave_lines"]}):
                    print(f"  {line}")
        finally:
            launcher.close()
            cluster.sh("down", check=False)
            names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split("\n")
            left = [ln for ln in names if ln.startswith(PREFIX)]
            if left:
                print(f"measure_cluster_repair: namespaces still there: {left}", file=sys.stderr)


if __name__ == "__main__":
    main()
