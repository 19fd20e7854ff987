"""One point of a scaling study: its child ``hpcdp train`` job (:func:`run_point`, on
``mpiexec`` or ``--launcher``), the summary of its ``metrics.jsonl`` (:func:`summarize`)
and the measured efficiency; the DDP variants the study compares (:data:`VARIANTS`).
Used by the weak / strong study (hpcdp.scale.study), its report, the ZeRO studies,
calibration and validation.
"""

from __future__ import annotations

import json
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hpcdp.launch import child_env, mpiexec_command, parse_ranks, sets_for_job

# DDP modes compared by the study (values are --set overrides of [parallel.ddp]).
VARIANTS = {
    "bucketed": {"parallel.ddp.bucketing": '"size"', "parallel.ddp.overlap": "true"},
    "per_param": {"parallel.ddp.bucketing": '"per_param"', "parallel.ddp.overlap": "true"},
    "no_overlap": {"parallel.ddp.bucketing": '"size"', "parallel.ddp.overlap": "false"},
}

def study_ranks(text: str) -> list[int]:
    """``--ranks`` of a study: sorted, with the one-rank baseline added (efficiency is
    relative to it)."""
    return sorted(set(parse_ranks(text)) | {1})


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
                "bytes_sent", "grad_bytes_sent", "compute_only"):
        vals = [v for v in (_rank_mean(r, key) for r in use) if v is not None]
        out[key] = statistics.median(vals) if vals else 0.0
    return out


def _rank_mean(rec: dict, key: str):
    """A strategy figure of one metrics line, averaged over ranks.

    train.py writes the strategy's step_stats() per rank as ``{"ranks": {key: [r0, r1..]}}``
    (above run.rank_lists_up_to ranks, on most steps only ``{"spread": {key: {"mean", ...}}}``;
    or flat lists under the key); one-rank runs may have no strategy figures at all."""
    from hpcdp.metrics import rank_values

    if "ranks" not in rec and "spread" in rec:
        return rank_values(rec, key, "mean")
    for holder in (rec.get("ranks"), rec.get("strategy"), rec):
        if isinstance(holder, dict) and key in holder:
            v = holder[key]
            if isinstance(v, list):
                return sum(v) / len(v) if v else None
            if isinstance(v, (int, float)):
                return float(v)
    return None


def launch_command(args, k: int) -> list[str]:
    """The launcher for k ranks: ``--launcher`` with {n}, {nodes} (whole nodes of
    ``--ranks-per-node`` ranks) and {ppn} (ranks per node) filled in, else mpiexec."""
    if args.launcher:
        per = min(k, getattr(args, "ranks_per_node", 0) or k)
        return shlex.split(args.launcher.format(n=k, nodes=-(-k // per), ppn=per))
    cmd = mpiexec_command(k, "hpcdp scale")
    if getattr(args, "bind", False) and k > 1:
        cmd += ["-bind-to", "core"]
    return cmd


def run_point(args, k: int, global_batch: int, variant: str, out_dir: Path, tag: str = "") -> dict:
    """Launch one child job and summarise it. Variant ``compute_only``: the same job
    through :mod:`hpcdp.scale.compute_only` (no communication). Its run directory is
    ``OUT/<variant>-n<ranks>-b<global batch><tag>`` (``--collect`` reads these names)."""
    run_dir = out_dir / f"{variant}-n{k}-b{global_batch}{tag}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    sets = [f"train.global_batch={global_batch}", f"train.steps={args.steps}",
            "parallel.strategy=\"ddp\"", f"run.out_dir=\"{run_dir}\"",
            f"run.log_every={max(args.steps, 1)}"]
    sets += [f"{key}={val}" for key, val in VARIANTS.get(variant, {}).items()]
    sets += list(args.set or [])
    module = "hpcdp.scale.compute_only" if variant == "compute_only" else "hpcdp.cli"
    cmd = launch_command(args, k) + [sys.executable, "-m", module, "train",
                                     "--config", str(args.config)]
    for s in sets_for_job(args.config, sets):  # the strategy options this point reads
        cmd += ["--set", s]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True,
                          timeout=args.timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"child job failed (exit {proc.returncode}): "
                           f"{shlex.join(cmd)}\n{tail}")
    summary = summarize(run_dir / "metrics.jsonl", args.warmup)
    if (summary["compute_only"] == 1.0) != (variant == "compute_only"):
        raise RuntimeError(f"{run_dir}: the {'compute-only baseline ran with communication' if variant == 'compute_only' else 'point ran without communication'}"
                           " (step records' compute_only marker); the training loop no longer "
                           "passes build_strategy= to the strategy factory: see "
                           "hpcdp/scale/compute_only.py")
    gb = summary.get("global_batch") or global_batch
    summary.update(ranks=k, variant=variant, global_batch=gb, wall_s=wall,
                   samples_per_s=gb / summary["step_time_s"], command=shlex.join(cmd))
    return summary


def add_measured_efficiency(points: list[dict]) -> None:
    """Add ``efficiency`` = samples_per_s(K) / (K * samples_per_s(1)) to each measured
    point, in place (the model's own is hpcdp.scale.model.predicted_efficiency)."""
    base = next(p for p in points if p["ranks"] == 1)["samples_per_s"]
    for p in points:
        p["efficiency"] = p["samples_per_s"] / (p["ranks"] * base)


__all__ = ["VARIANTS", "study_ranks", "summarize", "launch_command", "run_point",
           "add_measured_efficiency"]
