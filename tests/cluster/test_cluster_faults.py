"""Faults across nodes: a node's link taken down during training, or every process of a
node killed, ends the whole job within comm.timeout plus a bound, with an hpcdp line that
names the ranks the others lost, no segfault, and nothing left running (neither a
process of the job nor anything inside a node's namespace).

What makes this hold (docs/cluster.md, "Faults"): hpcdp's own deadline (comm.timeout)
fires on the reachable ranks, which print the line and call MPI_Abort; mpiexec ends them
and exits. The cut-off ranks' MPI_Abort can never reach mpiexec: hpcdp ends them itself
after hpcdp.failure.ranks.ABORT_S (os._exit), and the launcher's ssh stand-in ends the
node's proxy and ranks once mpiexec has gone (as sshd does when a session's client goes)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import marked_pids

TIMEOUT = 10.0  # comm.timeout of the jobs here
LINK_TIMEOUT = 20.0  # the link cut's: above UCX's ~16 s keepalive detection
BOUND = 25.0    # seconds after comm.timeout by which every rank must have exited

TINY = ["data.kind=synthetic_classification", "data.n_samples=512", "data.n_features=16",
        "data.n_classes=4", "model.sizes=[16, 32, 4]", "train.global_batch=32", "run.log_every=1",
        "run.eval_every=0", "run.dtype=float32", "train.steps=1000000"]


def _train(cluster, tmp_path, strategy_sets, timeout=TIMEOUT, **env):
    run_dir = tmp_path / "run"
    sets = TINY + strategy_sets + [f'run.out_dir="{run_dir}"', f"comm.timeout={timeout}"]
    argv = [sys.executable, "-m", "hpcdp.cli", "train"] + [a for s in sets for a in ("--set", s)]
    started = cluster.start("2,2", argv, cwd=tmp_path, env=cluster.env("2,2", **env))
    metrics = run_dir / "metrics.jsonl"
    limit = time.monotonic() + 120
    while started[0].poll() is None and time.monotonic() < limit:
        if metrics.exists() and metrics.stat().st_size > 0:  # step 1 logged: training runs
            break
        time.sleep(0.05)
    assert started[0].poll() is None, "the job ended before training ran:\n" + "".join(t for _, t in started[1])
    time.sleep(0.5)  # well inside training
    return started


def _ranks_in(cluster, node: int, marker: str) -> list[int]:
    """hpcdp ranks of the job ``marker`` still running inside ``node``."""
    out = []
    for pid in cluster.node_pids(node):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if b"hpcdp.cli" in cmd and marker.encode() in env:
            out.append(pid)
    return out


def _said_by_reachable_ranks(out: str) -> None:
    """The reachable ranks (0, 1) ended through hpcdp: no rank segfaulted, and one hpcdp
    line names the lost ranks 2, 3."""
    assert not re.search(r"EXIT CODE: (11|139)|signal 11|Segmentation", out), "a rank segfaulted\n" + out[-6000:]
    lost = [ln for ln in out.splitlines()
            if re.match(r"hpcdp: error: rank [01] of 4 at step \d+: .*(rank|ranks \[?)[^\]]*\b[23]\b", ln)]
    assert lost, "no hpcdp line names the lost ranks 2, 3\n" + out[-6000:]
    said = [ln for ln in out.splitlines() if re.match(r"hpcdp: error: rank [01] of 4\b", ln)]
    assert len(said) == 1, "the reachable ranks should say it once:\n" + "\n".join(said)


def _judge(cluster, started, t_fault, timeout=TIMEOUT):
    job = cluster.finish(*started, timeout=timeout + BOUND + 60)
    out = job.out
    assert not job.timed_out, "the job did not end (hang)\n" + out[-6000:]
    took = job.t_exit - t_fault
    assert job.status not in (0, None), f"exit status {job.status}\n" + out[-6000:]
    _said_by_reachable_ranks(out)
    assert took <= timeout + BOUND, f"{took:.1f}s from the fault to mpiexec's exit (bound {timeout + BOUND:g}s)"
    assert not job.leftovers, f"processes of the job left running: {job.leftovers}"
    # nothing left inside the nodes either (the cut-off node's proxy and ranks): within the bound
    limit = t_fault + timeout + BOUND
    inside = cluster.node_pids(1)
    while inside and time.monotonic() < limit:
        time.sleep(0.2)
        inside = cluster.node_pids(1)
    assert not inside, f"processes left in node 1's namespace {timeout + BOUND:g}s after the fault: {inside}"
    return job, took


@pytest.mark.parametrize("strategy", [["parallel.strategy=ddp"]], ids=["ddp"])
def test_a_node_losing_its_link_ends_the_job(unlimited, tmp_path, strategy):
    cluster = unlimited
    started = _train(cluster, tmp_path, strategy, timeout=LINK_TIMEOUT)
    t_fault = time.monotonic()
    cluster.sh("link", "1", "down")
    _judge(cluster, started, t_fault, timeout=LINK_TIMEOUT)


def test_cut_off_ranks_end_themselves_when_nothing_kills_them(unlimited, tmp_path):
    """A plain ssh (HPCDP_CLUSTER_SSH_CLEANUP=0): nobody ends the cut-off node's processes.
    Its ranks' MPI_Abort cannot reach mpiexec; hpcdp ends them after ABORT_S (before that
    change they blocked forever in MPI_Finalize). Only hydra's proxy is left (killed here)."""
    from hpcdp.failure.ranks import ABORT_S

    cluster = unlimited
    started = _train(cluster, tmp_path, ["parallel.strategy=ddp"], HPCDP_CLUSTER_SSH_CLEANUP=0)
    marker = started[3]
    t_fault = time.monotonic()
    cluster.sh("link", "1", "down")
    job = cluster.finish(*started, timeout=TIMEOUT + BOUND + 60, reap=False)
    assert job.status not in (0, None) and not job.timed_out, job.out[-6000:]
    _said_by_reachable_ranks(job.out)
    limit = t_fault + TIMEOUT + ABORT_S + BOUND
    left = _ranks_in(cluster, 1, marker)
    while left and time.monotonic() < limit:
        time.sleep(0.2)
        left = _ranks_in(cluster, 1, marker)
    waited = time.monotonic() - t_fault
    for pid in cluster.node_pids(1) + marked_pids(marker):  # the proxy (and ranks, if the check fails)
        subprocess.run(["kill", "-KILL", str(pid)], check=False)
    assert not left, f"cut-off ranks {left} still running {waited:.0f}s after the link went down"


def test_a_node_whose_processes_are_killed_ends_the_job(unlimited, tmp_path):
    cluster = unlimited
    started = _train(cluster, tmp_path, ["parallel.strategy=ddp"])
    t_fault = time.monotonic()
    victims = cluster.node_pids(1)  # node 1's proxy and its two ranks: the node "crashed"
    assert len(victims) >= 2, f"node 1 runs {victims}"
    subprocess.run(["kill", "-KILL", *map(str, victims)], check=False)
    job = cluster.finish(*started, timeout=TIMEOUT + BOUND + 60)
    assert not job.timed_out, "the job did not end (hang)\n" + job.out[-6000:]
    assert job.status not in (0, None)
    assert job.t_exit - t_fault <= TIMEOUT + BOUND, f"{job.t_exit - t_fault:.1f}s from the kill to the exit"
    assert not job.leftovers, f"processes of the job left running: {job.leftovers}"
    assert not cluster.node_pids(1)
