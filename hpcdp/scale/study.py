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

Attribution: every weak point K > 1 is also run compute-only (``hpcdp.scale.compute_only``:
same ranks, data and step, no collective; ``--no-baseline`` skips it), and the weak
efficiency splits into ``contention = t(1) / t_compute_only(K)`` (compute slowed by
sharing the node) times ``comm = t_compute_only(K) / t(K)`` (exposed communication and
its CPU cost); the efficiency lost is the sum of the two losses.

Prediction: with ``--profile P`` (a machine profile, see :mod:`hpcdp.comm.model.cost`) every
point gets the cost model's step time and the error of the measurement against it.

Other modes of ``hpcdp scale`` (docs/scaling.md): ``--calibrate`` (measure a profile),
``--predict`` (model only, up to thousands of ranks), ``--validate`` (held-out points
against a profile).

Outputs in ``--out``: ``scale.json`` (every point, with the exact child commands),
``scale.txt`` (the table as printed) and ``scale.png`` (needs matplotlib; skipped with a
message otherwise). Step times are medians over the steps after ``--warmup``; with
``--repeats R`` the whole sweep runs R times, interleaved, and each point keeps its
fastest repeat (the one least disturbed by other processes on a shared machine).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from hpcdp.launch import loadavg, parse_ranks, wait_quiet

# (re-exported: callers of the study's points import them from here too)
from hpcdp.scale.points import (VARIANTS, add_measured_efficiency, launch_command, run_point,
                                study_ranks, summarize)


def _plan(studies, ranks, batch, variants, baseline):
    """The points of the sweep, (study, ranks, global batch, variant); (1, batch) serves
    both studies, and weak points K > 1 get their compute-only twin."""
    plan = [("base", 1, batch, "bucketed")]
    for study in studies:
        for k in ranks:
            if k == 1:
                continue
            gb = k * batch if study == "weak" else batch
            for v in (variants if study == "weak" else ["bucketed"]):
                if (k, gb, v) not in [(q[1], q[2], q[3]) for q in plan]:
                    plan.append((study, k, gb, v))
            if study == "weak" and baseline:
                plan.append(("base", k, gb, "compute_only"))
    return plan


def attribute(weak: list[dict], baseline: dict) -> None:
    """Split each weak point's efficiency: contention (t(1) / compute-only(K)) times
    communication (compute-only(K) / t(K)); losses add up to 1 - efficiency."""
    t1 = next(p for p in weak if p["ranks"] == 1)["step_time_s"]
    for p in weak:
        co = baseline.get(p["ranks"])
        if p["ranks"] == 1 or co is None:
            continue
        p["compute_only_step_s"] = co["step_time_s"]
        p["eff_contention"] = t1 / co["step_time_s"]
        p["eff_comm"] = co["step_time_s"] / p["step_time_s"]
        p["loss_contention"] = 1.0 - p["eff_contention"]
        p["loss_comm"] = p["eff_contention"] - t1 / p["step_time_s"]


