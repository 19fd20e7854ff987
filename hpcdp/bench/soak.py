"""Soak: does a long run's resident memory stay flat? (``hpcdp bench soak``)

Launches ``mpiexec -n RANKS hpcdp train --config CONFIG --set train.steps=STEPS`` and
samples every rank's resident set size (``VmRSS`` in ``/proc/<pid>/status``) twice
a second, with the number of steps done (lines in metrics.jsonl). The baseline is
the first sample after ``--warmup`` of the steps (compilation and first touches are
over); the growth of each rank is its last sample minus its baseline, and the slope
a least-squares fit of RSS against steps over all samples from the baseline on
(steady growth stands out from the allocator's ups and downs). Per-step
records that are never trimmed show up as growth proportional to the steps (the
asynchronous parameter server's used to add 22 MB over 60k steps).

    hpcdp bench soak --config jobs/digits_ps_async.toml --steps 3000 [--ranks 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from hpcdp.bench.faults import marked_pids
from hpcdp.launch import find_mpiexec


def _rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _rank_of(pid: int) -> int | None:
    try:
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(b"PMI_RANK="):
                return int(item[9:])
    except OSError:
        return None
    return None


def soak(config: str, steps: int, ranks: int, sets=(), warmup: float = 0.1, period: float = 0.5,
         tree: str = "") -> dict:
    """One soak run; ``tree``: run the hpcdp found there (PYTHONPATH) instead of this one,
    e.g. another checkout, for a before/after comparison."""
    marker = f"soak{uuid.uuid4().hex[:10]}"
    with tempfile.TemporaryDirectory(prefix="hpcdp-soak-") as tmp:
        run = Path(tmp) / "run"
        cmd = [find_mpiexec("hpcdp bench soak"), "-n", str(ranks), sys.executable, "-m", "hpcdp.cli", "train",
               "--config", str(Path(config).resolve()),
               "--set", f"train.steps={steps}", "--set", f'run.out_dir="{run}"', "--set", f"run.name={marker}",
               "--set", "run.eval_every=0", "--set", "run.log_every=100"]
        for s in sets:
            cmd += ["--set", s]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
        if tree:
            env["PYTHONPATH"] = str(Path(tree).resolve())
        # cwd: the temporary directory, since `python -m` puts the cwd first on sys.path
        # (from a checkout it would shadow --tree)
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
        samples = []  # (seconds, steps done, {rank: rss kB})
        t0 = time.monotonic()
        while proc.poll() is None:
            done = 0
            if (run / "metrics.jsonl").exists():
                done = sum(1 for _ in open(run / "metrics.jsonl"))
            rss = {}
            for pid in marked_pids(marker):
                r = _rank_of(pid)
                kb = _rss_kb(pid) if r is not None else None
                if kb is not None:  # the rank's process, not its watcher (hpcdp.failure.watch): the larger
                    rss[r] = max(rss.get(r, 0), kb)
            if len(rss) == ranks:
                samples.append((time.monotonic() - t0, done, rss))
            time.sleep(period)
        err = proc.stderr.read()
    if proc.returncode != 0:
        raise RuntimeError(f"soak run failed ({proc.returncode}): {err[-2000:]}")
    base = next((s for s in samples if s[1] >= warmup * steps), None)
    last = samples[-1] if samples else None
    if base is None or last is None or base is last:
        raise RuntimeError("soak: too few samples (raise --steps)")
    growth = {r: (last[2][r] - base[2][r]) / 1024 for r in range(ranks)}
    # least-squares slope of RSS over steps after the warmup: steady growth per 1000 steps
    import numpy as np
    after = [x for x in samples if x[1] >= base[1]]
    steps_done = np.array([x[1] for x in after], dtype=float)
    slope = {}
    for r in range(ranks):
        rss = np.array([x[2][r] / 1024 for x in after])
        slope[r] = float(np.polyfit(steps_done, rss, 1)[0] * 1000) if np.ptp(steps_done) > 0 else 0.0
    return {"config": config, "steps": steps, "ranks": ranks, "sets": list(sets), "tree": tree,
            "baseline_step": base[1], "last_step": last[1], "seconds": round(last[0], 1),
            "baseline_mib": {r: round(base[2][r] / 1024, 1) for r in range(ranks)},
            "last_mib": {r: round(last[2][r] / 1024, 1) for r in range(ranks)},
            "growth_mib": {r: round(g, 2) for r, g in growth.items()},
            "max_growth_mib": round(max(growth.values()), 2),
            "slope_mib_per_1000_steps": {r: round(v, 3) for r, v in slope.items()},
            "samples": len(after)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hpcdp bench soak", description="Resident memory over a long run.")
    p.add_argument("--config", required=True)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--tree", default="", help="run the hpcdp of this checkout (before/after comparisons)")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    res = soak(args.config, args.steps, args.ranks, args.set, tree=args.tree)
    print(json.dumps(res, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return 0


__all__ = ["soak", "main"]
