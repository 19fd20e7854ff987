"""Fault injection: launch real ``hpcdp train`` jobs under ``mpiexec``, break one rank,
and measure how the job ends (tests/faults asserts it; ``hpcdp bench faults`` prints
the table docs/results.md records).

Each :class:`Scenario` is a small job (a synthetic 16-feature MLP, so startup is
fast) with one fault: an error on one rank before training (a data file missing on
one node, a bad value, out of memory, config skew), an exception or exit at step k
(``HPCDP_FAULT``, :mod:`hpcdp.failure.inject`), a signal sent to one rank or to the
launcher once training runs, SIGKILL / SIGSTOP of one rank mid-training, or a
diverging learning rate. :func:`launch` runs it under a timeout in its own session,
timestamps every output line, and afterwards looks for processes left behind (every
process of the job carries a unique marker in its command line).

    hpcdp bench faults [--only NAME ...] [--out faults.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from hpcdp.launch import THREAD_ENV, find_mpiexec

TINY = ["data.kind=synthetic_classification", "data.n_samples=512", "data.n_features=16",
        "data.n_classes=4", "model.sizes=[16, 32, 4]", "train.global_batch=32", "run.log_every=1",
        "run.eval_every=0", "run.dtype=float32"]
STRATEGY = {
    "ddp": ["parallel.strategy=ddp"],
    "ps-sync": ["parallel.strategy=ps", "parallel.ps.mode=sync"],
    "ps-async": ["parallel.strategy=ps", "parallel.ps.mode=async", "parallel.ps.staleness=2"],
    "ps-dedicated": ["parallel.strategy=ps", "parallel.ps.mode=async", "parallel.ps.staleness=2",
                     "parallel.ps.colocated=false"],
    "zero3": ["parallel.strategy=zero", "parallel.zero.stage=3"],
    "none": ["parallel.strategy=none"],
}
LONG = 1_000_000  # steps of a job that runs until a signal ends it
SLOW_TIMEOUT = 120.0  # comm.timeout where the failure must NOT wait for a timeout
STUCK_TIMEOUT = 5.0   # comm.timeout where a stuck rank is found by the others' timeout


@dataclass
class Scenario:
    name: str
    strategy: str
    ranks: int = 2
    steps: int = 12
    sets: list = field(default_factory=list)        # overrides on every rank
    rank_sets: dict = field(default_factory=dict)   # rank -> extra overrides (MPMD)
    data_on: tuple | None = None   # ranks whose working directory holds data.npz (others: missing)
    fault: str = ""                # HPCDP_FAULT
    signal: tuple | None = None    # (target: rank or "launcher", signal name), once training runs
    timeout: float = SLOW_TIMEOUT  # comm.timeout
    status: object = "nonzero"     # expected exit status: an int or "nonzero"
    patterns: tuple = ()           # regexes the output must match
    one_line: bool = False         # exactly one "hpcdp: error:" line
    tracebacks: int | None = None  # exact number of tracebacks in the output
    bound: float = 60.0            # seconds from the fault to the full exit
    what: str = ""                 # the fault, in words (for the table)


def lost(rank, size, step) -> str:
    """The line of a rank killed at ``step`` (a regex: ``step`` may be one)."""
    return rf"hpcdp: error: rank {rank} of {size} lost at step {step}: its process was killed by SIGKILL"


def scenarios() -> list[Scenario]:
    S = Scenario
    inj = "injected fault"
    out = [
        # -- before training: every rank agrees, exit status 2, rank 0 prints one line
        S("missing-file-one-rank", "ddp", data_on=(0,), status=2, one_line=True, tracebacks=0,
          patterns=(r"hpcdp: error: data\.path: file 'data\.npz' is missing on rank 1 of 2 \(found on rank 0\)",),
          what="data file missing on one rank's node"),
        S("bad-value-one-rank", "ps-sync", rank_sets={1: ["optim.lr=-1"]}, status=2, one_line=True,
          tracebacks=0, patterns=(r"hpcdp: error: rank 1: optim\.lr: -1\.0 is out of range",),
          what="optim.lr = -1 on one rank"),
        S("memory-one-rank", "ps-async", fault="1:0:memory", status=2, one_line=True, tracebacks=0,
          patterns=(r"hpcdp: error: rank 1: out of memory \(MemoryError",), what="MemoryError on one rank in setup"),
        S("skew-steps", "ddp", rank_sets={0: ["train.steps=30"], 1: ["train.steps=40"]}, status=2,
          one_line=True, tracebacks=0,
          patterns=(r"config differs across ranks.*train\.steps = 30 on rank 0, 40 on rank 1",),
          what="train.steps differs between ranks"),
        S("skew-log-every", "ps-async", rank_sets={1: ["run.log_every=3"]}, status=2, one_line=True,
          tracebacks=0, patterns=(r"run\.log_every = 1 on rank 0, 3 on rank 1",),
          what="run.log_every differs between ranks"),
        # -- mid-training: the failing rank prints its cause once and aborts the job
        S("raise-ddp", "ddp", fault="1:5:raise", status=1, tracebacks=1, one_line=True,
          patterns=(rf"hpcdp: error: rank 1 of 2 at step 5: RuntimeError: {inj}",),
          what="exception on rank 1 at step 5"),
        S("raise-ps-sync", "ps-sync", fault="1:5:raise", status=1, tracebacks=1, one_line=True,
          patterns=(rf"hpcdp: error: rank 1 of 2 at step 5: RuntimeError: {inj}",),
          what="exception on rank 1 at step 5"),
        S("raise-ps-async", "ps-async", fault="0:5:raise", status=1, tracebacks=1, one_line=True,
          patterns=(rf"hpcdp: error: rank 0 of 2 at step 5: RuntimeError: {inj}",),
          what="exception on rank 0 (worker + server) at step 5"),
        S("raise-ps-dedicated", "ps-dedicated", ranks=3, fault="1:5:raise", status=1, tracebacks=1,
          one_line=True, patterns=(rf"hpcdp: error: rank 1 of 3 at step 5: RuntimeError: {inj}",),
          what="exception on worker 1 at step 5 (dedicated server)"),
        S("raise-none", "none", ranks=1, fault="0:5:raise", status=1, tracebacks=1, one_line=True,
          patterns=(rf"hpcdp: error: at step 5: RuntimeError: {inj}",), what="exception at step 5 (one rank)"),
        S("exit-ddp", "ddp", fault="1:5:exit", status=1, one_line=True,
          patterns=(r"hpcdp: error: rank 1 of 2 at step 5: the rank exited \(sys\.exit\(0\)\)",),
          what="sys.exit(0) on rank 1 at step 5"),
        # a rank killed outright is named by its watcher (hpcdp.failure.watch), once
        S("kill-ddp", "ddp", steps=LONG, signal=(1, "SIGKILL"), one_line=True, tracebacks=0,
          patterns=(lost(1, 2, r"\d+"), r"(KILLED BY SIGNAL: 9|EXIT CODE: 9|signal 9)"),
          what="SIGKILL to rank 1"),
        S("kill-ps-async", "ps-async", steps=LONG, signal=(1, "SIGKILL"), one_line=True, tracebacks=0,
          patterns=(lost(1, 2, r"\d+"), r"(KILLED BY SIGNAL: 9|EXIT CODE: 9|signal 9)"),
          what="SIGKILL to rank 1"),
        S("kill-step-ddp", "ddp", fault="1:5:kill", one_line=True, tracebacks=0, patterns=(lost(1, 2, 5),),
          what="SIGKILL of rank 1 at step 5"),
        S("kill-step-zero3", "zero3", fault="1:5:kill", one_line=True, tracebacks=0, patterns=(lost(1, 2, 5),),
          what="SIGKILL of rank 1 at step 5"),
        S("kill-step-ps-dedicated", "ps-dedicated", ranks=3, fault="1:5:kill", one_line=True, tracebacks=0,
          patterns=(lost(1, 3, 5),), what="SIGKILL of worker 1 at step 5 (dedicated server)"),
        S("kill-ps-server", "ps-dedicated", ranks=3, steps=LONG, signal=(2, "SIGKILL"), one_line=True,
          tracebacks=0, patterns=(lost(2, 3, r"\d+"),), what="SIGKILL to the dedicated server (rank 2)"),
        S("stop-ddp", "ddp", steps=LONG, signal=(1, "SIGSTOP"), timeout=STUCK_TIMEOUT,
          patterns=(r"hpcdp: error: rank 0 of 2 at step \d+: .*(\[1\]|rank 1\b)",),
          what="SIGSTOP to rank 1 (stuck)"),
        S("stop-ps-sync", "ps-sync", steps=LONG, signal=(1, "SIGSTOP"), timeout=STUCK_TIMEOUT,
          patterns=(r"hpcdp: error: rank 0 of 2 at step \d+: .*still waiting for rank 1\b",),
          what="SIGSTOP to rank 1 (stuck)"),
        S("stop-ps-async", "ps-async", steps=LONG, signal=(1, "SIGSTOP"), timeout=STUCK_TIMEOUT,
          patterns=(r"hpcdp: error: rank 0 of 2 at step \d+: .*still waiting for rank 1\b",),
          what="SIGSTOP to rank 1 (stuck)"),
        S("sigint-rank-ddp", "ddp", steps=LONG, signal=(1, "SIGINT"), status=130, one_line=True,
          tracebacks=0, patterns=(r"hpcdp: error: rank 1 of 2 at step \d+: stopped by SIGINT",),
          what="SIGINT to rank 1"),
        S("sigterm-rank-ps-sync", "ps-sync", steps=LONG, signal=(1, "SIGTERM"), status=143, one_line=True,
          tracebacks=0, patterns=(r"hpcdp: error: rank 1 of 2 at step \d+: stopped by SIGTERM",),
          what="SIGTERM to rank 1"),
        S("sigint-launcher-ddp", "ddp", steps=LONG, signal=("launcher", "SIGINT"), tracebacks=0,
          patterns=(r"hpcdp: error: rank \d of 2 at step \d+: stopped by SIGINT",),
          what="Ctrl-C (SIGINT) to mpiexec"),
        S("sigint-launcher-ps-async", "ps-async", steps=LONG, signal=("launcher", "SIGINT"), tracebacks=0,
          patterns=(r"hpcdp: error: rank \d of 2 at step \d+: stopped by SIGINT",),
          what="Ctrl-C (SIGINT) to mpiexec"),
        S("sigterm-launcher-ps-sync", "ps-sync", steps=LONG, signal=("launcher", "SIGTERM"), tracebacks=0,
          patterns=(r"hpcdp: error: rank \d of 2 at step \d+: stopped by SIGTERM",),
          what="SIGTERM to mpiexec"),
        # -- the run's end: a rank stuck on its way out, an MPI_Finalize that never returns
        S("stop-at-end-ddp", "ddp", fault="1:0:stop-at-end", timeout=STUCK_TIMEOUT, one_line=True,
          patterns=(r"hpcdp: error: rank 0 of 2: .*waited [\d.]+s for every rank to finish the run",),
          what="rank 1 stuck after its last step"),
        S("stop-in-finalize-ddp", "ddp", fault="1:0:stop-in-finalize", timeout=STUCK_TIMEOUT, one_line=True,
          patterns=(r"hpcdp: error: rank 0: MPI_Finalize did not return within 5s",),
          what="MPI_Finalize never returns (rank 1 stuck in it)"),
        # -- non-finite values
        S("lr-1e6-ddp", "ddp", sets=["optim.lr=1e6"], status=1, tracebacks=0,
          patterns=(r"hpcdp: error: rank \d of 2 at step \d+: non-finite (loss|gradient norm)",),
          what="optim.lr = 1e6 (diverges)"),
        S("lr-1e6-ps-async", "ps-async", sets=["optim.lr=1e6"], status=1, tracebacks=0,
          patterns=(r"hpcdp: error: rank \d of 2 at step \d+: non-finite (loss|gradient norm)",),
          what="optim.lr = 1e6 (diverges)"),
        S("lr-1e6-none", "none", ranks=1, sets=["optim.lr=1e6"], status=1, tracebacks=0, one_line=True,
          patterns=(r"hpcdp: error: at step \d+: non-finite (loss|gradient norm)",),
          what="optim.lr = 1e6 (diverges, one rank)"),
        S("nan-skip-ddp", "ddp", fault="1:4:nan", sets=["train.on_nonfinite=skip"], status=0,
          what="NaN gradient on rank 1 at step 4, on_nonfinite = skip"),
        S("nan-skip-ps-sync", "ps-sync", fault="1:4:nan", sets=["train.on_nonfinite=skip"], status=0,
          what="NaN gradient on rank 1 at step 4, on_nonfinite = skip"),
    ]
    return out


# -- launching ------------------------------------------------------------------------

def marked_pids(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (this job's)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if marker in (d / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def rank_pid(marker: str, rank: int) -> int | None:
    """The pid of ``rank``'s training process: of the two ``hpcdp train`` runs per rank
    (hpcdp.failure.watch), the one whose parent is the other (the watcher)."""
    found = {}
    for pid in marked_pids(marker):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"hpcdp.cli" in cmd and f"PMI_RANK={rank}".encode() in env:
            found[pid] = ppid
    workers = [pid for pid, ppid in found.items() if ppid in found]
    return workers[0] if workers else (next(iter(found)) if found else None)


@dataclass
class Result:
    status: int | None
    out: str
    t_fault: float | None      # monotonic time of the fault (signal sent, or hook fired)
    t_exit: float | None       # monotonic time the launcher exited
    leftovers: list
    run_dir: Path
    timed_out: bool = False
    t_start: float = 0.0       # monotonic time of the launch

    @property
    def exit_after_fault(self) -> float | None:
        if self.t_fault is None or self.t_exit is None:
            return None
        return self.t_exit - self.t_fault


def _sections(sc: Scenario, marker: str, run_dir: Path, workdir: Path):
    data = TINY
    if sc.data_on is not None:  # a file of 512 x 16 samples instead (no synthetic keys: they are not read)
        data = ["data.kind=npz", "data.path=data.npz"] + [s for s in TINY if not s.startswith("data.")]
    common = data + STRATEGY[sc.strategy] + [f"train.steps={sc.steps}", f"comm.timeout={sc.timeout}",
                                             f"run.name={marker}", f'run.out_dir="{run_dir}"'] + sc.sets
    per_rank = sc.rank_sets or sc.data_on is not None
    if not per_rank:
        return [(sc.ranks, common, None)]
    out = []
    for r in range(sc.ranks):
        wdir = None
        if sc.data_on is not None:
            wdir = workdir / f"node{r}"
            wdir.mkdir(exist_ok=True)
        out.append((1, common + sc.rank_sets.get(r, []), wdir))
    return out


def _write_data(sc: Scenario, workdir: Path) -> None:
    import numpy as np
    rng = np.random.default_rng(0)
    for r in sc.data_on or ():
        d = workdir / f"node{r}"
        d.mkdir(exist_ok=True)
        np.savez(d / "data.npz", x=rng.normal(size=(512, 16)), y=rng.integers(0, 4, 512))


def launch(sc: Scenario, workdir: Path, *, limit: float = 240.0) -> Result:
    """Run ``sc`` in ``workdir``; returns how it ended (never hangs: ``limit`` seconds)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    marker = f"fault{uuid.uuid4().hex[:12]}"
    run_dir = workdir / "run"
    _write_data(sc, workdir)
    if sc.ranks == 1 and not sc.rank_sets and sc.data_on is None:
        cmd = [sys.executable, "-m", "hpcdp.cli", "train"]
        for s in _sections(sc, marker, run_dir, workdir)[0][1]:
            cmd += ["--set", s]
    else:
        cmd = [find_mpiexec("hpcdp bench faults")]
        for i, (n, sets, wdir) in enumerate(_sections(sc, marker, run_dir, workdir)):
            cmd += ([":"] if i else []) + ["-n", str(n)] + (["-wdir", str(wdir)] if wdir else [])
            cmd += [sys.executable, "-m", "hpcdp.cli", "train"] + [a for s in sets for a in ("--set", s)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HPCDP_FAULT": sc.fault, **THREAD_ENV}
    env.pop("HPCDP_TRACEBACK", None)
    lines: list = []  # (monotonic time, text)
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)

    def read():
        for line in proc.stdout:
            lines.append((time.monotonic(), line))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    t_fault, timed_out = None, False
    start = time.monotonic()
    try:
        if sc.signal is not None:
            target, name = sc.signal
            metrics = run_dir / "metrics.jsonl"
            while proc.poll() is None and time.monotonic() - start < limit:
                if metrics.exists() and metrics.stat().st_size > 0:  # step 1 logged: training runs
                    break
                time.sleep(0.05)
            if proc.poll() is None:
                pid = proc.pid if target == "launcher" else rank_pid(marker, target)
                if pid is not None:
                    time.sleep(0.3)  # well inside training
                    t_fault = time.monotonic()
                    os.kill(pid, getattr(signal, name))
        proc.wait(timeout=max(limit - (time.monotonic() - start), 1.0))
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)  # this job's own session
        proc.wait()
    t_exit = time.monotonic()
    reader.join(timeout=10)
    if t_fault is None:
        hooked = [t for t, text in lines if "injected fault" in text]
        t_fault = hooked[0] if hooked else None
    # processes left behind: give the launcher's cleanup a moment, then look
    deadline = time.monotonic() + 10
    left = marked_pids(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = marked_pids(marker)
    for pid in left:  # never leave them running, whatever the verdict
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return Result(proc.returncode, "".join(t for _, t in lines), t_fault, t_exit, left, run_dir, timed_out,
                  start)


def check(sc: Scenario, res: Result) -> list[str]:
    """What is wrong with how ``sc`` ended (empty: as the failure policy promises)."""
    bad = []
    if res.timed_out:
        bad.append("the job did not end before the limit (hang)")
    if sc.status == "nonzero":
        if not res.status:
            bad.append(f"exit status {res.status}, expected non-zero")
    elif res.status != sc.status:
        bad.append(f"exit status {res.status}, expected {sc.status}")
    for p in sc.patterns:
        if not re.search(p, res.out):
            bad.append(f"output does not match {p!r}")
    errors = [ln for ln in res.out.splitlines() if ln.startswith("hpcdp: error:")]
    if sc.one_line and len(errors) != 1:
        bad.append(f"{len(errors)} 'hpcdp: error:' lines, expected exactly one")
    if sc.tracebacks is not None and res.out.count("Traceback (most recent call last)") != sc.tracebacks:
        bad.append(f"{res.out.count('Traceback (most recent call last)')} tracebacks, expected {sc.tracebacks}")
    if res.leftovers:
        bad.append(f"processes left behind: {res.leftovers}")
    took = res.exit_after_fault
    if sc.status != 0 and (sc.fault or sc.signal) and took is not None and took > sc.bound:
        bad.append(f"took {took:.1f}s from the fault to the full exit (bound {sc.bound:g}s)")
    return bad


# -- the table ------------------------------------------------------------------------

def message_of(res: Result) -> str:
    errors = [ln for ln in res.out.splitlines() if ln.startswith("hpcdp: error:")]
    if errors:
        return errors[0]
    term = [ln.strip(" =") for ln in res.out.splitlines() if "EXIT CODE" in ln or "BAD TERMINATION" in ln]
    return "; ".join(term[:2]) or "(none)"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hpcdp bench faults",
                                description="Fault-injection table: time from the fault to the full exit.")
    p.add_argument("--only", action="append", default=[], help="scenario name (repeatable)")
    p.add_argument("--dir", default="", help="scratch directory (default: a temporary one)")
    p.add_argument("--out", default="faults.json")
    args = p.parse_args(argv)
    import tempfile

    chosen = [s for s in scenarios() if not args.only or s.name in args.only]
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="hpcdp-faults-"))
    rows = []
    print("| fault | strategy | ranks | comm.timeout | exit status | time to full exit | message | ok |")
    print("|---|---|---|---|---|---|---|---|")
    for sc in chosen:
        res = launch(sc, root / sc.name)
        bad = check(sc, res)
        took = res.exit_after_fault
        whole = res.t_exit - res.t_start
        row = {"name": sc.name, "fault": sc.what, "strategy": sc.strategy, "ranks": sc.ranks,
               "timeout_s": sc.timeout, "status": res.status,
               "exit_after_fault_s": None if took is None else round(took, 2), "job_s": round(whole, 2),
               "message": message_of(res), "problems": bad}
        rows.append(row)
        shown = f"{took:.2f} s" if took is not None else f"{whole:.1f} s (whole job)"
        msg = row["message"].replace("|", "\\|")
        print(f"| {sc.what} | {sc.strategy} | {sc.ranks} | {sc.timeout:g} s | {res.status} | {shown} | "
              f"`{msg[:160]}` | {'yes' if not bad else 'NO: ' + '; '.join(bad)} |", flush=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if all(not r["problems"] for r in rows) else 1


__all__ = ["Scenario", "scenarios", "launch", "check", "Result", "main"]
