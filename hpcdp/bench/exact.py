"""``hpcdp bench exact``: what exact mode costs against fast mode, in one run.

For each model config (the MLP of jobs/digits_ddp.toml, the GPT of
jobs/gpt_ddp.toml) and each rank count, ONE ``mpiexec`` job builds three contenders
side by side in the same processes, each with its own model, optimizer, DDP
strategy, communicator and byte ledger, all from the same seed and data:

- ``fast``: today's mode, one micro-batch per rank;
- ``fast-micro``: fast mode cut into the same micro-batches as exact mode
  (``grad_accum`` = micro-batches per rank), to separate the cost of smaller
  micro-batches from the cost of the integer sum; only where it differs from fast;
- ``exact``: ``train.reproducible = "exact"`` with ``exact_micro_batch =
  global_batch / max(--ranks)`` (one micro-batch per rank at the largest count).

and runs them step by step in rotation (fast, exact, fast-micro, then the next
order...), each step started by a barrier, so load drift on a shared machine hits
all of them alike. Reported per contender: the median over steps (after
``--warmup``) of the step's wall time on the slowest rank, and the bytes each rank
sends per step (its ledger: ring allreduce of float32 or int64, plus exact mode's
per-tensor MAX). ``--curves`` also trains the GPT (dropout 0.1) with ``hpcdp
train`` in both modes on 2 ranks and plots the training and eval loss side by side.

The children run one BLAS/numba thread per rank and unset ``OPENBLAS_CORETYPE``
and ``OPENBLAS_L2_SIZE`` (as ``hpcdp bench step`` does); every contender alike.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

from hpcdp.jobs import config_path
from hpcdp.launch import CLEARED_ENV, child_env, hpcdp_command, launch_train, mpiexec_command, parse_ranks, run_child

MODELS = {"mlp": (config_path("digits_ddp.toml"), 64), "gpt": (config_path("gpt_ddp.toml"), 16)}


def contenders(model: str, n: int, top: int) -> dict[str, list[str]]:
    """name -> --set overrides; exact's micro-batch is global_batch / top."""
    _, gb = MODELS[model]
    micro = gb // top
    per_rank = gb // micro // n
    out = {"fast": []}
    if per_rank > 1:
        out["fast-micro"] = [f"train.grad_accum={per_rank}"]
    out["exact"] = ['train.reproducible="exact"', f"train.exact_micro_batch={micro}"]
    return out


# -- the worker (inside mpiexec) ---------------------------------------------------------

class _Contender:
    def __init__(self, cfg, ds, model, world):
        from hpcdp.autograd import Tensor
        from hpcdp.backend import get_backend
        from hpcdp.data.sampler import GlobalSampler
        from hpcdp.optim import build_optimizer
        from hpcdp.strategies import build_strategy

        self.cfg, self.model = cfg, model
        be = get_backend("cpu")
        self.opt = build_optimizer(cfg.optim, layout=model.flat.layout, dtype=cfg.run.dtype)
        self.strategy = build_strategy(cfg.parallel, world, cfg.comm)
        self.strategy.setup(model.flat, self.opt, world)
        self.exact = None
        if cfg.train.reproducible == "exact":
            from hpcdp.exact.mode import ExactMode
            self.exact = ExactMode(cfg.train, self.strategy, world, model.flat)
        self.sampler = GlobalSampler(ds.n_train, cfg.train.global_batch, cfg.data.seed, cfg.train.last_batch)
        self.fetch = lambda idx: (Tensor(ds.x_train[idx], backend=be), Tensor(ds.y_train[idx], backend=be))
        self.times, self.bytes = [], []

    def step(self, step0: int) -> None:
        from hpcdp.data.sampler import micro_batches
        from hpcdp.optim import lr_at
        from hpcdp.step import LocalBatch, train_step

        s = self.strategy
        self.opt.lr = lr_at(self.cfg.optim, step0 + 1, 10 ** 6)
        if self.exact is None:
            local, g = self.sampler.local_indices(step0, s.dp_size, s.dp_rank)
            batch = LocalBatch(micro_batches(local, self.cfg.train.grad_accum), g,
                               filler=self.sampler.global_indices(step0)[:1], step=step0)
        else:
            batch = self.exact.local_batch(self.sampler, step0)
        t0 = time.perf_counter()
        train_step(self.model, s, batch, self.fetch)
        self.times.append(time.perf_counter() - t0)
        self.bytes.append(s.step_stats().get("bytes_sent", 0.0))