def run(args) -> dict:
    if args.study in ("staleness", "ps-bytes"):  # parameter-server studies (ps_study.py)
        from hpcdp.scale import ps_study
        return ps_study.run_from_scale(args, max(study_ranks(args.ranks)))
    if args.study in ("memory", "zero-step"):  # ZeRO studies (zero_study.py)
        from hpcdp.scale import zero_study
        return zero_study.run_from_scale(args, study_ranks(args.ranks))
    ranks = study_ranks(args.ranks)
    if args.nodes:  # node counts: whole nodes of --ranks-per-node ranks
        if not args.ranks_per_node:
            raise SystemExit("hpcdp scale: --nodes needs --ranks-per-node (ranks on each node)")
        ranks = study_ranks(",".join(str(int(n) * args.ranks_per_node)
                                     for n in parse_ranks(args.nodes, "--nodes")))
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

    cfg = load_config(args.config, args.set or [], shared_options=True)
    batch = args.batch or cfg.train.global_batch
    if "strong" in studies and batch < max(ranks):
        raise SystemExit(f"hpcdp scale: strong scaling splits a global batch of {batch} over "
                         f"up to {max(ranks)} ranks; use --batch >= {max(ranks)}")
    profile = None
    if args.profile:
        from hpcdp.comm.model.cost import load_profile
        try:
            profile = load_profile(args.profile)
        except ValueError as e:
            raise SystemExit(f"hpcdp scale: --profile: {e}") from None
    out = Path(args.out or f"runs/scale-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    ncpu = os.cpu_count() or 1
    result = {
        "config": str(args.config), "ranks": ranks, "batch": batch, "steps": args.steps,
        "warmup": args.warmup, "repeats": args.repeats, "overrides": args.set or [], "cpus": ncpu,
        "title": f"{args.config}: batch {batch}, {args.steps} steps, {ncpu} CPUs",
        "load_before": loadavg(), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    per_node = args.ranks_per_node or max(ranks)
    if max(ranks) > ncpu and not args.launcher:
        result["oversubscribed"] = (f"{max(ranks)} ranks on {ncpu} CPUs: ranks beyond {ncpu} "
                                    "share cores, so those points measure oversubscription")
    plan = _plan(studies, ranks, batch, variants, not args.no_baseline)
    # Rounds: every point once per round, interleaved, so a burst of load from other
    # processes hits one repeat of several points rather than every repeat of one; each
    # point keeps its fastest repeat (least disturbed), all repeats go to the JSON.
    best: dict = {}
    try:
        for rnd in range(args.repeats):
            wait_quiet(getattr(args, "wait_quiet", 0.0), getattr(args, "wait_max", 1800.0))
            for study, k, gb, v in plan:
                p = run_point(args, k, gb, v, out, f"-r{rnd + 1}")
                _log(p, f"{study}" + (f" r{rnd + 1}" if args.repeats > 1 else ""))
                key = (k, gb, v)
                prev = best.get(key)
                reps = (prev["repeats_step_time_s"] if prev else []) + [p["step_time_s"]]
                if prev is None or p["step_time_s"] < prev["step_time_s"]:
                    best[key] = p
                best[key]["repeats_step_time_s"] = reps
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        # A point failed: report the points that finished, then fail with the reason.
        if (1, batch, "bucketed") in best:
            result["incomplete"] = f"stopped early: {str(e).splitlines()[0]}"
            assemble(result, best, studies, ranks, batch, variants)
            report(result, out)
        raise SystemExit(f"hpcdp scale: {e}") from None
    result["load_after"] = loadavg()
    assemble(result, best, studies, ranks, batch, variants)
    if profile is not None:
        from hpcdp.scale.report import predict_points
        result["profile"] = profile.name
        predict_points(result, profile, cfg, per_node)
    return report(result, out)


def assemble(result: dict, best: dict, studies, ranks, batch: int, variants) -> dict:
    """The study's tables from its points ``{(ranks, global batch, variant): summary}``:
    weak/strong lists with efficiencies, compute-only baselines and the attribution,
    and the speedup of bucketed over the other DDP modes. Points missing from ``best``
    (a study cut short) are left out."""
    for study in studies:
        pts = [dict(best[(1, batch, "bucketed")])]
        for k in ranks:
            if k == 1:
                continue
            gb = k * batch if study == "weak" else batch
            for v in (variants if study == "weak" else ["bucketed"]):
                if (k, gb, v) in best:
                    pts.append(dict(best[(k, gb, v)]))
        add_measured_efficiency(pts)
        result[study] = pts
    baseline = {k: best[(k, gb, v)] for (k, gb, v) in best if v == "compute_only"}
    result["baseline"] = [baseline[k] for k in sorted(baseline)]
    if "weak" in result:
        attribute(result["weak"], baseline)
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
    return result


def report(result: dict, out: Path) -> dict:
    """Print and write the table, JSON and PNG of a study's result."""
    from hpcdp.scale.report import format_table, plot, write_outputs

    write_outputs(out, "scale", format_table(result), result, plot)
    return result


def _log(p: dict, study: str = "") -> None:
    print(f"  {study or 'base':<6} {p['variant']:<11} n={p['ranks']} batch={p['global_batch']}: "
          f"{1e3 * p['step_time_s']:.2f} ms/step", flush=True)
