"""ZeRO studies for ``hpcdp scale``: model-state memory per rank against the formulas,
and the step time of DDP and ZeRO stages 1-3 in one run.

``hpcdp scale --study memory --config jobs/gpt_ddp.toml --ranks 1,2,3,4``: for every
rank count N and every strategy (ddp, zero1, zero2, zero3) one ``mpiexec -n N hpcdp
train`` child job (a few steps), whose metrics.jsonl gives each rank's model state as
counted by the backend's tagged allocations (parameters, gradients, optimizer state),
the peak including the working buffers, and the peak RSS. Beside each measured figure:
the formula (:func:`hpcdp.memcheck.state_bytes`, the ownership rule for one group: with
fp32 and AdamW 16 Psi, 4 Psi + 4 Psi + 8 Psi / N, 4 Psi + 12 Psi / N, 16 Psi / N; with
``--set parallel.zero.shard='"node"'`` hybrid sharding, L = ranks per node in place of N).
Outputs: memory.json, memory.txt (the table), memory.png (model state per rank vs N,
measured points on the formula lines).

``hpcdp scale --study zero-step --config jobs/gpt_ddp.toml --ranks 2,4 --repeats 3``:
the four strategies at each rank count, interleaved round by round (load drift on a
shared machine hits all alike), each point keeping its fastest round; reported: the
median step time after ``--warmup``, its ratio to DDP at the same N, bytes sent per step,
the exposed reduce-scatter time and the time blocked on parameter all-gathers.
Outputs: zero_step.json, zero_step.txt.
Rank counts above the CPU count are marked oversubscribed.
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import time
from pathlib import Path

STRATEGIES = {
    "ddp": ['parallel.strategy="ddp"'],
    "zero1": ['parallel.strategy="zero"', "parallel.zero.stage=1"],
    "zero2": ['parallel.strategy="zero"', "parallel.zero.stage=2"],
    "zero3": ['parallel.strategy="zero"', "parallel.zero.stage=3"],
}
STAGE = {"ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}
MEM_KEYS = ("mem_params_bytes", "mem_grads_bytes", "mem_optim_bytes", "mem_persistent_bytes",
            "mem_working_peak_bytes", "mem_peak_bytes", "rss_peak_bytes")
MIB = float(1 << 20)


def _child(args, strategy: str, k: int, out: Path, ranks_per_node: int | None = None) -> dict:
    """One ``hpcdp train`` job through scale.run_point, with the strategy's overrides
    (and ``HPCDP_RANKS_PER_NODE`` for it when given: hybrid sharding's nodes)."""
    from hpcdp.comm.core.settings import RANKS_PER_NODE_ENV
    from hpcdp.scale import points as scale

    sub = copy.copy(args)
    sub.set = list(args.set or []) + STRATEGIES[strategy]
    batch = args.batch or _cfg(args).train.global_batch
    before = os.environ.get(RANKS_PER_NODE_ENV)
    if ranks_per_node is not None:
        os.environ[RANKS_PER_NODE_ENV] = str(ranks_per_node)
    try:
        point = scale.run_point(sub, k, batch, "bucketed", out / strategy)
    finally:
        if before is None:
            os.environ.pop(RANKS_PER_NODE_ENV, None)
        else:
            os.environ[RANKS_PER_NODE_ENV] = before
    rows = [json.loads(x) for x in (out / strategy / f"bucketed-n{k}-b{batch}" / "metrics.jsonl")
            .read_text().splitlines()]
    steps = [r for r in rows if "step" in r]
    last = steps[-1]["ranks"]  # the last step always lists every rank (hpcdp.metrics)
    point.update(strategy=strategy, **{key: last[key] for key in MEM_KEYS})
    from hpcdp.metrics import rank_values
    waits = [w for w in (rank_values(r, "gather_wait_s", "mean") for r in steps[args.warmup:]) if w is not None]
    point["gather_wait_s"] = statistics.median(waits) if waits else 0.0
    return point


def _with_sets(args, sets: list):
    sub = copy.copy(args)
    sub.set = list(args.set or []) + sets
    return sub


def _cfg(args):
    from hpcdp.config import load_config
    return load_config(args.config, args.set or [], shared_options=True)


def shard_ranks(cfg, strategy: str, k: int) -> int:
    """Ranks the state is sharded over at ``k`` ranks: all of them, or with
    ``--set parallel.zero.shard='"node"'`` (hybrid sharding) one node's: L =
    HPCDP_RANKS_PER_NODE, else all ``k`` (the children run on this one machine); a
    ``k`` that L does not divide (the one-rank baseline) runs on nodes of gcd(L, k)."""
    if STAGE[strategy] == 0 or getattr(cfg.parallel.sub("zero"), "shard", "world") != "node":
        return k
    import math

    from hpcdp.comm.core.settings import settings
    return math.gcd(settings().ranks_per_node or k, k)


def _oversubscribed(k: int) -> bool:
    return k > (os.cpu_count() or 1)


def memory_study(args, ranks: list[int]) -> dict:
    import numpy as np

    from hpcdp.memcheck import optim_slots, state_bytes
    from hpcdp.nn import build_model

    cfg = _cfg(args)
    psi = build_model(cfg.model, dtype=cfg.run.dtype, storage=()).flat.numel
    itemsize, slots = np.dtype(cfg.run.dtype).itemsize, optim_slots(cfg.optim)
    out = _out_dir(args, "memory")
    points = []
    for k in ranks:
        for strategy in STRATEGIES:
            L = shard_ranks(cfg, strategy, k)
            hybrid = STAGE[strategy] and getattr(cfg.parallel.sub("zero"), "shard", "world") == "node"
            p = _child(args, strategy, k, out, ranks_per_node=L if hybrid else None)
            p["formula_bytes"] = [state_bytes(STAGE[strategy], [(0, psi)], L, r % L, itemsize, slots)["total"]
                                  for r in range(k)]
            p["shard_ranks"] = L
            points.append(p)
            print(f"  {strategy:<6} n={k}: model state {np.mean(p['mem_persistent_bytes']) / MIB:8.2f} MiB "
                  f"per rank (formula {np.mean(p['formula_bytes']) / MIB:8.2f}), peak "
                  f"{np.mean(p['mem_peak_bytes']) / MIB:8.2f} MiB", flush=True)
    result = {"study": "memory", "config": str(args.config), "params": psi, "dtype": cfg.run.dtype,
              "optimizer": cfg.optim.kind, "ranks": ranks, "points": points, "cpus": os.cpu_count(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg": os.getloadavg()}
    (out / "memory.json").write_text(json.dumps(result, indent=1))
    table = memory_table(result)
    (out / "memory.txt").write_text(table + "\n")
    print(table)
    _plot_memory(result, out / "memory.png")
    print(f"  wrote {out}")
    return result


def memory_table(result: dict) -> str:
    """Per strategy and N: rank-mean model state measured vs formula, the worst rank's
    deviation, peak with working buffers, peak RSS (MiB)."""
    import numpy as np

    lines = [f"{'strategy':<8} {'ranks':>5} {'state MiB':>10} {'formula':>9} {'max dev':>8} "
             f"{'peak MiB':>9} {'working':>8} {'RSS MiB':>8}"]
    for p in result["points"]:
        meas, form = np.array(p["mem_persistent_bytes"]), np.array(p["formula_bytes"], dtype=float)
        dev = np.max(np.abs(meas - form) / form)
        lines.append(f"{p['strategy']:<8} {p['ranks']:>5} {meas.mean() / MIB:>10.3f} {form.mean() / MIB:>9.3f} "
                     f"{100 * dev:>7.2f}% {np.mean(p['mem_peak_bytes']) / MIB:>9.3f} "
                     f"{np.mean(p['mem_working_peak_bytes']) / MIB:>8.3f} "
                     f"{np.mean(p['rss_peak_bytes']) / MIB:>8.1f}"
                     + ("  (oversubscribed)" if _oversubscribed(p["ranks"]) else "")
                     + (f"  (sharded over {p['shard_ranks']} ranks per node)"
                        if p.get("shard_ranks", p["ranks"]) != p["ranks"] else "")
                     + (f"  predicted {1e3 * p['pred_step_s']:.2f} ms ({p['pred_error']:+.1%})"
                        if "pred_step_s" in p else ""))
    return "\n".join(lines)


def _plot_memory(result: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("  (matplotlib missing: no PNG; pip install 'hpcdp[plot]')")
        return
    import numpy as np

    fig, ax = plt.subplots(figsize=(8.5, 4.6))
    # the strategies side by side around each N (at N = 1 they hold the same state)
    shift = {st: 0.07 * (i - (len(STRATEGIES) - 1) / 2) for i, st in enumerate(STRATEGIES)}
    for strategy, color in zip(STRATEGIES, ("C0", "C1", "C2", "C3")):
        pts = [p for p in result["points"] if p["strategy"] == strategy]
        ks = [p["ranks"] + shift[strategy] for p in pts]
        ax.plot(ks, [np.mean(p["formula_bytes"]) / MIB for p in pts], "-", color=color, alpha=0.6,
                label=f"{strategy} formula")
        ax.plot(ks, [np.mean(p["mem_persistent_bytes"]) / MIB for p in pts], "o", color=color,
                label=f"{strategy} measured")
        ax.plot(ks, [np.mean(p["mem_peak_bytes"]) / MIB for p in pts], "x", color=color, ms=8,
                label=f"{strategy} peak (with working buffers)")
    ax.set_xlabel("ranks N (strategies drawn side by side)")
    ax.set_ylabel("MiB per rank (rank mean)")
    ax.set_title(f"{result['config']}: model state per rank, {result['params']:,} parameters, {result['dtype']}, "
                 f"{result['optimizer']}", fontsize=9)
    ax.set_xticks(sorted({p["ranks"] for p in result["points"]}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def strategies_for(algorithms: str) -> dict:
    """``{name: (strategy, algorithm)}``: DDP, and stages 1-3 once per
    ``parallel.zero.algorithm`` (``--zero-algorithms``); "ring" keeps the plain names
    (zero1..3), others are zeroK-<algorithm>."""
    from hpcdp.config_parallel import ZeroAlgorithm, literal_values

    out = {"ddp": ("ddp", None)}
    for algo in [a.strip() for a in algorithms.split(",") if a.strip()]:
        if algo not in literal_values(ZeroAlgorithm):
            raise SystemExit(f"hpcdp scale: --zero-algorithms: {algo!r}; choose from "
                             f"{', '.join(literal_values(ZeroAlgorithm))}")
        for stage in (1, 2, 3):
            out[f"zero{stage}" + ("" if algo == "ring" else f"-{algo}")] = (f"zero{stage}", algo)
    return out


def _child_with(args, name: str, strategy: str, algorithm, k: int, out: Path) -> dict:
    """:func:`_child` with ``parallel.zero.algorithm`` set (and the point named ``name``)."""
    sub = copy.copy(args)
    if algorithm is not None:
        sub.set = list(args.set or []) + [f'parallel.zero.algorithm="{algorithm}"']
    p = _child(sub, strategy, k, out / name if name != strategy else out)
    p["strategy"] = name
    return p


def step_study(args, ranks: list[int]) -> dict:
    out = _out_dir(args, "zero-step")
    best: dict = {}
    table = strategies_for(getattr(args, "zero_algorithms", "ring") or "ring")
    for rnd in range(max(args.repeats, 1)):
        for k in ranks:
            for strategy in table:
                p = _child_with(args, strategy, *table[strategy], k, out)
                key = (strategy, k)
                if key not in best or p["step_time_s"] < best[key]["step_time_s"]:
                    best[key] = p
                print(f"  round {rnd + 1} {strategy:<6} n={k}: {1e3 * p['step_time_s']:8.2f} ms/step",
                      flush=True)
    points = [best[(s, k)] for k in ranks for s in table]
    for p in points:
        p["vs_ddp"] = p["step_time_s"] / best[("ddp", p["ranks"])]["step_time_s"]
    profile = getattr(args, "profile", None)
    if profile:
        predict_steps(args, points, table, profile)
    result = {"study": "zero-step", "config": str(args.config), "ranks": ranks, "repeats": args.repeats,
              "steps": args.steps, "warmup": args.warmup, "points": points, "cpus": os.cpu_count(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "loadavg": os.getloadavg()}
    (out / "zero_step.json").write_text(json.dumps(result, indent=1))
    lines = [f"{'strategy':<8} {'ranks':>5} {'step ms':>9} {'/ ddp':>6} {'sent kB/step':>13} "
             f"{'exposed ms':>11} {'gather wait ms':>15}"]
    for p in points:
        lines.append(f"{p['strategy']:<8} {p['ranks']:>5} {1e3 * p['step_time_s']:>9.2f} {p['vs_ddp']:>6.2f} "
                     f"{p['bytes_sent'] / 1e3:>13.1f} {1e3 * p['comm_exposed_s']:>11.2f} "
                     f"{1e3 * p['gather_wait_s']:>15.2f}"
                     + ("  (oversubscribed)" if _oversubscribed(p["ranks"]) else "")
                     + (f"  (sharded over {p['shard_ranks']} ranks per node)"
                        if p.get("shard_ranks", p["ranks"]) != p["ranks"] else "")
                     + (f"  predicted {1e3 * p['pred_step_s']:.2f} ms ({p['pred_error']:+.1%})"
                        if "pred_step_s" in p else ""))
    table = "\n".join(lines)
    (out / "zero_step.txt").write_text(table + "\n")
    print(table)
    print(f"  wrote {out}")
    return result


def predict_steps(args, points: list, table: dict, profile) -> None:
    """With ``--profile``: each point's step as the cost model predicts it (the strategy
    and its ``parallel.zero.algorithm``, the same config and per-rank batch; nodes of
    ``--ranks-per-node`` ranks, else one node), and ``pred_error`` = measured /
    predicted - 1."""
    from hpcdp.comm.model.cost import load_profile
    from hpcdp.scale import model as M

    prof = load_profile(profile)
    cfg = _cfg(args)
    batch = args.batch or cfg.train.global_batch
    wls = {"ddp": M.workload_from_config(cfg),  # ZeRO's groups: parallel.zero.bucket_mb
           "zero": M.workload_from_config(_cfg(_with_sets(args, [
               f"parallel.ddp.bucket_mb={cfg.parallel.sub('zero').bucket_mb}"])))}
    for p in points:
        strategy, algorithm = table[p["strategy"]]
        if strategy == "ddp":  # the config's allreduce (MPI's own is not priced: the ring)
            algorithm = getattr(_cfg(args).parallel.sub("ddp"), "algorithm", "ring")
            algorithm = algorithm if algorithm in ("ring", "recursive", "hierarchical", "auto") else "ring"
        k = p["ranks"]
        per_node = min(k, getattr(args, "ranks_per_node", None) or k)
        wl = wls["ddp" if strategy == "ddp" else "zero"]
        if strategy != "ddp" and getattr(cfg.parallel.sub("zero"), "shard", "world") == "node":
            strategy = "hybrid" + strategy[-1]  # sharded in the node, replicated across nodes
        st = M.step(prof, wl, strategy, k, batch / k, algorithm=algorithm or "ring", per_node=per_node)
        p["pred_strategy"] = strategy
        p["pred_step_s"] = st.step_s
        p["pred_error"] = p["step_time_s"] / st.step_s - 1.0


def _out_dir(args, name: str) -> Path:
    out = Path(args.out or f"runs/{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_from_scale(args, ranks: list[int]) -> dict:
    """``hpcdp scale --study memory|zero-step`` (the hookup in hpcdp/scale/study.py)."""
    if args.steps <= args.warmup:
        raise SystemExit(f"hpcdp scale: --steps {args.steps} must exceed --warmup {args.warmup}")
    return memory_study(args, ranks) if args.study == "memory" else step_study(args, ranks)


__all__ = ["memory_study", "step_study", "memory_table", "run_from_scale", "STRATEGIES"]
