"""Kill-to-first-committed-step times of failure.on_rank_loss = "continue" (not a test):
runs KILLS jobs of RANKS ranks under `mpirun --with-ft ulfm` (the venv of
tests/ulfm/setup_venv_ulfm.sh), each a DDP job on jobs/gpt_small.toml; once the job has
logged step AT, the last rank is sent SIGKILL from outside (at a random moment of a
step), and the time from the kill to the first step after the repair appearing in
metrics.jsonl is taken, with the repair's own detection and repair figures, the kill to
the error (the repair record's time, on this machine's clock, less the repair's own
time) and the committed steps lost (steps logged before the repair, later than the
step the survivors agreed on). tests/cluster/measure_cluster_repair.py runs the same
kills and chaos run on the emulated cluster (its launcher: the ``Local`` class's methods).

    python tests/ulfm/measure_repair.py [KILLS] [RANKS]     # defaults: 10 kills, 3 ranks
    python tests/ulfm/measure_repair.py --classic [KILLS] [RANKS] [EVERY]
    python tests/ulfm/measure_repair.py --chaos [RANKS] [MIN_WORLD] [EVERY_S]

``--classic``: the same failure handled the classic way (failure.on_rank_loss = "stop",
a checkpoint every EVERY steps, default 20): the job ends with hpcdp's line, and the
script relaunches it at once with ``--resume latest`` on as many ranks; the lost time
is from the kill until the relaunched job has logged the step that was in flight at
the kill (its end + the relaunch to the first step + the steps since the checkpoint,
done again). A cluster adds its own requeue or allocation time on top.

``--chaos``: one continue-mode job of RANKS ranks (default 4); every EVERY_S seconds
(default 10) the highest live rank is killed until MIN_WORLD ranks are left (default 2),
then it runs EVERY_S more. Each stretch between kills is compared with the fault-free
step rate at its world size (a job of that many ranks, timed over a stretch as long):
kept = steps done / the steps fault-free jobs would have done in the same stretches.
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("HPCDP_ULFM_VENV", str(ROOT / ".venv-ulfm")))


def rank_pid(marker: str, rank: int) -> int | None:
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker.encode() in env and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env \
                and b"hpcdp.cli" in (d / "cmdline").read_bytes():
            return int(d.name)
    return None


def records(path: Path) -> list:
    try:
        return [json.loads(ln) for ln in path.read_text().splitlines() if ln.endswith("}")]
    except (OSError, ValueError):
        return []


class Local:
    """Jobs on this machine: ``mpirun --oversubscribe -n RANKS`` of the ULFM venv. The
    emulated cluster's launcher (tests/cluster/measure_cluster_repair.py) has the same
    methods."""

    where = "one machine"

    def start(self, out: Path, ranks: int, marker: str, ft: bool, steps: int = 100000):
        return _launch(out, ranks, marker, ft, steps)

    def pid(self, marker: str, rank: int) -> int | None:
        return rank_pid(marker, rank)

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)

    def end(self, proc) -> str:
        """Stop a job whose figures were taken (its ending does not matter); its output."""
        proc.terminate()  # mpirun passes SIGTERM on: the ranks stop after their step
        return proc.communicate(timeout=120)[0]


def lost_steps(recs: list) -> int:
    """Committed steps lost by the first repair: steps logged (so committed and applied on
    every rank) before the repair record, later than the step the survivors agreed on."""
    first = next(i for i, r in enumerate(recs) if "repair" in r)
    committed = recs[first]["repair"]["committed_step"]
    return sum(1 for r in recs[:first] if "loss" in r and r["step"] > committed)


def one(tmp: Path, ranks: int, at: int, i: int, launcher=None, victim: int | None = None) -> dict:
    """One job of RANKS ranks; SIGKILL of rank ``victim`` (default: the last) at a random
    moment of a step after step AT; the figures of its repair."""
    launcher = launcher or Local()
    victim = ranks - 1 if victim is None else victim
    out = tmp / f"run{i}"
    marker = f"HPCDP_MEASURE={os.getpid()}-{i}"
    proc = launcher.start(out, ranks, marker, ft=True, steps=at + 40)
    metrics = out / "metrics.jsonl"
    while proc.poll() is None and not any(r.get("step") == at and "loss" in r for r in records(metrics)):
        time.sleep(0.01)
    pid = launcher.pid(marker, victim)  # found before: a scan of /proc takes a while
    if pid is None:
        text = proc.communicate(timeout=300)[0] if proc.poll() is not None else ""
        raise SystemExit(f"run {i}: rank {victim} not found (status {proc.poll()})\n{text[-3000:]}")
    time.sleep(random.uniform(0.0, 0.2))  # a random moment of a later step
    t_kill, wall_kill = time.monotonic(), time.time()
    launcher.kill(pid)
    repair = None
    while proc.poll() is None:
        recs = records(metrics)
        rep = [r["repair"] for r in recs if "repair" in r]
        if rep and any(r.get("step") == rep[0]["redo_step"] and "loss" in r for r in recs):
            repair = rep[0]
            break
        time.sleep(0.005)
    t_step = time.monotonic()
    text = proc.communicate(timeout=300)[0]
    recs = records(metrics)
    if repair is None or proc.returncode != 0:
        raise SystemExit(f"run {i}: no repair / status {proc.returncode}\n{text[-3000:]}")
    steps = [r["step"] for r in recs if "loss" in r]
    # the record's time ("at", after the repair) on the same clock as the kill: one machine
    to_record = repair["at"] - wall_kill
    redo = [r for r in recs if r.get("step") == repair["redo_step"] and "loss" in r]
    return {"kill_to_step_s": t_step - t_kill, "kill_to_error_s": to_record - repair["repair_s"],
            "kill_to_record_s": to_record, "redo_step_time_s": redo[-1]["step_time_s"] if redo else None,
            "detect_s": repair["detect_s"], "repair_s": repair["repair_s"], "step": repair["step"],
            "victim": victim, "lost_ranks": repair["lost_ranks"], "lost_steps": lost_steps(recs),
            # hybrid ZeRO: the lost node's other ranks leave with one line each
            "left_ranks": repair.get("left_ranks", []), "leave_lines": [ln for ln in text.splitlines()
                                                                         if " leaves at step" in ln],
            # a step logged twice was committed twice; one not logged at all can only be the
            # failed step, when its update was applied but its record not yet written
            "logged_twice": len(steps) - len(set(steps)), "not_logged": sorted(set(range(1, at + 41)) - set(steps)),
            "finalize_stuck": "MPI_Finalize did not return" in text}


def classic(tmp: Path, ranks: int, at: int, every: int, i: int) -> dict:
    out, ck = tmp / f"classic{i}", tmp / f"ck{i}"
    marker = f"HPCDP_MEASURE={os.getpid()}-c{i}"
    base = [str(VENV / "bin" / "mpirun"), "--oversubscribe", "-n", str(ranks), str(VENV / "bin" / "python"),
            "-m", "hpcdp.cli", "train", "--config", str(ROOT / "jobs" / "gpt_small.toml"),
            "--set", "parallel.strategy=ddp", "--set", "run.log_every=1", "--set", "run.eval_every=0",
            "--set", f"train.steps={at + 2 * every + 20}", "--set", f'checkpoint.dir="{ck}"',
            "--set", f"checkpoint.every={every}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           marker.split("=")[0]: marker.split("=")[1]}
    first = out / "first"
    proc = subprocess.Popen(base + ["--set", f'run.out_dir="{first}"'], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    kill_after = at + random.randrange(every)  # a random step of a checkpoint interval
    _warm(proc, first / "metrics.jsonl", 1)
    pid = rank_pid(marker, ranks - 1)  # found before: a scan of /proc takes a while
    while proc.poll() is None and _steps(first / "metrics.jsonl") < kill_after:
        time.sleep(0.002)
    time.sleep(random.uniform(0.0, 0.05))
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=300)
    t_end = time.monotonic()
    done = max(r["step"] for r in records(first / "metrics.jsonl") if "loss" in r)
    again = out / "again"
    t_launch = time.monotonic()
    proc = subprocess.Popen(base + ["--set", f'run.out_dir="{again}"', "--resume", "latest"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    resumed_at = None
    while proc.poll() is None:
        recs = records(again / "metrics.jsonl")
        steps = [r["step"] for r in recs if "loss" in r]
        if steps and resumed_at is None:
            resumed_at = min(steps) - 1
        if any(s >= done + 1 for s in steps):
            break
        time.sleep(0.005)
    t_back = time.monotonic()
    text = proc.communicate(timeout=300)[0]
    if proc.returncode != 0:
        raise SystemExit(f"classic run {i}: status {proc.returncode}\n{text[-3000:]}")
    return {"lost_s": t_back - t_kill, "end_s": t_end - t_kill, "relaunch_to_back_s": t_back - t_launch,
            "steps_redone": done + 1 - (resumed_at or 0), "in_flight_step": done + 1}


def _steps(metrics: Path) -> int:
    return max([r["step"] for r in records(metrics) if "loss" in r] or [0])


def _launch(out: Path, ranks: int, marker: str, ft: bool, steps: int = 100000):
    argv = [str(VENV / "bin" / "mpirun"), *(["--with-ft", "ulfm"] if ft else []), "--oversubscribe", "-n",
            str(ranks), str(VENV / "bin" / "python"), "-m", "hpcdp.cli", "train",
            "--config", str(ROOT / "jobs" / "gpt_small.toml"), "--set", "parallel.strategy=ddp",
            "--set", "run.log_every=1", "--set", "run.eval_every=0", "--set", f"train.steps={steps}",
            "--set", 'failure.on_rank_loss="continue"', "--set", f'run.out_dir="{out}"']
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           marker.split("=")[0]: marker.split("=")[1]}
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _warm(proc, metrics: Path, at: int = 5) -> None:
    while proc.poll() is None and _steps(metrics) < at:  # past the first steps (compilation)
        time.sleep(0.01)


def fault_free_rate(tmp: Path, ranks: int, seconds: float, launcher=None, tag: str = "") -> float:
    launcher = launcher or Local()
    out = tmp / f"free{ranks}{tag}"
    proc = launcher.start(out, ranks, f"HPCDP_MEASURE={os.getpid()}-f{ranks}{tag}", ft=True)
    _warm(proc, out / "metrics.jsonl")
    t0, s0 = time.monotonic(), _steps(out / "metrics.jsonl")
    time.sleep(seconds)
    rate = (_steps(out / "metrics.jsonl") - s0) / (time.monotonic() - t0)
    launcher.end(proc)
    return rate


def chaos(tmp: Path, ranks: int, min_world: int, every: float, launcher=None, pick=None,
          both_sides: bool = False) -> dict:
    """``pick(live)``: the launch rank to kill among the live ones (default: the highest);
    ``both_sides``: time the fault-free rates before the chaos job as well as after it
    and compare with their mean (a machine whose load drifts)."""
    launcher = launcher or Local()
    pick = pick or max
    worlds = list(range(ranks, min_world - 1, -1))
    before = {w: fault_free_rate(tmp, w, every, launcher, "a") for w in worlds} if both_sides else {}
    out = tmp / "chaos"
    marker = f"HPCDP_MEASURE={os.getpid()}-chaos"
    proc = launcher.start(out, ranks, marker, ft=True)
    metrics = out / "metrics.jsonl"
    _warm(proc, metrics)
    stretches, live, killed = [], list(range(ranks)), []
    t, s = time.monotonic(), _steps(metrics)
    while True:
        time.sleep(every)
        t1, s1 = time.monotonic(), _steps(metrics)
        stretches.append((len(live), t1 - t, s1 - s))
        if len(live) == min_world or proc.poll() is not None:
            break
        victim = pick([r for r in live if r != 0])  # rank 0 writes the metrics: its loss ends the job
        launcher.kill(launcher.pid(marker, victim))
        live.remove(victim)
        killed.append(victim)
        t, s = t1, s1
    alive = proc.poll() is None
    text = launcher.end(proc)
    repairs = [r["repair"] for r in records(metrics) if "repair" in r]
    after = {w: fault_free_rate(tmp, w, every, launcher, "b") for w in worlds}
    rates = {w: (before[w] + after[w]) / 2 if both_sides else after[w] for w in worlds}
    done = sum(n for _, _, n in stretches)
    would = sum(d * rates[w] for w, d, _ in stretches)
    for w, d, n in stretches:
        sides = f" (before {before[w]:.2f}, after {after[w]:.2f})" if both_sides else ""
        print(f"world {w}: {n} steps in {d:.1f}s = {n / d:.2f} steps/s; fault-free {rates[w]:.2f} steps/s{sides} "
              f"({100 * n / d / rates[w]:.1f}%)")
    print(f"killed (launch ranks, in order): {killed}; repairs: {len(repairs)} "
          f"({[r['lost_ranks'] for r in repairs]}); the job was {'still running' if alive else 'over'} at the end")
    print(f"chaos: {done} steps, fault-free at the same world sizes: {would:.1f}; kept {100 * done / would:.1f}%")
    if len(repairs) != ranks - min_world or not alive:
        print(text[-3000:])
    return {"kept": done / would, "repairs": len(repairs), "stretches": stretches, "rates": rates}


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summary(rows: list) -> None:
    """The kills' p50 / p95 / max, each figure apart."""
    print(f"runs whose MPI_Finalize did not return after the repair (ended with status 0): "
          f"{sum(r['finalize_stuck'] for r in rows)} of {len(rows)}")
    print(f"committed steps lost: {[r['lost_steps'] for r in rows]} (total {sum(r['lost_steps'] for r in rows)}); "
          f"steps logged twice: {sum(r['logged_twice'] for r in rows)}; steps not logged: "
          f"{[r['not_logged'] for r in rows if r['not_logged']]} (only a failed step whose update was applied)")
    for key in ("kill_to_step_s", "kill_to_error_s", "detect_s", "repair_s"):
        xs = [r[key] for r in rows]
        print(f"{key}: p50 {statistics.median(xs):.3f}s  p95 {pct(xs, 0.95):.3f}s  max {max(xs):.3f}s  (n={len(xs)})")


