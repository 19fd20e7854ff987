"""``hpcdp scale``: weak- and strong-scaling study of a training config.

For every rank count K in ``--ranks`` it launches ``mpiexec -n K hpcdp train`` as a
child job (one thread per rank), reads the job's ``metrics.jsonl`` and reports, per
point: samples/s, scaling efficiency against one rank, and the gradient communication
time split into exposed (the step waited for it) and hidden (it ran while backward ran).

- weak scaling: the per-rank batch stays ``B`` (global batch ``K * B``); ideal: the same
  step time at every K, efficiency = t(1) / t(K).
- strong scaling: the global batch stays ``B`` (each rank gets ``B / K``); ideal: step time
  ``t(1) / K``, efficiency = t(1) / (K * t(K)).

Both are ``samples_per_s(K) / (K * samples_per_s(1))``. With ``--variants`` the weak
sweep is repeated for DDP's comparison modes (per-parameter allreduce, no overlap), and
the table shows the speedup of bucketed+overlapped over each.

Outputs in ``--out``: ``scale.json`` (every point, with the exact child commands),
``scale.txt`` (the table as printed) and ``scale.png`` (needs matplotlib; skipped with a
message otherwise). Step times are medians over the steps after ``--warmup``; with
``--repeats R`` the whole sweep runs R times, interleaved, and each point keeps its
fastest repeat (the one least disturbed by other processes on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

# DDP modes compared by the study (values are --set overrides of [parallel.ddp]).
VARIANTS = {
    "bucketed": {"parallel.ddp.bucketing": '"size"', "parallel.ddp.overlap": "true"},
    "per_param": {"parallel.ddp.bucketing": '"per_param"', "parallel.ddp.overlap": "true"},
    "no_overlap": {"parallel.ddp.bucketing": '"size"', "parallel.ddp.overlap": "false"},
}

THREAD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "NUMBA_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def find_mpiexec() -> str:
    """mpiexec next to this Python first (the venv's MPI matches its mpi4py), then PATH."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise SystemExit("hpcdp scale: no mpiexec found next to the Python interpreter or on "
                         "PATH; install an MPI (e.g. pip install 'hpcdp[mpi]')")
    return found


def parse_ranks(text: str) -> list[int]:
    try:
        ranks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"hpcdp scale: --ranks {text!r}: expected a comma-separated list "
                         "of rank counts, e.g. 1,2,4") from None
    if not ranks or min(ranks) < 1:
        raise SystemExit(f"hpcdp scale: --ranks {text!r}: rank counts must be >= 1")
    if 1 not in ranks:
        ranks = [1] + ranks  # efficiency is relative to one rank
    return sorted(set(ranks))


def summarize(metrics_path: Path, warmup: int) -> dict:
    """Median step time, samples/s and per-rank comm figures from a metrics.jsonl."""
    steps = []
    for line in metrics_path.read_text().splitlines():
        rec = json.loads(line)
        if "step" in rec and "step_time_s" in rec:
            steps.append(rec)
    if len(steps) <= warmup:
        raise RuntimeError(f"{metrics_path}: {len(steps)} step lines, need more than "
                           f"--warmup {warmup}")
    use = steps[warmup:]
    out = {
        "steps_measured": len(use),
        "step_time_s": statistics.median(r["step_time_s"] for r in use),
        "global_batch": use[-1].get("global_batch"),
    }
    # Per-rank strategy stats: the mean over ranks of each step's figure, median over steps.
    for key in ("comm_s", "comm_exposed_s", "comm_hidden_s", "comm_cpu_s",
                "bytes_sent", "grad_bytes_sent"):
        vals = [v for v in (_rank_mean(r, key) for r in use) if v is not None]
        out[key] = statistics.median(vals) if vals else 0.0
    return out


def _rank_mean(rec: dict, key: str):
    """A strategy figure of one metrics line, averaged over ranks.

    train.py writes the strategy's step_stats() per rank as ``{"ranks": {key: [r0, r1..]}}``
    (or flat lists under the key); one-rank runs may have no strategy figures at all."""
    for holder in (rec.get("ranks"), rec.get("strategy"), rec):
        if isinstance(holder, dict) and key in holder:
            v = holder[key]
            if isinstance(v, list):
                return sum(v) / len(v) if v else None
            if isinstance(v, (int, float)):
                return float(v)
    return None


