"""``hpcdp scale --collect DIR [--profile P]``: the study table and plot from the run
directories in DIR, however they got there (``hpcdp scale --out DIR`` cut short by a
job's time limit, or points run as separate jobs, e.g. a Slurm job array writing
``DIR/<variant>-n<ranks>-b<global batch>[-r<repeat>]/metrics.jsonl``).

Every point keeps its fastest repeat. The one-rank point sets the per-rank batch B;
points with global batch ``ranks * B`` are weak scaling, with ``B`` strong. The training
config is the one-rank run's resolved ``config.toml``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

NAME = re.compile(r"^(bucketed|per_param|no_overlap|compute_only)-n(\d+)-b(\d+)(?:-r(\d+))?$")


def gather(folder: Path, warmup: int) -> dict:
    """``{(ranks, global batch, variant): fastest point summary}`` of a folder."""
    from hpcdp.scale.study import summarize

    best: dict = {}
    for run in sorted(folder.iterdir()):
        m = NAME.match(run.name)
        if not m or not (run / "metrics.jsonl").is_file():
            continue
        variant, k, gb = m.group(1), int(m.group(2)), int(m.group(3))
        try:
            p = summarize(run / "metrics.jsonl", warmup)
        except (RuntimeError, ValueError) as e:  # an unfinished run: say so, use the rest
            print(f"skipped {run}: {e}")
            continue
        p.update(ranks=k, variant=variant, global_batch=p.get("global_batch") or gb,
                 samples_per_s=gb / p["step_time_s"], run_dir=str(run))
        key = (k, gb, variant)
        reps = best[key]["repeats_step_time_s"] if key in best else []
        if key not in best or p["step_time_s"] < best[key]["step_time_s"]:
            best[key] = p
        best[key]["repeats_step_time_s"] = reps + [p["step_time_s"]]
    return best


def run(args) -> dict:
    from hpcdp.scale.study import VARIANTS, assemble, report

    folder = Path(args.collect)
    if not folder.is_dir():
        raise SystemExit(f"hpcdp scale --collect: {folder} is not a folder")
    best = gather(folder, args.warmup)
    ones = sorted(gb for (k, gb, v) in best if k == 1 and v == "bucketed")
    if not ones:
        raise SystemExit(f"hpcdp scale --collect: no finished one-rank point "
                         f"(bucketed-n1-b<B>/metrics.jsonl) in {folder}; efficiency needs it")
    batch = ones[0]
    ranks = sorted({k for (k, _, _) in best})
    studies = [s for s in ("weak", "strong")
               if any(k > 1 and gb == (k * batch if s == "weak" else batch) for (k, gb, _) in best)]
    variants = [v for v in VARIANTS if any(x == v for (_, _, x) in best)]
    one_rank = Path(best[(1, batch, "bucketed")]["run_dir"])
    result = {"config": str(one_rank / "config.toml"), "ranks": ranks, "batch": batch,
              "overrides": [], "collected_from": str(folder),
              "title": f"{folder}: batch {batch} per rank, collected {time.strftime('%Y-%m-%d %H:%M')}"}
    assemble(result, best, studies or ["weak"], ranks, batch, variants)
    if args.profile:
        from hpcdp.scale.report import predict_points
        from hpcdp.config import load_config
        from hpcdp.comm.model.cost import load_profile
        try:
            profile = load_profile(args.profile)
        except ValueError as e:
            raise SystemExit(f"hpcdp scale --collect: --profile: {e}") from None
        result["profile"] = profile.name
        predict_points(result, profile, load_config(result["config"], shared_options=True),
                       args.ranks_per_node or max(ranks))
    return report(result, folder)
