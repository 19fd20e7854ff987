"""Parameter-server studies: staleness under a straggler, and bytes on the busiest link.

``staleness``: for each bound k in 0, 1, 2, 4, none, one ``mpiexec`` job trains the
digits MLP with the asynchronous PS while, every step, one worker (a seeded random
choice, the same on every rank) sleeps ``--delay`` seconds: a rotating straggler.
Each worker records its share of the loss and the wall time at the end of every
step; the global loss of step t is the sum of the shares (each computed from the
weights that worker had), and step t's wall time is the latest worker's. Nothing is
gathered per step (a per-step collective would re-synchronise the workers). Output:
``staleness.csv`` (k, step, loss, wall_s), ``staleness.png`` (loss against step and
against wall time), and per k the final test accuracy, the mean training loss of the
last 10 steps and the staleness (mean and max over every worker's steps) in
``staleness_summary.json``.

``bytes``: one ``mpiexec`` job trains a few steps with one-server PS, K-server PS
(colocated) and DDP's ring allreduce, and reads every rank's ledger. The busiest
link is the rank that sends + receives the most bytes per step; the analytic model
is the largest per-rank total by the exact formulas of ``hpcdp.comm.model.volume``; with
Phi = model bytes and N ranks, all workers, it is about:

- PS, one colocated server: the server moves 2 (N-1) Phi;
- PS, K colocated servers: a server moves 2 (N-1) Phi / K for its shard plus
  2 (K-1)/K Phi as a worker of the other servers;
- ring allreduce: every rank moves 2 * 2 (N-1)/N Phi (sends and receives 2(N-1)/N Phi).

Run: ``hpcdp scale --study staleness`` / ``--study ps-bytes`` or
``python -m hpcdp.scale.ps_study staleness|bytes [--ranks N] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

KS = ["0", "1", "2", "4", "none"]
STUDY_CONFIG = "digits_ps_async.toml"  # shipped (hpcdp.jobs); jobs/digits_ps_async.toml


def _launch(n: int, args: list[str], timeout: float) -> None:
    from hpcdp.launch import hpcdp_command, mpiexec_command, run_child

    cmd = mpiexec_command(n, "hpcdp scale --study") + hpcdp_command("hpcdp.scale.ps_study") + list(args)
    run_child(cmd, "hpcdp scale --study (parameter server)", timeout)


# ---------------------------------------------------------------------------
# child jobs (run under mpiexec)

def _load(config: str, overrides: list[str]):
    from hpcdp.config import load_config
    from hpcdp.data import load_dataset
    from hpcdp.nn import build_model
    from hpcdp.optim import build_optimizer
    from hpcdp.train import task_of

    cfg = load_config(config, overrides, shared_options=True)
    ds = load_dataset(cfg.data, task_of(cfg.model), cfg.run.dtype)
    model = build_model(cfg.model, dtype=cfg.run.dtype, device="cpu")
    opt = build_optimizer(cfg.optim, layout=model.flat.layout, dtype=cfg.run.dtype)  # decay groups as in training
    return cfg, ds, model, opt


def child_staleness(args) -> None:
    """One k: train with a rotating straggler, write per-step loss and time."""
    from mpi4py import MPI

    from hpcdp.autograd import Tensor
    from hpcdp.backend import get_backend
    from hpcdp.data.sampler import GlobalSampler
    from hpcdp.step import LocalBatch, train_step
    from hpcdp.strategies import build_strategy
    from hpcdp.world import World

    over = [f"parallel.ps.staleness={args.k}", "parallel.ps.mode=\"async\"", *args.set]
    cfg, ds, model, opt = _load(args.config, over)
    world = World.from_mpi()
    strategy = build_strategy(cfg.parallel, world, cfg.comm)
    strategy.setup(model.flat, opt, world)
    if not strategy.is_worker:
        raise SystemExit("ps_study staleness runs colocated servers (every rank a worker)")
    be = get_backend("cpu")
    sampler = GlobalSampler(ds.n_train, cfg.train.global_batch, cfg.data.seed, "drop")
    steps = args.steps
    rng = np.random.default_rng(1234)  # same straggler schedule on every rank
    slow = rng.integers(0, strategy.dp_size, steps)
    loss_part = np.zeros(steps)
    t_end = np.zeros(steps)
    fetch = _fetcher(ds, be)
    world.comm.Barrier()
    t0 = time.perf_counter()
    for step in range(steps):
        local, gn = sampler.local_indices(step, strategy.dp_size, strategy.dp_rank)
        batch = LocalBatch([local], gn, sampler.global_indices(step)[:1])
        straggle = (lambda m: time.sleep(args.delay)) if slow[step] == strategy.dp_rank else None
        loss_part[step] = train_step(model, strategy, batch, fetch, after_backward=straggle).loss
        t_end[step] = time.perf_counter() - t0
    strategy.close()  # async: the final weights (every update applied)
    t_close = time.perf_counter() - t0
    loss_sum = np.zeros(steps)
    t_max = np.zeros(steps)
    world.comm.Reduce(loss_part, loss_sum, op=MPI.SUM, root=0)
    world.comm.Reduce(t_end, t_max, op=MPI.MAX, root=0)
    close_max = np.zeros(1)
    world.comm.Reduce(np.array([t_close]), close_max, op=MPI.MAX, root=0)  # no pickle
    close_max = float(close_max[0])
    # every applied gradient's staleness t - v, as the workers recorded them
    stale = np.array(strategy.worker.pushed_staleness, dtype=np.float64)
    stale_all = np.empty((world.size, steps)) if world.rank == 0 else None
    world.comm.Gather(stale, stale_all, root=0)
    if world.rank == 0:
        with no_grad_ctx():
            logits = model(Tensor(ds.x_test, backend=be)).numpy()
        acc = float((logits.argmax(axis=1) == ds.y_test).mean())
        out = Path(args.out)
        with open(out / f"staleness_k{args.k}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["k", "step", "loss", "wall_s"])
            for t in range(steps):
                w.writerow([args.k, t + 1, f"{loss_sum[t]:.6f}", f"{t_max[t]:.6f}"])
        (out / f"staleness_k{args.k}.json").write_text(json.dumps(
            {"k": args.k, "test_accuracy": acc, "wall_s": close_max, "steps": steps,
             "ranks": world.size, "delay_s": args.delay,
             "stale_lr": strategy.cfg.stale_lr, "loss_last10": float(loss_sum[-10:].mean()),
             "staleness_mean": float(stale_all.mean()), "staleness_max": int(stale_all.max()),
             "staleness_mean_per_rank": [float(x) for x in stale_all.mean(axis=1)]}))


def _fetcher(ds, be):
    from hpcdp.autograd import Tensor

    def fetch(idx):
        return Tensor(ds.x_train[idx], backend=be), Tensor(ds.y_train[idx], backend=be)
    return fetch


def no_grad_ctx():
    from hpcdp.autograd import no_grad
    return no_grad()


def child_bytes(args) -> None:
    """Every layout in one job: bytes per step on every rank, from the ledger, beside
    the exact formula of hpcdp.comm.model.volume for that rank."""
    from hpcdp.backend import get_backend
    from hpcdp.shard import shard_range
    from hpcdp.step import LocalBatch, train_step
    from hpcdp.strategies import build_strategy
    from hpcdp.world import World

    world = World.from_mpi()
    n = world.size
    be = get_backend("cpu")
    layouts = [("ps-1", ["parallel.strategy=\"ps\"", "parallel.ps.servers=1"]),
               (f"ps-{n}", ["parallel.strategy=\"ps\"", f"parallel.ps.servers={n}"]),
               ("ring", ["parallel.strategy=\"ddp\""])]
    if n >= 3:
        layouts.insert(1, ("ps-2", ["parallel.strategy=\"ps\"", "parallel.ps.servers=2"]))
    rows = []
    for name, over in layouts:
        cfg, ds, model, opt = _load(args.config, [*over, *args.set])
        strategy = build_strategy(cfg.parallel, world, cfg.comm)
        strategy.setup(model.flat, opt, world)
        fetch = _fetcher(ds, be)
        snap = world.ledger.snapshot()
        gb = cfg.train.global_batch
        for step in range(args.steps):
            off, size = shard_range(gb, strategy.dp_size, strategy.dp_rank)
            idx = np.arange(off, off + size) + step * gb
            train_step(model, strategy, LocalBatch([idx], gb, np.arange(1) + step * gb), fetch)
        strategy.close()
        delta = world.ledger.delta(snap)
        mine = np.array([sum(d["sent_bytes"] for d in delta.values()) / args.steps,
                         sum(d["recv_bytes"] for d in delta.values()) / args.steps,
                         sum(_model_bytes(name, strategy, model.flat, world.rank, n, cfg.run.dtype))])
        per_rank = np.empty((n, 3)) if world.rank == 0 else None
        world.comm.Gather(mine, per_rank, root=0)  # plain numbers, no pickle
        if world.rank == 0:
            phi = model.flat.numel * np.dtype(cfg.run.dtype).itemsize
            busiest = max(range(n), key=lambda r: per_rank[r, 0] + per_rank[r, 1])
            rows.append({"layout": name, "ranks": n, "phi_bytes": phi,
                         "busiest_rank": busiest, "busiest_sent": per_rank[busiest, 0],
                         "busiest_recv": per_rank[busiest, 1],
                         "busiest_total": per_rank[busiest, 0] + per_rank[busiest, 1],
                         "model_total": float(per_rank[:, 2].max()),
                         "per_rank_total": [float(p[0] + p[1]) for p in per_rank]})
    if world.rank == 0:
        (Path(args.out) / "ps_bytes.json").write_text(json.dumps(rows, indent=1))


def _model_bytes(layout, strategy, flat, rank, n, dtype) -> tuple[int, int]:
    """(sent, received) bytes per step of ``rank`` by the formulas of hpcdp.comm.model.volume."""
    from hpcdp.comm.model.volume import expected_step_bytes, ps_pull_bytes, ps_push_bytes

    itemsize = np.dtype(dtype).itemsize
    if layout == "ring":
        return expected_step_bytes(strategy.plan, n, rank, itemsize)
    servers, workers = strategy.roles.servers, strategy.roles.workers
    push = ps_push_bytes(flat.numel, rank, servers, workers, itemsize)
    pull = ps_pull_bytes(flat.numel, rank, servers, workers, itemsize)
    return push[0] + pull[0], push[1] + pull[1]


# ---------------------------------------------------------------------------
# parent: launch, merge, plot

def study_staleness(out: Path, ranks: int, steps: int, delay: float, config: str, sets, timeout) -> dict:
    summary = {}
    for k in KS:
        print(f"  staleness k={k}: {ranks} ranks, {steps} steps, straggler delay {delay * 1e3:g} ms", flush=True)
        _launch(ranks, ["_staleness", "--k", k, "--out", str(out), "--steps", str(steps),
                        "--delay", str(delay), "--config", config, *sum((["--set", s] for s in sets), [])],
                timeout)
        summary[k] = json.loads((out / f"staleness_k{k}.json").read_text())
    rows = []
    for k in KS:
        with open(out / f"staleness_k{k}.csv") as f:
            rows += list(csv.DictReader(f))
    with open(out / "staleness.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["k", "step", "loss", "wall_s"])
        w.writeheader()
        w.writerows(rows)
    _plot_staleness(rows, summary, out / "staleness.png")
    (out / "staleness_summary.json").write_text(json.dumps(summary, indent=1))
    for k, s in summary.items():
        print(f"  k={k:>4}: wall {s['wall_s']:.2f} s, test accuracy {s['test_accuracy']:.4f}, "
              f"loss (last 10 steps) {s['loss_last10']:.3f}, staleness mean {s['staleness_mean']:.1f} "
              f"max {s['staleness_max']} (stale_lr {s['stale_lr']})")
    return summary


STALENESS_TITLE = ("async PS with a rotating straggler: loss vs step and vs wall time\n"
                   "k = staleness bound: a worker may start step t once the updates of steps <= t - k - 1 "
                   "are applied (0: synchronous; none: unbounded)")


def _plot_staleness(rows, summary, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  (matplotlib missing: no PNG; pip install 'hpcdp[plot]')")
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for k in KS:
        pts = [r for r in rows if r["k"] == k]
        step = [int(r["step"]) for r in pts]
        loss = np.array([float(r["loss"]) for r in pts])
        smooth = np.convolve(loss, np.ones(10) / 10, mode="valid")  # 10-step running mean
        wall = [float(r["wall_s"]) for r in pts]
        label = f"k = {k} (test accuracy {summary[k]['test_accuracy']:.3f})"
        axes[0].plot(step[9:], smooth, label=label)
        axes[1].plot(wall[9:], smooth, label=label)
    for ax, xl in zip(axes, ("step", "wall time (s)")):
        ax.set_xlabel(xl)
        ax.set_ylabel("training loss (10-step mean)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].legend(title="staleness bound k")
    fig.suptitle(STALENESS_TITLE, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Title": STALENESS_TITLE})


def study_bytes(out: Path, ranks: int, steps: int, config: str, sets, timeout) -> list:
    print(f"  bytes: PS 1 server, PS K servers, ring allreduce on {ranks} ranks", flush=True)
    _launch(ranks, ["_bytes", "--out", str(out), "--steps", str(steps), "--config", config,
                    *sum((["--set", s] for s in sets), [])], timeout)
    rows = json.loads((out / "ps_bytes.json").read_text())
    with open(out / "ps_bytes.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["layout", "ranks", "phi_bytes", "busiest_rank", "busiest_sent", "busiest_recv",
                    "busiest_total", "model_total"])
        for r in rows:
            w.writerow([r[c] for c in ("layout", "ranks", "phi_bytes", "busiest_rank", "busiest_sent",
                                       "busiest_recv", "busiest_total", "model_total")])
    for r in rows:
        print(f"  {r['layout']:<6} busiest rank {r['busiest_rank']}: {r['busiest_total'] / 1e3:9.1f} kB/step "
              f"(model {r['model_total'] / 1e3:9.1f} kB)")
    _plot_bytes(rows, out / "ps_bytes.png")
    return rows


def _plot_bytes(rows, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["busiest_total"] / r["phi_bytes"] for r in rows], 0.4, label="measured (ledger)")
    ax.bar(x + 0.2, [r["model_total"] / r["phi_bytes"] for r in rows], 0.4, label="analytic model")
    ax.set_xticks(x, [r["layout"] for r in rows])
    ax.set_ylabel("bytes per step on the busiest rank / model bytes")
    ax.set_title(f"busiest link, {rows[0]['ranks']} ranks")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_parser(p=None):
    p = p or argparse.ArgumentParser(prog="python -m hpcdp.scale.ps_study")
    p.add_argument("study", choices=["staleness", "bytes", "_staleness", "_bytes"])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=0, help="default: 300 (staleness), 3 (bytes)")
    p.add_argument("--delay", type=float, default=0.005, help="straggler sleep per step (s)")
    p.add_argument("--config", default="")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--k", default="0")
    p.add_argument("--out", default="")
    p.add_argument("--timeout", type=float, default=900.0)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not args.config:  # the example config, shipped with hpcdp
        from hpcdp.jobs import config_path
        args.config = str(config_path(STUDY_CONFIG))
    if args.study == "_staleness":
        child_staleness(args)
        return 0
    if args.study == "_bytes":
        child_bytes(args)
        return 0
    out = Path(args.out or f"runs/ps-{args.study}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    if args.study == "staleness":
        study_staleness(out, args.ranks, args.steps or 300, args.delay, args.config, args.set, args.timeout)
    else:
        study_bytes(out, args.ranks, args.steps or 3, args.config, args.set, args.timeout)
    print(f"  wrote {out}")
    return 0



def run_from_scale(args, ranks: int) -> dict:
    """``hpcdp scale --study staleness|ps-bytes --config FILE --ranks N --steps S``."""
    out = Path(args.out or f"runs/ps-{args.study}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    sets = list(args.set or [])
    if args.study == "staleness":
        res = {"staleness": study_staleness(out, ranks, args.steps, 0.005, args.config, sets, args.timeout)}
    else:
        res = {"ps_bytes": study_bytes(out, ranks, min(args.steps, 5), args.config, sets, args.timeout)}
    print(f"  wrote {out}")
    return res


if __name__ == "__main__":
    sys.exit(main())
