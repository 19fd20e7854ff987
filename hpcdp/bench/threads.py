"""``hpcdp bench threads``: what one thread per rank saves when ranks share a node.

Under a launcher that puts several ranks on a node, ``hpcdp`` sets
``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` and
``NUMBA_NUM_THREADS`` to 1 when the user set none (hpcdp.cli, as torchrun does).
This benchmark runs the same ``mpiexec -n N hpcdp train`` job both ways, interleaved:

- ``one per rank``: the thread variables unset, so hpcdp's default applies;
- ``node-wide``: each variable set to the node's core count, what every library does
  by itself (OpenBLAS, numba and OpenMP size their pools to the machine), so N ranks
  run N pools as wide as the node.

It reports each job's median step time (metrics.jsonl, after ``--warmup`` steps),
the median over ``--repeats`` per contender and the ratio node-wide / one per rank
(with the spread of the per-repeat ratios), the load before and after, and the CPU.

    hpcdp bench threads [--config jobs/gpt_ddp.toml] [--ranks 2] [--steps 30] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from hpcdp.launch import CLEARED_ENV, THREAD_VARS, hpcdp_command, loadavg, mpiexec_command, package_root

CONTENDERS = ("one per rank", "node-wide")


def contender_env(name: str, cores: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS and k not in CLEARED_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root(), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if name == "node-wide":
        env.update({var: str(cores) for var in THREAD_VARS})
    return env


def median_step(metrics: Path, warmup: int) -> float:
    steps = [json.loads(x) for x in metrics.read_text().splitlines()]
    times = [r["step_time_s"] for r in steps if "step" in r][warmup:]
    if not times:
        raise RuntimeError(f"{metrics}: no steps after --warmup {warmup}")
    return statistics.median(times)


def run_job(args, name: str, folder: Path, cores: int) -> dict:
    out = folder / f"{name.replace(' ', '-')}-{time.monotonic_ns()}"
    cmd = mpiexec_command(args.ranks, "hpcdp bench threads") + hpcdp_command() + ["train"]
    if args.config:
        cmd += ["--config", args.config]
    for s in [f"train.steps={args.steps}", f'run.out_dir="{out}"', f"run.log_every={args.steps}",
              "run.eval_every=0", *args.set]:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, env=contender_env(name, cores), capture_output=True, text=True,
                          timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stdout[-1500:]}"
                           f"{proc.stderr[-1500:]}")
    noted = any(line.startswith("hpcdp:") and "ranks share this node" in line for line in proc.stdout.splitlines())
    step = median_step(out / "metrics.jsonl", args.warmup)
    shutil.rmtree(out, ignore_errors=True)
    return {"contender": name, "step_s": step, "noted": noted}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hpcdp bench threads", description=__doc__.split("\n")[0])
    p.add_argument("--config", default="jobs/gpt_ddp.toml", help="the job (default jobs/gpt_ddp.toml)")
    p.add_argument("--ranks", type=int, default=2, help="ranks on this node (default 2)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of each median (compilation)")
    p.add_argument("--repeats", type=int, default=3, help="jobs per contender, interleaved")
    p.add_argument("--cores", type=int, default=0, help="node-wide pool size (default: os.cpu_count())")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--json", default=None, help="write the rows and the summary here")
    args = p.parse_args(argv)
    cores = args.cores or os.cpu_count() or 1
    load_before = loadavg()
    rows = []
    folder = Path(tempfile.mkdtemp(prefix="hpcdp-bench-threads-"))
    try:
        for rep in range(args.repeats):
            for name in (CONTENDERS if rep % 2 == 0 else CONTENDERS[::-1]):
                row = run_job(args, name, folder, cores)
                row["repeat"] = rep
                rows.append(row)
                print(f"  repeat {rep + 1} {name:<13} {1e3 * row['step_s']:9.2f} ms/step", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    med = {c: statistics.median(r["step_s"] for r in rows if r["contender"] == c) for c in CONTENDERS}
    ratios = [next(r["step_s"] for r in rows if r["repeat"] == k and r["contender"] == "node-wide")
              / next(r["step_s"] for r in rows if r["repeat"] == k and r["contender"] == "one per rank")
              for k in range(args.repeats)]
    summary = {"config": args.config, "ranks": args.ranks, "cores": cores, "steps": args.steps,
               "repeats": args.repeats, "median_step_s": med, "ratio_node_wide_over_one": statistics.median(ratios),
               "ratio_min": min(ratios), "ratio_max": max(ratios), "load_before": load_before,
               "load_after": loadavg(), "cpu": cpu_model(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "default_noted": all(r["noted"] for r in rows if r["contender"] == "one per rank")}
    print(f"{args.config} on {args.ranks} ranks sharing {cores} cores ({summary['cpu']}), {args.steps} steps, "
          f"median of {args.repeats} interleaved jobs each:")
    for c in CONTENDERS:
        print(f"  {c:<13} {1e3 * med[c]:9.2f} ms/step")
    print(f"  node-wide / one per rank: {summary['ratio_node_wide_over_one']:.2f}x "
          f"(per repeat {summary['ratio_min']:.2f}-{summary['ratio_max']:.2f}); load {load_before} -> "
          f"{summary['load_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=2) + "\n")
    return 0


__all__ = ["main", "contender_env", "median_step"]