def run_point(args, k: int, global_batch: int, variant: str, out_dir: Path) -> dict:
    """Launch one child job and summarise it."""
    run_dir = out_dir / f"{variant}-n{k}-b{global_batch}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    sets = [f"train.global_batch={global_batch}", f"train.steps={args.steps}",
            "parallel.strategy=\"ddp\"", f"run.out_dir=\"{run_dir}\"",
            f"run.log_every={max(args.steps, 1)}"]
    sets += [f"{key}={val}" for key, val in VARIANTS[variant].items()]
    sets += list(args.set or [])
    if args.launcher:
        cmd = shlex.split(args.launcher.format(n=k))
    else:
        cmd = [find_mpiexec(), "-n", str(k)]
        if args.bind and k > 1:
            cmd += ["-bind-to", "core"]
    cmd += [sys.executable, "-m", "hpcdp.cli", "train", "--config", str(args.config)]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, **THREAD_ENV, "PYTHONUNBUFFERED": "1"}
    # The children import the same hpcdp as this process, installed or not.
    pkg_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"child job failed (exit {proc.returncode}): "
                           f"{shlex.join(cmd)}\n{tail}")
    summary = summarize(run_dir / "metrics.jsonl", args.warmup)
    gb = summary.get("global_batch") or global_batch
    summary.update(ranks=k, variant=variant, global_batch=gb, wall_s=wall,
                   samples_per_s=gb / summary["step_time_s"], command=shlex.join(cmd))
    return summary


def efficiency(points: list[dict]) -> None:
    """Add ``efficiency`` = samples_per_s(K) / (K * samples_per_s(1)) in place."""
    base = next(p for p in points if p["ranks"] == 1)["samples_per_s"]
    for p in points:
        p["efficiency"] = p["samples_per_s"] / (p["ranks"] * base)


def format_table(result: dict) -> str:
    lines = []
    hdr = (f"{'study':<7} {'variant':<11} {'ranks':>5} {'batch':>6} {'step ms':>9} "
           f"{'samples/s':>10} {'eff':>6} {'comm ms':>8} {'exposed':>8} {'hidden':>8} "
           f"{'MiB/step':>9}")
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for study in ("weak", "strong"):
        for p in result.get(study, []):
            lines.append(
                f"{study:<7} {p['variant']:<11} {p['ranks']:>5} {p['global_batch']:>6} "
                f"{1e3 * p['step_time_s']:>9.2f} {p['samples_per_s']:>10.1f} "
                f"{p.get('efficiency', float('nan')):>6.1%} {1e3 * p['comm_s']:>8.2f} "
                f"{1e3 * p['comm_exposed_s']:>8.2f} {1e3 * p['comm_hidden_s']:>8.2f} "
                f"{p['grad_bytes_sent'] / 2**20:>9.3f}")
    cmp_ = result.get("variant_speedup", [])
    if cmp_:
        lines.append("")
        lines.append("speedup of bucketed+overlapped (weak scaling, same ranks):")
        for c in cmp_:
            lines.append(f"  {c['ranks']} ranks: {c['over']:<11} {c['speedup']:.3f}x "
                         f"(step {1e3 * c['other_step_s']:.2f} ms -> "
                         f"{1e3 * c['bucketed_step_s']:.2f} ms)")
    if result.get("oversubscribed"):
        lines.append(f"note: {result['oversubscribed']}")
    return "\n".join(lines)


