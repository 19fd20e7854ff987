"""``hpcdp bench exact``: what exact mode costs against fast mode, in one run.

For each model config (the MLP of jobs/digits_ddp.toml, the GPT of
jobs/gpt_ddp.toml) and each rank count, it launches ``hpcdp train`` jobs under DDP
in three variants, interleaved round by round (load drift on a shared machine
hits all of them alike):

- ``fast``: today's mode, one micro-batch per rank;
- ``fast-micro``: fast mode cut into the same micro-batches as exact mode
  (``grad_accum = micro-batches per rank``), to separate the cost of smaller
  micro-batches from the cost of the integer sum; only where it differs from fast;
- ``exact``: ``train.reproducible = "exact"`` with ``exact_micro_batch =
  global_batch / max(--ranks)`` (one micro-batch per rank at the largest count).

Reported per job: the median step time after ``--warmup`` steps (median over
rounds), and the bytes each rank sends per step (the ledger: ring allreduce of
int64 plus the per-tensor MAX in exact mode). ``--curves`` also trains the GPT
(dropout 0.1) for ``--curve-steps`` steps in both modes on 2 ranks and plots the
training and eval loss side by side (exact must converge like fast).

Children unset ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` (as ``hpcdp bench
step`` does) and run one BLAS/numba thread per rank; every variant alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from datetime import datetime
from pathlib import Path

from .check import launch_train, parse_ranks

CLEARED_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
JOBS = Path(__file__).resolve().parents[2] / "jobs"
MODELS = {
    "mlp": (JOBS / "digits_ddp.toml", 64, []),
    "gpt": (JOBS / "gpt_ddp.toml", 16, []),
}


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _per_rank_median(steps: list[dict], key: str) -> float:
    vals = []
    for r in steps:
        v = r.get("ranks", {}).get(key)
        if isinstance(v, list) and v:
            vals.append(sum(v) / len(v))
    return statistics.median(vals) if vals else 0.0


def summarize(run_dir: Path, warmup: int) -> dict:
    steps = [r for r in _records(run_dir) if "step_time_s" in r]
    use = steps[warmup:]
    if not use:
        raise RuntimeError(f"{run_dir}: {len(steps)} steps, need more than --warmup {warmup}")
    return {"step_ms": 1e3 * statistics.median(r["step_time_s"] for r in use),
            "bytes_sent": _per_rank_median(use, "bytes_sent"), "steps": len(use)}


def variants(model: str, n: int, top: int) -> dict[str, list[str]]:
    cfg, gb, extra = MODELS[model]
    micro = gb // top
    per_rank = gb // micro // n
    out = {"fast": []}
    if per_rank > 1:
        out["fast-micro"] = [f"train.grad_accum={per_rank}"]
    out["exact"] = ['train.reproducible="exact"', f"train.exact_micro_batch={micro}"]
    return {k: extra + v for k, v in out.items()}


def run_bench(args) -> dict:
    ranks = parse_ranks(args.ranks)
    top = max(ranks)
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            raise ValueError(f"--models: {m!r}; choose from {', '.join(MODELS)}")
    out = Path(args.out)
    results: dict = {}
    for rnd in range(args.rounds):
        for model in models:
            cfg, gb, _ = MODELS[model]
            steps = args.steps_mlp if model == "mlp" else args.steps_gpt
            base = [f"train.steps={steps}", "train.epochs=0", "run.eval_every=0",
                    f"run.log_every={steps}", f"train.global_batch={gb}"]
            for n in ranks:
                vs = list(variants(model, n, top).items())
                if rnd % 2:
                    vs.reverse()  # alternate the order: no variant always runs first
                for name, sets in vs:
                    run_dir = out / f"{model}-n{n}-{name}"
                    launch_train(n, cfg, base + sets, run_dir, timeout=args.timeout,
                                 clear_env=CLEARED_ENV, echo=False)
                    s = summarize(run_dir, args.warmup)
                    key = f"{model} n={n} {name}"
                    results.setdefault(key, []).append(s)
                    print(f"  round {rnd + 1}: {key:<22} {s['step_ms']:8.2f} ms/step  "
                          f"{s['bytes_sent'] / 1024:9.1f} KiB sent/rank/step", flush=True)
    table = {k: {"step_ms": statistics.median(x["step_ms"] for x in v),
                 "bytes_sent": statistics.median(x["bytes_sent"] for x in v)} for k, v in results.items()}
    return table


def format_table(table: dict) -> str:
    lines = [f"{'job':<24} {'ms/step':>9} {'x fast':>7} {'KiB sent/rank/step':>19} {'x fast':>7}"]
    for key, r in table.items():
        fast = table[key.rsplit(" ", 1)[0] + " fast"]
        t = r["step_ms"] / fast["step_ms"]
        b = (r["bytes_sent"] / fast["bytes_sent"]) if fast["bytes_sent"] else float("nan")
        lines.append(f"{key:<24} {r['step_ms']:9.2f} {t:7.2f} {r['bytes_sent'] / 1024:19.1f} "
                     f"{'-' if b != b else f'{b:.2f}':>7}")
    return "\n".join(lines)


def run_curves(args) -> dict:
    """Loss curves of fast and exact mode on the GPT (2 ranks, dropout 0.1)."""
    cfg, gb, _ = MODELS["gpt"]
    out = Path(args.out)
    base = [f"train.steps={args.curve_steps}", "train.epochs=0", "model.dropout=0.1",
            f"run.eval_every={max(args.curve_steps // 10, 1)}", "run.log_every=1"]
    curves = {}
    for name, sets in (("fast", []), ("exact", ['train.reproducible="exact"', f"train.exact_micro_batch={gb // 2}"])):
        run_dir = out / f"curve-{name}"
        launch_train(2, cfg, base + sets, run_dir, timeout=args.timeout, clear_env=CLEARED_ENV, echo=False)
        recs = _records(run_dir)
        curves[name] = {"train": [(r["step"], r["loss"]) for r in recs if "loss" in r and "step" in r],
                        "eval": [(r["eval"]["step"], r["eval"]["loss"]) for r in recs if "eval" in r],
                        "floor": next((r["eval"].get("loss_floor") for r in recs if "eval" in r), None)}
        print(f"  curve {name}: final eval loss {curves[name]['eval'][-1][1]:.4f}", flush=True)
    return curves


def plot_curves(curves: dict, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, name in zip(axes, ("fast", "exact")):
        c = curves[name]
        s, l = zip(*c["train"])
        ax.plot(s, l, lw=0.6, alpha=0.6, label="train loss (step)")
        es, el = zip(*c["eval"])
        ax.plot(es, el, "o-", label="eval loss")
        if c["floor"]:
            ax.axhline(c["floor"], color="k", ls="--", lw=0.8, label="loss floor")
        other = curves["exact" if name == "fast" else "fast"]["eval"]
        ax.plot(*zip(*other), "x:", color="gray", label=f"eval loss ({'exact' if name == 'fast' else 'fast'})")
        ax.set(title=f"{name} mode", xlabel="step")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("cross-entropy (nats/token)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser(p=None):
    p = p or argparse.ArgumentParser(prog="hpcdp bench exact", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--models", default="mlp,gpt")
    p.add_argument("--steps-mlp", type=int, default=60)
    p.add_argument("--steps-gpt", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--curves", action="store_true", help="also the loss curves of fast vs exact (GPT)")
    p.add_argument("--curve-steps", type=int, default=300)
    p.add_argument("--png", default="docs/exact_vs_fast_loss.png")
    p.add_argument("--out", default="runs/bench-exact")
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--timeout", type=float, default=1800.0)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    meta = {"date": datetime.now().isoformat(timespec="seconds"), "cpu": platform.processor(),
            "load_before": os.getloadavg(), "env_cleared": list(CLEARED_ENV)}
    t0 = time.time()
    table = run_bench(args)
    meta["load_after"] = os.getloadavg()
    print(format_table(table))
    result = {"meta": meta, "table": table}
    if args.curves:
        curves = run_curves(args)
        plot_curves(curves, Path(args.png), f"GPT (jobs/gpt_ddp.toml, dropout 0.1), 2 ranks, "
                                            f"{args.curve_steps} steps: fast vs exact mode")
        result["curves_final_eval"] = {k: v["eval"][-1] for k, v in curves.items()}
        print(f"wrote {args.png}")
    meta["wall_s"] = time.time() - t0
    print(f"load average before {meta['load_before']}, after {meta['load_after']}; {meta['wall_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


__all__ = ["main", "variants", "format_table"]
