"""Kill-to-first-committed-step times of failure.on_rank_loss = "continue" (not a test):
runs KILLS jobs of RANKS ranks under `mpirun --with-ft ulfm` (the venv of
tests/ulfm/setup_venv_ulfm.sh), each a DDP job on jobs/gpt_small.toml; once the job has
logged step AT, the last rank is sent SIGKILL from outside (at a random moment of a
step), and the time from the kill to the first step after the repair appearing in
metrics.jsonl is taken, with the repair's own detection and repair figures.

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


def one(tmp: Path, ranks: int, at: int, i: int) -> dict:
    out = tmp / f"run{i}"
    marker = f"HPCDP_MEASURE={os.getpid()}-{i}"
    argv = [str(VENV / "bin" / "mpirun"), "--with-ft", "ulfm", "--oversubscribe", "-n", str(ranks),
            str(VENV / "bin" / "python"), "-m", "hpcdp.cli", "train", "--config", str(ROOT / "jobs" / "gpt_small.toml"),
            "--set", "parallel.strategy=ddp", "--set", 'failure.on_rank_loss="continue"',
            "--set", "run.log_every=1", "--set", "run.eval_every=0", "--set", f"train.steps={at + 40}",
            "--set", f'run.out_dir="{out}"']
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           marker.split("=")[0]: marker.split("=")[1]}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = out / "metrics.jsonl"
    while proc.poll() is None and not any(r.get("step") == at and "loss" in r for r in records(metrics)):
        time.sleep(0.01)
    time.sleep(random.uniform(0.0, 0.2))  # a random moment of a later step
    pid = rank_pid(marker, ranks - 1)
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
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
    if repair is None or proc.returncode != 0:
        raise SystemExit(f"run {i}: no repair / status {proc.returncode}\n{text[-3000:]}")
    return {"kill_to_step_s": t_step - t_kill, "detect_s": repair["detect_s"], "repair_s": repair["repair_s"],
            "step": repair["step"], "finalize_stuck": "MPI_Finalize did not return" in text}


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


def fault_free_rate(tmp: Path, ranks: int, seconds: float) -> float:
    out = tmp / f"free{ranks}"
    proc = _launch(out, ranks, f"HPCDP_MEASURE={os.getpid()}-f{ranks}", ft=True)
    _warm(proc, out / "metrics.jsonl")
    t0, s0 = time.monotonic(), _steps(out / "metrics.jsonl")
    time.sleep(seconds)
    rate = (_steps(out / "metrics.jsonl") - s0) / (time.monotonic() - t0)
    proc.terminate()  # mpirun passes SIGTERM on: the ranks stop after their step
    proc.communicate(timeout=120)
    return rate


def chaos(tmp: Path, ranks: int, min_world: int, every: float) -> None:
    out = tmp / "chaos"
    marker = f"HPCDP_MEASURE={os.getpid()}-chaos"
    proc = _launch(out, ranks, marker, ft=True)
    metrics = out / "metrics.jsonl"
    _warm(proc, metrics)
    stretches, world = [], ranks
    t, s = time.monotonic(), _steps(metrics)
    while True:
        time.sleep(every)
        t1, s1 = time.monotonic(), _steps(metrics)
        stretches.append((world, t1 - t, s1 - s))
        if world == min_world or proc.poll() is not None:
            break
        os.kill(rank_pid(marker, world - 1), signal.SIGKILL)
        world -= 1
        t, s = t1, s1
    proc.terminate()
    text = proc.communicate(timeout=120)[0]
    repairs = [r["repair"] for r in records(metrics) if "repair" in r]
    rates = {w: fault_free_rate(tmp, w, every) for w in sorted({w for w, _, _ in stretches})}
    done = sum(n for _, _, n in stretches)
    would = sum(d * rates[w] for w, d, _ in stretches)
    for w, d, n in stretches:
        print(f"world {w}: {n} steps in {d:.1f}s = {n / d:.2f} steps/s; fault-free {rates[w]:.2f} steps/s "
              f"({100 * n / d / rates[w]:.1f}%)")
    print(f"repairs: {len(repairs)} ({[r['lost_ranks'] for r in repairs]}); kill to step not timed here")
    print(f"chaos: {done} steps, fault-free at the same world sizes: {would:.1f}; kept {100 * done / would:.1f}%")
    if len(repairs) != ranks - min_world:
        print(text[-3000:])


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

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]

    print(f"runs whose MPI_Finalize did not return after the repair (ended with status 0): "
          f"{sum(r['finalize_stuck'] for r in rows)} of {len(rows)}")
    for key in ("kill_to_step_s", "detect_s", "repair_s"):
        xs = [r[key] for r in rows]
        print(f"{key}: p50 {statistics.median(xs):.3f}s  p95 {pct(xs, 0.95):.3f}s  max {max(xs):.3f}s  (n={len(xs)})")


if __name__ == "__main__":
    main()
