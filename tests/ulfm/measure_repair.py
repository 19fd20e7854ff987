"""Kill-to-first-committed-step times of failure.on_rank_loss = "continue" (not a test):
runs KILLS jobs of RANKS ranks under `mpirun --with-ft ulfm` (the venv of
tests/ulfm/setup_venv_ulfm.sh), each a DDP job on jobs/gpt_small.toml; once the job has
logged step AT, the last rank is sent SIGKILL from outside (at a random moment of a
step), and the time from the kill to the first step after the repair appearing in
metrics.jsonl is taken, with the repair's own detection and repair figures.

    python tests/ulfm/measure_repair.py [KILLS] [RANKS]     # defaults: 10 kills, 3 ranks
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


def main() -> None:
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