def main() -> None:
    if sys.argv[1:2] == ["--chaos"]:
        ranks = int(sys.argv[2]) if len(sys.argv) > 2 else 4
        min_world = int(sys.argv[3]) if len(sys.argv) > 3 else 2
        every = float(sys.argv[4]) if len(sys.argv) > 4 else 10.0
        with tempfile.TemporaryDirectory() as tmp:
            chaos(Path(tmp), ranks, min_world, every)
        return
    if sys.argv[1:2] == ["--classic"]:
        kills = int(sys.argv[2]) if len(sys.argv) > 2 else 5
        ranks = int(sys.argv[3]) if len(sys.argv) > 3 else 3
        every = int(sys.argv[4]) if len(sys.argv) > 4 else 20
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(kills):
                rows.append(classic(Path(tmp), ranks, every + 1, every, i))
                print(json.dumps(rows[-1]), flush=True)
        for key in ("lost_s", "end_s", "relaunch_to_back_s", "steps_redone"):
            xs = [r[key] for r in rows]
            print(f"{key}: p50 {statistics.median(xs):.3f}  mean {statistics.mean(xs):.3f}  max {max(xs):.3f}  (n={len(xs)})")
        return
    kills = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    ranks = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(kills):
            rows.append(one(Path(tmp), ranks, 5, i))
            print(json.dumps(rows[-1]), flush=True)
    summary(rows)

if __name__ == "__main__":
    main()