def worker(args) -> None:
    import numpy as np
    from mpi4py import MPI

    from hpcdp.config import load_config
    from hpcdp.data import load_dataset
    from hpcdp.nn import build_model
    from hpcdp.train import task_of
    from hpcdp.world import World

    path, _ = MODELS[args.model]
    names = args.contenders.split(",")
    runs = {}
    for name in names:
        sets = contenders(args.model, MPI.COMM_WORLD.Get_size(), args.top)[name]
        cfg = load_config(path, sets + ["train.steps=1", "train.epochs=0"])
        ds = load_dataset(cfg.data, task_of(cfg.model), cfg.run.dtype)
        model = build_model(cfg.model, dtype=cfg.run.dtype)
        runs[name] = _Contender(cfg, ds, model, World.from_mpi(MPI.COMM_WORLD.Dup()))
    comm = MPI.COMM_WORLD
    for step in range(args.steps):
        order = names[step % len(names):] + names[:step % len(names)]  # rotate who goes first
        for name in order:
            comm.Barrier()
            runs[name].step(step)
    out = {}
    for name, c in runs.items():
        t = np.array(c.times[args.warmup:])
        slowest = np.empty_like(t)
        comm.Allreduce(t, slowest, op=MPI.MAX)  # the step's critical path
        out[name] = {"step_ms": 1e3 * float(np.median(slowest)),
                     "step_ms_iqr": [1e3 * float(q) for q in np.percentile(slowest, [25, 75])],
                     "bytes_sent": float(statistics.median(c.bytes[args.warmup:])),
                     "steps": int(len(t))}
    if comm.Get_rank() == 0:
        Path(args.json).write_text(json.dumps(out))


# -- the driver -----------------------------------------------------------------------------

def run_bench(args) -> dict:
    ranks = parse_ranks(args.ranks)
    top = max(ranks)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = {}
    for model in [m for m in args.models.split(",") if m]:
        if model not in MODELS:
            raise ValueError(f"--models: {model!r}; choose from {', '.join(MODELS)}")
        steps = args.steps_mlp if model == "mlp" else args.steps_gpt
        for n in ranks:
            names = list(contenders(model, n, top))
            js = out / f"{model}-n{n}.json"
            cmd = mpiexec_command(n, "hpcdp bench exact") + hpcdp_command("hpcdp.bench.exact") + ["--worker",
                   "--model", model, "--top", str(top), "--steps", str(steps), "--warmup",
                   str(args.warmup), "--contenders", ",".join(names), "--json", str(js)]
            run_child(cmd, "hpcdp bench exact", args.timeout, child_env(clear=CLEARED_ENV), tail=2500)
            for name, r in json.loads(js.read_text()).items():
                table[f"{model} n={n} {name}"] = r
                print(f"  {model} n={n} {name:<10} {r['step_ms']:9.2f} ms/step "
                      f"(IQR {r['step_ms_iqr'][0]:.2f}-{r['step_ms_iqr'][1]:.2f})  "
                      f"{r['bytes_sent'] / 1024:9.1f} KiB sent/rank/step", flush=True)
    return table


