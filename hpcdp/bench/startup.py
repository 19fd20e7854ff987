"""Start-up time of a training job, as a user sees it: launch to first step, and to exit.

    hpcdp bench startup [--ranks 1,2,4] [--repeats 5] [--set KEY=VALUE ...] [--json FILE]
                        [--baseline OTHER_CHECKOUT]

Each rank count runs ``mpiexec -n N hpcdp train --set parallel.strategy=ddp --set
train.steps=1`` (the built-in digits job; ``--config``/``--set`` change it) once
untimed, which also fills numba's on-disk cache, then ``--repeats`` times timed. The
clock starts just before the launcher is spawned. "First step" is when rank 0's
``step 1/...`` line (written after step 1 finished on every rank) reaches this
process through the launcher's stdout; "exit" is when the launcher exits (after the
final evaluation and MPI_Finalize). Medians, min and max over the repeats are
printed and written as JSON, with the load average before and after: on a shared
machine other work slows the start, never speeds it. ``--baseline`` times another
checkout (e.g. ``git worktree add /tmp/base main``) in the same run, launches
alternating, and prints the ratio.

Like ``hpcdp bench step`` it unsets OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE for the
launched jobs (they make OpenBLAS pick a kernel for another CPU) and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

from hpcdp.launch import CLEARED_ENV, find_mpiexec, mpiexec_command, parse_ranks

DEFAULT_SETS = ("parallel.strategy=ddp", "train.steps=1")
FIRST_STEP_PREFIX = "step 1/"


def _hpcdp() -> list[str]:
    script = Path(sys.executable).parent / "hpcdp"
    return [str(script)] if script.exists() else [sys.executable, "-m", "hpcdp.cli"]


def launch_once(ranks: int, config: str | None, sets, timeout: float, env) -> dict:
    """One launch; seconds from spawn to rank 0's first step line and to exit."""
    with tempfile.TemporaryDirectory(prefix="hpcdp-startup-") as tmp:
        cmd = [*mpiexec_command(ranks, "hpcdp bench startup"), *_hpcdp(), "train",
               *(["--config", config] if config else []),
               *[a for s in sets for a in ("--set", s)], "--set", f'run.out_dir="{tmp}/run"']
        first = None
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                start_new_session=True)
        # A hung launch is killed with its ranks (its own process group), never waited on forever.
        kill = lambda: os.killpg(proc.pid, signal.SIGKILL)  # noqa: E731
        watchdog = threading.Timer(timeout, kill)
        watchdog.start()
        lines = []
        try:
            for line in proc.stdout:
                lines.append(line)
                if first is None and line.startswith(FIRST_STEP_PREFIX):
                    first = time.perf_counter() - t0
            rc = proc.wait()
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                kill()
                proc.wait()
        exit_s = time.perf_counter() - t0
    if rc != 0 or first is None:
        tail = "".join(lines[-15:])
        raise RuntimeError(f"{' '.join(cmd)}: exit {rc}" + (f" (killed after {timeout:g} s)" if rc == -9 else "")
                           + ("" if first is not None else ", no 'step 1/' line") + f"; last output:\n{tail}")
    return {"first_step_s": first, "exit_s": exit_s}


