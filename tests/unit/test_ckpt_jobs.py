"""Checkpoints of whole ``hpcdp train`` jobs launched by the test (``mpiexec -n N``):

- SIGUSR1 / SIGTERM: the running step finishes, every rank writes, the job exits 0
  with a line saying where it saved; ``--resume latest`` continues on another rank
  count;
- SIGKILL of one rank in the middle of a save (a failpoint, see hpcdp/io/failpoint.py)
  or of rank 0 just before the marker: the previous checkpoint stays the latest, and
  resuming from it ends with the same weights as a run that was never killed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdp.launch import THREAD_ENV, find_mpiexec

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--set", 'data.kind="synthetic_classification"', "--set", "data.n_samples=512",
         "--set", "model.sizes=[32, 48, 8]", "--set", "run.eval_every=0"]


def _cmd(tmp, ranks, name, *args):
    cmd = [sys.executable, "-m", "hpcdp.cli", "train", *SMALL, "--set", f'run.out_dir="{tmp / name}"', *args]
    return [find_mpiexec(), "-n", str(ranks)] + cmd if ranks > 1 else cmd


def _env(**extra):
    return {**os.environ, **THREAD_ENV, "PYTHONPATH": str(ROOT), **extra}


def _run(tmp, ranks, name, *args, env=None, ok=True):
    proc = subprocess.run(_cmd(tmp, ranks, name, *args), env=env or _env(), capture_output=True, text=True,
                          timeout=600, cwd=tmp)
    if ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _weights(ckpt) -> str:
    from hpcdp.io.interop.inspect import weights_sha256
    return weights_sha256(ckpt)


def _wait_for_steps(run_dir: Path, proc, at_least: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the job ended early (exit {proc.returncode}): {proc.stdout.read()[-3000:]}")
        if metrics.exists():
            steps = [json.loads(x).get("step", 0) for x in metrics.read_text().splitlines() if x.strip()]
            if steps and max(steps) >= at_least:
                return
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no step {at_least} in {metrics} within {timeout} s")


@pytest.mark.parametrize("sig,ranks,strategy,resume_ranks", [
    (signal.SIGUSR1, 2, "ddp", 3),
    (signal.SIGTERM, 3, "ps-dedicated-async", 2),  # 2 workers decide; the server saves on SAVE
])
def test_a_signal_saves_and_exits_zero_then_resume_latest_on_other_ranks(tmp_path, sig, ranks, strategy,
                                                                          resume_ranks):
    from hpcdp.io.format.commit import latest
    from hpcdp.io.format.index import read_index

    ck = tmp_path / "ck"
    args = ["--set", "train.steps=1000000", "--set", "run.log_every=1", "--set", f'checkpoint.dir="{ck}"',
            "--set", f'parallel.strategy="{strategy.split("-")[0]}"']
    if strategy == "ps-dedicated-async":
        args += ["--set", "parallel.ps.colocated=false", "--set", 'parallel.ps.mode="async"']
    proc = subprocess.Popen(_cmd(tmp_path, ranks, "first", *args), env=_env(), cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for_steps(tmp_path / "first", proc, 3)
        proc.send_signal(sig)  # the launcher passes it on to every rank, as Slurm does
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    saved = latest(ck)
    step = read_index(saved).step
    assert f"stopped by {sig.name} after step {step}: checkpoint saved in {saved}" in out
    assert (tmp_path / "first" / "stopped").read_text().split()[:2] == [sig.name, str(step)]
    assert "eval @" not in out  # stopped runs skip the final evaluation

    res = _run(tmp_path, resume_ranks, "second", "--set", f"train.steps={step + 4}", "--set",
               f'checkpoint.dir="{ck}"', "--set", 'parallel.strategy="ddp"', "--resume", "latest")
    assert f"resumed from {saved}: step {step}" in res.stdout
    assert read_index(latest(ck)).step == step + 4
    lines = [json.loads(x) for x in (tmp_path / "second" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "step" in x] == list(range(step + 1, step + 5))


@pytest.mark.parametrize("failpoint", ["ckpt-mid-write@4:1", "ckpt-before-marker@4:0"])
def test_sigkill_during_a_save_leaves_the_previous_checkpoint(tmp_path, failpoint):
    from hpcdp.io.format.commit import latest, list_checkpoints

    every = ["--set", "train.steps=8", "--set", "checkpoint.every=2", "--set", "optim.kind=\"adamw\"",
             "--set", "optim.lr=0.01"]
    ck = tmp_path / "ck"
    killed = _run(tmp_path, 2, "killed", *every, "--set", f'checkpoint.dir="{ck}"',
                  env=_env(HPCDP_CKPT_FAILPOINT=failpoint), ok=False)
    assert killed.returncode != 0
    assert latest(ck).name == "step-00000002"
    assert [(s, ok) for s, _, ok in list_checkpoints(ck)] in ([(2, True)], [(2, True), (4, False)])
    # resume from what survived, on the same ranks: the end equals an unkilled run
    _run(tmp_path, 2, "resumed", *every, "--set", f'checkpoint.dir="{ck}"', "--resume", "latest")
    _run(tmp_path, 2, "straight", *every, "--set", f'checkpoint.dir="{tmp_path / "ck2"}"')
    assert [(s, ok) for s, _, ok in list_checkpoints(ck)] == [(s, True) for s in (2, 4, 6, 8)]
    assert _weights(ck / "step-00000008") == _weights(tmp_path / "ck2" / "step-00000008")
    assert not any(p.name.startswith(".") for p in ck.iterdir())  # no temporary left behind


def test_the_writer_process_dying_mid_save_keeps_the_previous_checkpoint(tmp_path):
    """Asynchronous save, writer process (the default): its helper is SIGKILLed
    halfway through rank 1's file of step 4; the job ends on every rank saying so,
    and step 2 stays the latest checkpoint."""
    from hpcdp.io.format.commit import latest, list_checkpoints

    ck = tmp_path / "ck"
    killed = _run(tmp_path, 2, "killed", "--set", "train.steps=8", "--set", "checkpoint.every=2", "--set",
                  "checkpoint.asynchronous=true", "--set", f'checkpoint.dir="{ck}"',
                  env=_env(HPCDP_CKPT_FAILPOINT="ckpt-mid-write@4:1"), ok=False)
    out = killed.stdout + killed.stderr
    assert killed.returncode != 0
    assert ("save of step 4: the checkpoint writer process of rank 1 died (killed by SIGKILL) while writing "
            "rank-00001.h5; this checkpoint is not committed, the previous one stays the latest") in out, out[-3000:]
    assert latest(ck).name == "step-00000002"
    assert [(s, ok) for s, _, ok in list_checkpoints(ck)] == [(2, True)]


@pytest.mark.parametrize("sig,mode", [(signal.SIGTERM, "async"), (signal.SIGUSR1, "sync")])
def test_a_signal_to_a_dedicated_server_alone_stops_the_job_with_a_save(tmp_path, sig, mode):
    """A preemption notice for the server's node reaches only the server rank: the
    workers learn of it, the whole job saves (the server its shard) and exits 0."""
    from hpcdp.bench.faults import rank_pid
    from hpcdp.io.format.commit import latest
    from hpcdp.io.format.index import read_index

    ck = tmp_path / "ck"
    args = ["--set", "train.steps=1000000", "--set", "run.log_every=1", "--set", f'checkpoint.dir="{ck}"',
            "--set", 'parallel.strategy="ps"', "--set", "parallel.ps.colocated=false",
            "--set", f'parallel.ps.mode="{mode}"']
    proc = subprocess.Popen(_cmd(tmp_path, 3, "first", *args), env=_env(), cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for_steps(tmp_path / "first", proc, 3)
        server = rank_pid(str(tmp_path / "first"), 2)  # ranks 0, 1 work; rank 2 serves
        assert server is not None
        os.kill(server, sig)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    saved = latest(ck)
    index = read_index(saved)
    assert f"stopped by {sig.name} (received by rank 2) after step {index.step}: checkpoint saved in {saved}" in out
    assert list(index.arrays["rank_ps_server"]) == [-1, -1, 0]  # the server wrote its shard
    assert (tmp_path / "first" / "stopped").read_text().split()[:2] == [sig.name, str(index.step)]