def format_table(table: dict) -> str:
    lines = [f"{'job':<24} {'ms/step':>9} {'x fast':>7} {'KiB sent/rank/step':>19} {'x fast':>7}"]
    for key, r in table.items():
        fast = table[key.rsplit(" ", 1)[0] + " fast"]
        t = r["step_ms"] / fast["step_ms"]
        b = f"{r['bytes_sent'] / fast['bytes_sent']:.2f}" if fast["bytes_sent"] else "-"
        lines.append(f"{key:<24} {r['step_ms']:9.2f} {t:7.2f} {r['bytes_sent'] / 1024:19.1f} {b:>7}")
    return "\n".join(lines)


CURVE_CONFIG, CURVE_BATCH = config_path("gpt_small.toml"), 32   # reaches near its loss floor


def run_curves(args) -> dict:
    """Loss curves of fast and exact mode on the small GPT (2 ranks, dropout 0.1)."""
    cfg, gb = CURVE_CONFIG, CURVE_BATCH
    base = [f"train.steps={args.curve_steps}", "train.epochs=0", "model.dropout=0.1", 'parallel.strategy="ddp"',
            f"run.eval_every={max(args.curve_steps // 10, 1)}", "run.log_every=1"]
    curves = {}
    for name, sets in (("fast", []), ("exact", ['train.reproducible="exact"', f"train.exact_micro_batch={gb // 2}"])):
        run_dir = Path(args.out) / f"curve-{name}"
        launch_train(2, cfg, base + sets, run_dir, timeout=args.timeout, clear_env=CLEARED_ENV, echo=False,
                     replace=True)  # the benchmark's own scratch runs, rerun each time
        recs = [json.loads(s) for s in (run_dir / "metrics.jsonl").read_text().splitlines()]
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
        other = "exact" if name == "fast" else "fast"
        c = curves[name]
        ax.plot(*zip(*c["train"]), lw=0.6, alpha=0.6, label="train loss (each step)")
        ax.plot(*zip(*c["eval"]), "o-", label="eval loss")
        ax.plot(*zip(*curves[other]["eval"]), "x:", color="gray", label=f"eval loss, {other} mode")
        if c["floor"]:
            ax.axhline(c["floor"], color="k", ls="--", lw=0.8, label="loss floor")
        ax.set(title=f"{name} mode", xlabel="step")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("cross-entropy (nats/token)")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser():
    p = argparse.ArgumentParser(prog="hpcdp bench exact", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--models", default="mlp,gpt")
    p.add_argument("--steps-mlp", type=int, default=200)
    p.add_argument("--steps-gpt", type=int, default=40)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--curves", action="store_true", help="also the loss curves of fast vs exact (GPT)")
    p.add_argument("--curve-steps", type=int, default=600)
    p.add_argument("--png", default="docs/exact_vs_fast_loss.png")
    p.add_argument("--out", default="runs/bench-exact")
    p.add_argument("--json", default="", help="write the results here")
    p.add_argument("--timeout", type=float, default=3600.0)
    # the worker's arguments (set by the driver)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--top", type=int, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--contenders", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    meta = {"date": datetime.now().isoformat(timespec="seconds"), "cpu": platform.processor(),
            "load_before": os.getloadavg(), "env_cleared": list(CLEARED_ENV)}
    t0 = time.time()
    table = run_bench(args)
    meta["load_after"] = os.getloadavg()
    print(format_table(table))
    result = {"meta": meta, "table": table}
    if args.curves:
        curves = run_curves(args)
        plot_curves(curves, Path(args.png), f"GPT (jobs/gpt_small.toml, dropout 0.1, global batch "
                                            f"{CURVE_BATCH}), DDP on 2 ranks, {args.curve_steps} steps: "
                                            f"fast vs exact mode (micro-batches of {CURVE_BATCH // 2})")
        result["curves_final_eval"] = {k: v["eval"][-1] for k, v in curves.items()}
        print(f"wrote {args.png}")
    meta["wall_s"] = time.time() - t0
    print(f"load average before {meta['load_before']}, after {meta['load_after']}; {meta['wall_s']:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main", "contenders", "format_table"]