def _summary(values) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(ranks_list, repeats: int, warmup: int, config, sets, timeout: float, baseline=None) -> list[dict]:
    """Rows of medians per (rank count, contender). With ``baseline`` (the root of
    another hpcdp checkout, put first on the launched ranks' PYTHONPATH) the two
    contenders' launches alternate, so load that comes and goes hits both alike."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env["PYTHONUNBUFFERED"] = "1"  # rank 0's step line leaves at once
    contenders = [("this checkout", env)]
    if baseline:
        path = str(Path(baseline).resolve())
        if not (Path(path) / "hpcdp" / "cli.py").is_file():
            raise ValueError(f"--baseline {baseline!r}: not an hpcdp checkout (no hpcdp/cli.py)")
        contenders.append((f"baseline {path}", {**env, "PYTHONPATH": path + os.pathsep + env.get("PYTHONPATH", "")}))
    rows = []
    for n in ranks_list:
        runs: dict = {name: [] for name, _ in contenders}
        for _ in range(warmup):
            for _, e in contenders:
                launch_once(n, config, sets, timeout, e)
        for _ in range(repeats):
            for name, e in contenders:
                runs[name].append(launch_once(n, config, sets, timeout, e))
        for name, _ in contenders:
            row = {"ranks": n, "contender": name, "repeats": repeats,
                   "first_step_s": _summary([r["first_step_s"] for r in runs[name]]),
                   "exit_s": _summary([r["exit_s"] for r in runs[name]]), "runs": runs[name]}
            rows.append(row)
            f, x = row["first_step_s"], row["exit_s"]
            print(f"{n:>5}  {f['median']:>6.2f} s ({f['min']:.2f}-{f['max']:.2f})  "
                  f"{x['median']:>6.2f} s ({x['min']:.2f}-{x['max']:.2f})  {name}", flush=True)
        if baseline:
            a, b = rows[-2], rows[-1]
            print(f"{n:>5}  baseline / this: first step {b['first_step_s']['median'] / a['first_step_s']['median']:.2f}x, "
                  f"exit {b['exit_s']['median'] / a['exit_s']['median']:.2f}x", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hpcdp bench startup", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts (default 1,2,4)")
    p.add_argument("--repeats", type=int, default=5, help="timed launches per rank count (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="untimed launches first (default 1: fills numba's cache)")
    p.add_argument("--config", default=None, help="TOML job (default: the built-in digits job)")
    p.add_argument("--set", action="append", default=None, metavar="SECTION.KEY=VALUE",
                   help=f"config overrides (default: {' '.join(DEFAULT_SETS)})")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds one launch may take (default 300)")
    p.add_argument("--baseline", default=None, metavar="CHECKOUT",
                   help="also time another hpcdp checkout (its root first on PYTHONPATH), launches alternating")
    p.add_argument("--json", default="bench-startup.json", help="results file (default bench-startup.json)")
    args = p.parse_args(argv)
    ranks = parse_ranks(args.ranks)
    if args.repeats < 1 or args.warmup < 0:
        raise ValueError("--repeats must be >= 1 and --warmup >= 0")
    sets = tuple(args.set) if args.set is not None else DEFAULT_SETS
    cleared = [k for k in CLEARED_ENV if k in os.environ]
    load_before = os.getloadavg()
    print(f"hpcdp bench startup: {find_mpiexec('hpcdp bench startup')} -n N hpcdp train "
          f"{('--config ' + args.config + ' ') if args.config else ''}{' '.join('--set ' + s for s in sets)}; "
          f"{args.warmup} untimed + {args.repeats} timed launches per rank count; "
          f"{' and '.join(CLEARED_ENV)} unset" + (f" (were set: {', '.join(cleared)})" if cleared else " (were not set)"))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in load_before)} on {os.cpu_count()} CPUs")
    print("ranks  first step (min-max)   exit (min-max)")
    try:
        rows = measure(ranks, args.repeats, args.warmup, args.config, sets, args.timeout, args.baseline)
    except RuntimeError as e:
        print(f"hpcdp bench startup: a launch failed: {e}", file=sys.stderr)
        return 1
    load_after = os.getloadavg()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in load_after)}")
    out = {"date": datetime.now().isoformat(timespec="seconds"), "host": platform.node(),
           "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "command": ["mpiexec", "-n", "N", "hpcdp", "train", *(["--config", args.config] if args.config else []),
                       *[a for s in sets for a in ("--set", s)]],
           "load_before": load_before, "load_after": load_after, "cleared_env": list(CLEARED_ENV), "rows": rows}
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
