"""failure.on_rank_loss = "continue" across nodes: Open MPI 5 `mpirun --with-ft ulfm` (the
venv of tests/ulfm/setup_venv_ulfm.sh) starts DDP on 3 emulated nodes x 1 rank through its
rsh launcher pointed at tests/cluster/netns-ssh; node 2's link is cut (`ip link set eth0
down` in its namespace) after step 5. The survivors (ranks 0, 1) repair and finish every
step with one repair line; the cut rank ends itself (nothing of the job's ranks is left
in node 2's namespace).

Detection across a link is ULFM's own heartbeat detector (`--mca mpi_ft_detector true`,
period 0.5 s, timeout 2 s): without it no MPI call on the survivors fails and hpcdp's
deadline ends the job the classic way. Open MPI's runtime (PRRTE) cannot outlive a lost
daemon: with its TCP keepalive on it ends the whole job ("PRTE has lost communication
with a remote daemon"), so it is left off, and mpirun then waits for the cut node's
daemon after the survivors are done; the link is brought back here so that it collects
it and exits (docs/fault-tolerance.md, "A node's link cut under "continue"")."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from conftest import PREFIX, ROOT, marked_pids

VENV = ROOT / os.environ.get("HPCDP_ULFM_VENV", ".venv-ulfm")  # relative: to the repository root
NET = os.environ.get("HPCDP_CLUSTER_NET", "10.231.47")
STEPS = 1000
SETS = ["data.kind=synthetic_classification", "data.n_samples=512", "data.n_features=16",
        "data.n_classes=4", "model.sizes=[16, 32, 4]", "train.global_batch=30", f"train.steps={STEPS}",
        "run.log_every=1", "run.eval_every=0", "parallel.strategy=ddp", "comm.timeout=10",
        'failure.on_rank_loss="continue"']
DETECTOR = ["--mca", "mpi_ft_detector", "true", "--mca", "mpi_ft_detector_thread", "true",
            "--mca", "mpi_ft_detector_period", "0.5", "--mca", "mpi_ft_detector_timeout", "2"]


def _ranks_in(cluster, node: int, marker: str) -> list[int]:
    out = []
    for pid in cluster.node_pids(node):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"hpcdp.cli" in cmd and marker.encode() in env:
            out.append(pid)
    return out


def _wait(cond, limit: float, step: float = 0.1) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return cond()


def test_a_node_losing_its_link_is_repaired_around(unlimited, tmp_path):
    cluster = unlimited
    mpirun = VENV / "bin" / "mpirun"
    if not mpirun.exists():
        pytest.skip(f"no Open MPI venv at {VENV}: run bash tests/ulfm/setup_venv_ulfm.sh (tests/run_cluster.sh does)")
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"{PREFIX}{i} slots=1\n" for i in range(3)))
    run_dir = tmp_path / "run"
    argv = [str(mpirun), "--with-ft", "ulfm", *DETECTOR, "-x", "PYTHONPATH", "--hostfile", str(hosts), "-n", "3",
            "--mca", "plm_rsh_agent", str(ROOT / "tests" / "cluster" / "netns-ssh"),
            "--mca", "btl_tcp_if_include", f"{NET}.0/24",
            str(VENV / "bin" / "python"), "-m", "hpcdp.cli", "train"]
    for s in SETS + [f'run.out_dir="{run_dir}"']:
        argv += ["--set", s]
    env = cluster.env("1,1,1", HPCDP_CLUSTER_SSH_HOSTNAME=1,
                      OMPI_ALLOW_RUN_AS_ROOT=1, OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
    env.pop("HPCDP_FAULT", None)
    proc, lines, reader, marker = cluster.launch(argv, cwd=tmp_path, env=env)
    metrics = run_dir / "metrics.jsonl"

    def records():
        # complete lines only: the job may be halfway through writing the last one
        text = metrics.read_text() if metrics.exists() else ""
        return [json.loads(ln) for ln in text.split("\n")[:-1] if ln.strip()]
    try:
        running = _wait(lambda: proc.poll() is not None or len(records()) >= 5, 120)
        assert running and proc.poll() is None, "the job ended before step 5:\n" + "".join(t for _, t in lines)[-6000:]
        t_cut = time.monotonic()
        cluster.sh("link", "2", "down")
        # the survivors finish every step, and their ranks end (after a repair hpcdp ends
        # a rank whose MPI_Finalize still waits for the lost one within 10 s)
        done = _wait(lambda: any(r.get("step") == STEPS for r in records())
                     and not _ranks_in(cluster, 0, marker) and not _ranks_in(cluster, 1, marker), 90, 0.2)
        out = "".join(t for _, t in lines)
        assert done, f"the survivors did not finish {STEPS} steps\n" + out[-6000:]
        # the cut rank ends itself: it sees its peers lost (rank 0 among them, so its job ends)
        assert _wait(lambda: not _ranks_in(cluster, 2, marker), 20, 0.2), \
            f"the cut node's rank is still running: {_ranks_in(cluster, 2, marker)}"
        repairs = [(t, ln) for t, ln in lines if ln.startswith("repair:")]
        assert len(repairs) == 1, out[-6000:]
        m = re.match(r"repair: rank 2 lost at step (\d+); 3 -> 2 ranks; last committed step (\d+), redoing step (\d+) "
                     r"with the same global batch; detected in ([\d.]+)s, repaired in ([\d.]+)s; replicas equal",
                     repairs[0][1])
        assert m and int(m.group(3)) == int(m.group(2)) + 1, repairs[0][1]
        assert not [ln for ln in out.splitlines() if ln.startswith("hpcdp: error: rank 0") or
                    ln.startswith("hpcdp: error: rank 1")], out[-6000:]
        recs = records()
        rep = [r["repair"] for r in recs if "repair" in r]
        assert len(rep) == 1 and rep[0]["lost_ranks"] == [2] and (rep[0]["world_before"], rep[0]["world_after"]) == (3, 2)
        committed = rep[0]["committed_step"]
        steps = [r["step"] for r in recs if "step" in r and "loss" in r]
        lost_step = int(m.group(1))
        assert steps == [s for s in range(1, STEPS + 1) if s != lost_step or committed == lost_step - 1], steps[-20:]
        print(f"link cut -> repair line {repairs[0][0] - t_cut:.2f}s (detected in {m.group(4)}s, "
              f"repaired in {m.group(5)}s)")
        # Open MPI's mpirun waits for the cut node's daemon: the link comes back, it collects
        # it and ends with status 0
        cluster.sh("link", "2", "up")
        proc.wait(timeout=60)
        assert proc.returncode == 0, out[-6000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        reader.join(timeout=10)
        for pid in marked_pids(marker):  # never leave them running, whatever the verdict
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    left = [p for i in range(3) for p in _ranks_in(cluster, i, marker)]
    assert not left, f"ranks left: {left}"