def plot(result: dict, path: Path) -> str | None:
    """scale.png: samples/s and efficiency vs ranks, and exposed vs hidden comm time."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: skipped the PNG (pip install 'hpcdp[plot]')"
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for study, marker in (("weak", "o"), ("strong", "s")):
        pts = [p for p in result.get(study, []) if p["variant"] == "bucketed"]
        if not pts:
            continue
        ks = [p["ranks"] for p in pts]
        axes[0].plot(ks, [p["samples_per_s"] for p in pts], marker=marker, label=study)
        axes[1].plot(ks, [100 * p["efficiency"] for p in pts], marker=marker, label=study)
    base = next((p for p in result.get("weak", []) if p["ranks"] == 1), None)
    if base:
        ks = sorted({p["ranks"] for p in result["weak"]})
        axes[0].plot(ks, [k * base["samples_per_s"] for k in ks], "k--", lw=0.8, label="ideal (weak)")
    axes[0].set(xlabel="ranks", ylabel="samples/s", title="throughput")
    axes[1].axhline(100, color="k", ls="--", lw=0.8)
    axes[1].set(xlabel="ranks", ylabel="efficiency %", title="scaling efficiency")
    labels, exposed, hidden = [], [], []
    for p in result.get("weak", []):
        if p["ranks"] > 1:
            labels.append(f"{p['variant']}\nn={p['ranks']}")
            exposed.append(1e3 * p["comm_exposed_s"])
            hidden.append(1e3 * p["comm_hidden_s"])
    if labels:
        x = range(len(labels))
        axes[2].bar(x, exposed, label="exposed")
        axes[2].bar(x, hidden, bottom=exposed, label="hidden behind backward")
        axes[2].set_xticks(list(x), labels, fontsize=7)
    axes[2].set(ylabel="ms per step", title="gradient communication (weak)")
    for ax in axes:
        ax.legend(fontsize=8)
        if ax is not axes[2]:
            ax.set_xticks(sorted({p["ranks"] for s in ("weak", "strong") for p in result.get(s, [])}))
    fig.suptitle(result.get("title", "hpcdp scale"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def build_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="hpcdp scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True, help="training config (TOML) to scale")
    p.add_argument("--ranks", default="1,2,4", help="rank counts, e.g. 1,2,4 (default)")
    p.add_argument("--batch", type=int, default=0,
                   help="per-rank batch (weak) and global batch (strong); default: the "
                        "config's train.global_batch")
    p.add_argument("--steps", type=int, default=20, help="steps per child job")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds over all points; each point keeps its fastest round")
    p.add_argument("--study", default="weak,strong", help="weak, strong or both; or staleness / ps-bytes (parameter server); "
                        "or memory / zero-step (ZeRO)")
    p.add_argument("--variants", default="bucketed,per_param,no_overlap",
                   help="DDP modes for the weak sweep (bucketed is always run)")
    p.add_argument("--out", default="", help="output folder (default runs/scale-<time>)")
    p.add_argument("--bind", action="store_true", help="pass -bind-to core to mpiexec")
    p.add_argument("--launcher", default="",
                   help="launch command with {n} for the rank count, e.g. 'srun -n {n}' "
                        "inside a Slurm allocation (default: mpiexec -n {n})")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per child job")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="config override for every child job (repeatable)")
    return p


def run(args) -> dict:
    if args.study in ("staleness", "ps-bytes"):  # parameter-server studies (ps_study.py)
        from hpcdp.bench import ps_study
        return ps_study.run_from_scale(args, max(parse_ranks(args.ranks)))
    if args.study in ("memory", "zero-step"):  # ZeRO studies (zero_study.py)
        from hpcdp.bench import zero_study
        return zero_study.run_from_scale(args, parse_ranks(args.ranks))
    ranks = parse_ranks(args.ranks)
    studies = [s.strip() for s in args.study.split(",") if s.strip()]
    bad = [s for s in studies if s not in ("weak", "strong")]
    if bad or not studies:
        raise SystemExit(f"hpcdp scale: --study {args.study!r}: choose weak, strong or weak,strong")
    variants = ["bucketed"] + [v.strip() for v in args.variants.split(",")
                               if v.strip() and v.strip() != "bucketed"]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"hpcdp scale: --variants: unknown {unknown[0]!r}; "
                         f"choose from {', '.join(VARIANTS)}")
    if args.launcher and "{n}" not in args.launcher:
        raise SystemExit(f"hpcdp scale: --launcher {args.launcher!r} must contain {{n}} "
                         "(the rank count), e.g. 'srun -n {n}'")
    if args.repeats < 1:
        raise SystemExit(f"hpcdp scale: --repeats {args.repeats} must be >= 1")
    if args.steps <= args.warmup:
        raise SystemExit(f"hpcdp scale: --steps {args.steps} must exceed --warmup {args.warmup}")
    from hpcdp.config import load_config

    cfg = load_config(args.config, args.set or [])
    batch = args.batch or cfg.train.global_batch
    if "strong" in studies and batch < max(ranks):
        raise SystemExit(f"hpcdp scale: strong scaling splits a global batch of {batch} over "
                         f"up to {max(ranks)} ranks; use --batch >= {max(ranks)}")
    out = Path(args.out or f"runs/scale-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    ncpu = os.cpu_count() or 1
    result = {
        "config": str(args.config), "ranks": ranks, "batch": batch, "steps": args.steps,
        "warmup": args.warmup, "repeats": args.repeats, "overrides": args.set or [], "cpus": ncpu,
        "title": f"{args.config}: batch {batch}, {args.steps} steps, {ncpu} CPUs",
    }
    if max(ranks) > ncpu:
        result["oversubscribed"] = (f"{max(ranks)} ranks on {ncpu} CPUs: ranks beyond {ncpu} "
                                    "share cores, so those points measure oversubscription")
    # The points of the sweep; (1, batch) serves both studies.
    plan = [("base", 1, batch, "bucketed")]
    for study in studies:
        for k in ranks:
            if k == 1:
                continue
            gb = k * batch if study == "weak" else batch
            for v in (variants if study == "weak" else ["bucketed"]):
                if (k, gb, v) not in [(q[1], q[2], q[3]) for q in plan]:
                    plan.append((study, k, gb, v))
    # Rounds: every point once per round, interleaved, so a burst of load from other
    # processes hits one repeat of several points rather than every repeat of one; each
    # point keeps its fastest repeat (least disturbed), all repeats go to the JSON.
    best: dict = {}
    for rnd in range(args.repeats):
        for study, k, gb, v in plan:
            p = run_point(args, k, gb, v, out)
            _log(p, f"{study}" + (f" r{rnd + 1}" if args.repeats > 1 else ""))
            key = (k, gb, v)
            prev = best.get(key)
            reps = (prev["repeats_step_time_s"] if prev else []) + [p["step_time_s"]]
            if prev is None or p["step_time_s"] < prev["step_time_s"]:
                best[key] = p
            best[key]["repeats_step_time_s"] = reps
    for study in studies:
        pts = [dict(best[(1, batch, "bucketed")])]
        for k in ranks:
            if k == 1:
                continue
            gb = k * batch if study == "weak" else batch
            for v in (variants if study == "weak" else ["bucketed"]):
                pts.append(dict(best[(k, gb, v)]))
        efficiency(pts)
        result[study] = pts
    speed = []
    for p in result.get("weak", []):
        if p["variant"] != "bucketed" or p["ranks"] == 1:
            continue
        for q in result["weak"]:
            if q["ranks"] == p["ranks"] and q["variant"] != "bucketed":
                speed.append({"ranks": p["ranks"], "over": q["variant"],
                              "speedup": q["step_time_s"] / p["step_time_s"],
                              "bucketed_step_s": p["step_time_s"],
                              "other_step_s": q["step_time_s"]})
    result["variant_speedup"] = speed
    table = format_table(result)
    print(table)
    (out / "scale.txt").write_text(table + "\n")
    (out / "scale.json").write_text(json.dumps(result, indent=2) + "\n")
    msg = plot(result, out / "scale.png")
    print(msg or f"wrote {out / 'scale.png'}")
    print(f"wrote {out / 'scale.json'} and {out / 'scale.txt'}")
    return result


def _log(p: dict, study: str = "") -> None:
    print(f"  {study or 'base':<6} {p['variant']:<11} n={p['ranks']} batch={p['global_batch']}: "
          f"{1e3 * p['step_time_s']:.2f} ms/step", flush=True)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
