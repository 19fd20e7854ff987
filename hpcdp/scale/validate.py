"""``hpcdp scale --validate --profile P --config C --ranks 2,3,4``: measured points that
the profile was NOT fitted on, next to its predictions, with the error of each.

Two kinds of points:

- collectives: ``hpcdp bench collectives`` (ring and recursive doubling; hierarchical too
  at rank counts with more than one emulated node, ``--ranks-per-node``) for sizes
  ``--sizes`` at every rank count of ``--ranks``, at most ``--iters`` timed calls per
  point (default 200, split over the rounds: bounded on a slow link too); measured =
  the fastest of the interleaved rounds on one node (the statistic the calibration
  uses: there noise only slows a round); where the point crosses nodes the fastest
  round not faster than 3/4 of its bytes' time at the link's rate (``--statistic``,
  :func:`repeat_statistic`: a rate-limited link's token bucket makes the one round that
  finds it full faster than the link);
- training steps: an ``hpcdp scale`` study of the config (weak and strong, DDP variants,
  compute-only baselines) at ``--ranks``, every point predicted by the same profile.

The calibration (``--calibrate``) fits on two ranks: MPI exchanges, an 8 KiB and a 256 KiB
ring with varied segments, 8-byte calls, and one-rank steps at three batch sizes. So every
collective at 3 or more ranks, every size but 8 bytes at 2 ranks, and every multi-rank
step is held out; points the profile was fitted on are marked ``cal`` and left out of the
summary, as are oversubscribed points (more ranks than cores: outside the model), which
are shown and marked ``*``.

Summary: median and largest |error| over the held-out points, for the collectives and
the steps separately. Outputs in ``--out``: ``validate.txt``, ``validate.json``,
``validate.png``.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

AIM_MEDIAN, AIM_MAX = 0.10, 0.20
STATISTICS = ("auto", "fastest", "steady", "median")
BURST_FRACTION = 0.75  # "steady": a repeat under this x its bytes' time at the link's rate


def repeat_statistic(samples, statistic: str = "fastest", rate_floor_s: float = 0.0) -> float:
    """One figure from a point's repeats.

    - ``fastest``: their minimum (on shared memory or an idle link other processes only
      ever slow a repeat down);
    - ``median``;
    - ``steady``: the fastest repeat that is not faster than ``BURST_FRACTION`` of
      ``rate_floor_s``, the time its bytes take at the link's rate (the model's
      bandwidth term). On a rate-limited link a token bucket (tbf's ``burst``) lets the
      repeat that starts with it full run above the rate: the fastest would pick that
      burst; the median would keep the noise that slows small-message repeats, whose
      floor is ~0 so their fastest is kept. Every repeat below the floor: the median."""
    if not samples:
        raise ValueError("repeat_statistic: no samples")
    if statistic == "fastest":
        return float(min(samples))
    if statistic == "median":
        return float(statistics.median(samples))
    if statistic == "steady":
        kept = [s for s in samples if s >= BURST_FRACTION * rate_floor_s]
        return float(min(kept)) if kept else float(statistics.median(samples))
    raise ValueError(f"repeat_statistic: statistic must be one of {', '.join(STATISTICS[1:])}, "
                     f"got {statistic!r}")


def point_statistic(statistic: str, n: int, per_node: int) -> str:
    """``auto``: ``steady`` where the point's ranks span more than one node (the link
    there may be rate-limited: the emulated cluster's tbf, a shared switch), the
    fastest within one node."""
    if statistic not in STATISTICS:
        raise ValueError(f"--statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    if statistic != "auto":
        return statistic
    return "steady" if n > per_node else "fastest"


def _bench(args, n: int, algos: list, out: Path) -> dict:
    from hpcdp.bench.collectives import parse_size
    from hpcdp.launch import child_env, run_child
    from hpcdp.scale.study import launch_command

    lo, hi = args.sizes.split(":") if ":" in args.sizes else ("8", args.sizes)
    path = out / f"collectives-n{n}.json"
    if args.reuse and path.is_file():  # the measurements of an earlier --validate in --out
        data = json.loads(path.read_text())
        data.setdefault("command", "(reused)")
        return data
    cmd = launch_command(args, n) + [sys.executable, "-m", "hpcdp.bench.collectives",
                                     "--algorithms", ",".join(algos), "--min", str(parse_size(lo)),
                                     "--max", str(parse_size(hi)), "--repeats", str(max(5, 2 * args.repeats)),
                                     "--max-iters", str(getattr(args, "iters", 200)), "--json", str(path)]
    env = child_env()
    if args.ranks_per_node:
        env["HPCDP_RANKS_PER_NODE"] = str(min(n, args.ranks_per_node))
    run_child(cmd, "hpcdp scale --validate", args.timeout, env)
    data = json.loads(path.read_text())
    data["command"] = shlex.join(cmd)
    return data


def collective_points(profile, bench: dict, n: int, per_node: int, cores: int,
                      fitted_max: int = 8, statistic: str = "auto") -> list[dict]:
    """One point per bench row (not MPI's own): measured (the repeats' ``statistic``,
    :func:`point_statistic`) vs the model. At 2 ranks, sizes up to ``fitted_max`` are
    calibration points (the 8-byte calls; with a small-message refit, every size the
    refit saw)."""
    from hpcdp.comm.model import cost as CM

    topo = CM.Topology.of(n, per_node)
    stat = point_statistic(statistic, n, per_node)
    pts = []
    for row in bench["rows"]:
        algo = row["algorithm"]
        if algo not in CM.priced():
            continue
        cost = CM.priced()[algo](profile, row["size"], topo, 4)
        pred = cost.total_s
        measured = repeat_statistic(row["samples_us"], stat, 1e6 * cost.bandwidth_s) * 1e-6
        pts.append({"kind": "collective", "what": f"{algo} {row['size']} B", "algorithm": algo,
                    "ranks": n, "bytes": row["size"], "measured_s": measured, "pred_s": pred,
                    "statistic": stat,
                    "error": measured / pred - 1.0,
                    "calibration": n == 2 and row["size"] <= fitted_max and algo in ("ring", "recursive"),
                    "oversubscribed": bool(cores) and min(n, per_node) > cores})
    return pts


def step_points(study: dict, cores: int, per_node: int, fitted_ranks=()) -> list[dict]:
    """Every predicted point of a study; one-rank steps (the compute fit) and the
    compute-only runs at the rank counts the contention was measured at are marked as
    calibration points."""
    pts = []
    for name in ("weak", "strong", "baseline"):
        for p in study.get(name, []):
            if "pred_step_s" not in p or (name == "strong" and p["ranks"] == 1):
                continue
            label = "compute-only" if p["variant"] == "compute_only" else f"{name} {p['variant']}"
            pts.append({"kind": "step", "what": f"{label} batch {p['global_batch']}",
                        "ranks": p["ranks"], "measured_s": p["step_time_s"],
                        "pred_s": p["pred_step_s"], "error": p["pred_error"],
                        # one-rank steps at batches B/2..2B are what compute was fitted on
                        "calibration": p["ranks"] == 1 or (p["variant"] == "compute_only"
                                                           and p["ranks"] in fitted_ranks),
                        "oversubscribed": bool(cores) and min(p["ranks"], per_node) > cores})
    return pts


def summarize(points: list[dict]) -> dict:
    out = {}
    for kind in ("collective", "step"):
        held = [abs(p["error"]) for p in points
                if p["kind"] == kind and not p["calibration"] and not p["oversubscribed"]]
        every = [abs(p["error"]) for p in points if p["kind"] == kind]
        out[kind] = {
            "held_out_points": len(held),
            "median_abs_error": statistics.median(held) if held else None,
            "max_abs_error": max(held) if held else None,
            "within_aim": bool(held) and statistics.median(held) <= AIM_MEDIAN and max(held) <= AIM_MAX,
            "all_points": len(every),
            "median_abs_error_all": statistics.median(every) if every else None,
        }
    return out


def format_validation(res: dict) -> str:
    stats = sorted({p["statistic"] for p in res["points"] if "statistic" in p})
    lines = [f"validation of profile {res['profile']!r} ({res['load']})"
             + (f"; collectives measured as the {' / '.join(stats)} of repeats "
                "(fastest within a node; across nodes the fastest not below 3/4 of the link's rate)" if stats else ""),
             f"{'kind':<10} {'ranks':>5} {'point':<36} {'measured ms':>12} {'predicted ms':>13} "
             f"{'error':>8}  note"]
    lines.append("-" * len(lines[-1]))
    for p in res["points"]:
        note = "cal (fitted on it)" if p["calibration"] else ("* oversubscribed" if p["oversubscribed"] else "")
        lines.append(f"{p['kind']:<10} {p['ranks']:>5} {p['what']:<36} {1e3 * p['measured_s']:>12.4f} "
                     f"{1e3 * p['pred_s']:>13.4f} {p['error']:>+8.1%}  {note}")
    lines.append("")
    for kind, s in res["summary"].items():
        if not s["held_out_points"]:
            lines.append(f"{kind}s: no held-out point in the model's scope")
            continue
        lines.append(f"{kind}s: {s['held_out_points']} held-out points: median |error| "
                     f"{s['median_abs_error']:.1%}, largest {s['max_abs_error']:.1%} "
                     f"(aim: median <= {AIM_MEDIAN:.0%}, every point <= {AIM_MAX:.0%}: "
                     f"{'met' if s['within_aim'] else 'NOT met'}); all {s['all_points']} points "
                     f"incl. calibration/oversubscribed: median |error| {s['median_abs_error_all']:.1%}")
    return "\n".join(lines)


def plot_validation(res: dict, path: Path) -> str | None:
    from hpcdp.scale.report import NO_MATPLOTLIB, pyplot

    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for kind, marker in (("collective", "o"), ("step", "s")):
        for flag, color, label in ((False, None, "held out"), (True, "gray", "calibration / oversubscribed")):
            pts = [p for p in res["points"] if p["kind"] == kind
                   and (p["calibration"] or p["oversubscribed"]) == flag]
            if pts:
                axes[0].scatter([1e3 * p["pred_s"] for p in pts], [1e3 * p["measured_s"] for p in pts],
                                marker=marker, s=18, color=color, label=f"{kind}, {label}",
                                alpha=0.5 if flag else 0.9)
    lo = min(1e3 * min(p["pred_s"], p["measured_s"]) for p in res["points"])
    hi = max(1e3 * max(p["pred_s"], p["measured_s"]) for p in res["points"])
    for f, style in ((1.0, "-"), (1.2, ":"), (0.8, ":")):
        axes[0].plot([lo, hi], [lo * f, hi * f], color="k", ls=style, lw=0.8)
    axes[0].set(xscale="log", yscale="log", xlabel="predicted ms", ylabel="measured ms",
                title="measured vs predicted (dotted: +-20%)")
    held = [p for p in res["points"] if not p["calibration"]]
    axes[1].bar(range(len(held)), [100 * p["error"] for p in held],
                color=["gray" if p["oversubscribed"] else ("C0" if p["kind"] == "collective" else "C1")
                       for p in held])
    axes[1].axhline(20, color="k", ls=":", lw=0.8)
    axes[1].axhline(-20, color="k", ls=":", lw=0.8)
    axes[1].set(ylabel="error % (measured / predicted - 1)", xlabel="held-out point",
                title="error per point (blue: collectives, orange: steps, gray: oversubscribed)")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"profile {res['profile']}: {res['load']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def run(args) -> dict:
    from argparse import Namespace

    from hpcdp.comm.model import cost as CM
    from hpcdp.launch import loadavg, wait_quiet
    from hpcdp.scale import study as scale

    if not args.profile:
        raise SystemExit("hpcdp scale --validate: --profile P is required (calibrated on another run)")
    try:
        profile = CM.load_profile(args.profile)
    except ValueError as e:
        raise SystemExit(f"hpcdp scale --validate: --profile: {e}") from None
    if args.probe_max:  # calibrated on small messages only: the large ones are held out
        from hpcdp.scale.calibrate import refit_small
        from hpcdp.bench.collectives import parse_size
        profile = refit_small(profile, parse_size(args.probe_max))
    ranks = [k for k in scale.study_ranks(args.ranks) if k > 1]
    out = Path(args.out or f"runs/validate-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    per_node = args.ranks_per_node or max(ranks)
    cores = profile.cores_per_node or (os.cpu_count() or 0)
    load_before = loadavg()
    points, commands = [], []
    fitted = 8
    if args.probe_max:
        from hpcdp.bench.collectives import parse_size
        fitted = parse_size(args.probe_max)
    for n in ranks:
        algos = ["ring", "recursive"] + (["hierarchical"] if n > min(n, per_node) > 1 else [])
        wait_quiet(getattr(args, "wait_quiet", 0.0), getattr(args, "wait_max", 1800.0))
        bench = _bench(args, n, algos, out)
        commands.append(bench["command"])
        points += collective_points(profile, bench, n, per_node, cores, fitted,
                                    getattr(args, "statistic", "auto"))
    if not args.no_study:
        done = out / "study" / "scale.json"
        if args.reuse and done.is_file():  # re-predict an earlier study with this profile
            from hpcdp.scale.report import predict_points
            from hpcdp.config import load_config
            study = json.loads(done.read_text())
            predict_points(study, profile, load_config(study["config"], study["overrides"], shared_options=True),
                           per_node)
        else:
            study_args = Namespace(**{**vars(args), "out": str(out / "study"), "profile": args.profile,
                                      "ranks": ",".join(str(k) for k in [1] + ranks)})
            study = scale.run(study_args)
        points += step_points(study, cores, per_node, set(profile.contention))
    res = {"profile": profile.name, "config": str(args.config), "ranks": ranks,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "points": points,
           "summary": summarize(points), "bench_commands": commands,
           "load_before": load_before, "load_after": loadavg()}
    res["load"] = f"load average {res['load_before']} -> {res['load_after']}, {cores} cores"
    from hpcdp.scale.report import write_outputs
    write_outputs(out, "validate", format_validation(res), res, plot_validation)
    return res
