"""``hpcdp bench step --ranks N``: the GPT step on N ranks, hpcdp's strategies beside
PyTorch's.

Contenders, per strategy (``--strategies``, default ``ddp,zero3``):

- ``ddp``: hpcdp's DDP (``mpiexec -n N``, the [parallel.ddp] and [comm] settings of
  ``--gpt-config``) against PyTorch's ``DistributedDataParallel`` (its defaults);
- ``zero3``: hpcdp's ZeRO stage 3 (``parallel.zero.stage = 3``) against PyTorch's FSDP2
  (``torch.distributed.fsdp.fully_shard`` on each block, then on the whole model).

Both sides train the same GPT (:func:`hpcdp.bench.step_time.torch_gpt_model` is the
one-rank contender's model, wrapped), in float32, with AdamW, one thread per rank,
each rank on its slice of the same global batch (``[train] global_batch`` / N). The
PyTorch side runs N processes of ``--torch-python`` (a venv with torch; torch is never
a dependency of hpcdp) on gloo over loopback (MASTER_ADDR=127.0.0.1).

Each contender is one job of ``--warmup`` untimed and ``--repeats`` timed steps; a
step's time is the slowest rank's; reported: the median and the interquartile range.
Rounds interleave the jobs (hpcdp DDP, PyTorch DDP, hpcdp ZeRO-3, PyTorch FSDP2, the
order reversed every other round), so load drift on a shared machine hits all alike;
each round's ratio hpcdp / PyTorch is printed. The children run with
``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` unset, as in the one-rank mode.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

from hpcdp.launch import find_mpiexec, package_root

STRATEGIES = ("ddp", "zero3")
HPCDP_SETS = {"ddp": ['parallel.strategy="ddp"'],
              "zero3": ['parallel.strategy="zero"', "parallel.zero.stage=3"]}
NAMES = {"ddp": ("hpcdp DDP", "PyTorch DDP"), "zero3": ("hpcdp ZeRO-3", "PyTorch FSDP2")}
JOB_TIMEOUT_S = 600


def parse_strategies(text: str) -> list[str]:
    names = [s.strip() for s in str(text).split(",") if s.strip()]
    bad = [s for s in names if s not in STRATEGIES]
    if bad or not names:
        raise ValueError(f"--strategies {text!r}: {', '.join(bad) or 'empty'}; choose from "
                         f"{', '.join(STRATEGIES)} (comma-separated)")
    return list(dict.fromkeys(names))


def per_rank_batch(global_batch: int, ranks: int) -> int:
    """Each rank's share of the GPT's global batch; a clear error when it does not divide."""
    if global_batch % ranks:
        raise ValueError(f"--ranks {ranks}: the global batch of {global_batch} samples does not split evenly "
                         f"over {ranks} ranks; choose a rank count that divides it (or set [train] "
                         f"global_batch in --gpt-config)")
    return global_batch // ranks


def rank_slice(x, y, rank: int, ranks: int):
    """(x, y) of rank ``rank``: its rows of the global batch (the one-rank mode's)."""
    b = per_rank_batch(len(x), ranks)
    return x[rank * b:(rank + 1) * b].copy(), y[rank * b:(rank + 1) * b].copy()


def _timed(step, warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times


def summary(per_rank: list[list[float]]) -> dict:
    """Per-rank step times -> the slowest rank's per step, their median and quartiles."""
    ts = [max(col) for col in zip(*per_rank)]
    q = statistics.quantiles(ts, n=4) if len(ts) > 1 else [ts[0]] * 3
    return {"median_s": statistics.median(ts), "q1_s": q[0], "q3_s": q[2], "min_s": min(ts),
            "repeats": len(ts)}


# -- the children -------------------------------------------------------------------------

def hpcdp_child(args, gpt: dict, x, y) -> None:
    """One rank of ``mpiexec -n N``: hpcdp's strategy on this rank's slice of (x, y), the
    GPT of sizes ``gpt``; rank 0 prints JSON."""
    from hpcdp.autograd import Tensor
    from hpcdp.comm import configure
    from hpcdp.config import load_config
    from hpcdp.nn import build_model
    from hpcdp.optim import AdamW
    from hpcdp.step import LocalBatch, train_step
    from hpcdp.strategies import build_strategy
    from hpcdp.world import World

    world = World.from_mpi()
    cfg = load_config(args.gpt_config, HPCDP_SETS[args.child_strategy])
    configure(cfg.comm)
    strategy = build_strategy(cfg.parallel, world, cfg.comm)
    model = build_model({"kind": "gpt", **gpt, "seed": 0}, dtype="float32", device="cpu", storage=())
    model.flat.materialize(strategy.full_storage)
    strategy.setup(model.flat, AdamW(lr=1e-3, weight_decay=0.01, dtype="float32"), world)
    x, y = rank_slice(x, y, world.rank, world.size)
    xt, yt = Tensor(x), Tensor(y)
    batch = LocalBatch([np.arange(len(x))], len(x) * world.size, filler=np.arange(1))
    times = _timed(lambda: train_step(model, strategy, batch, lambda _idx: (xt, yt)).loss,
                   args.warmup, args.repeats)
    gathered = world.comm.gather(times, root=0)
    strategy.close()
    if world.rank == 0:
        print(json.dumps({"times": summary(gathered), "params": model.flat.numel}), flush=True)


def torch_child(args, make_model, make_step, x, y) -> None:
    """One of N PyTorch processes (RANK, WORLD_SIZE, MASTER_ADDR/PORT set): DDP or FSDP2 of
    ``make_model(threads)``, stepped by ``make_step(model, x, y)`` on this rank's slice."""
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", module="torch")  # FSDP2's note on views, per step
    dist.init_process_group("gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    model = make_model(args.threads)
    params = sum(p.numel() for p in model.parameters())
    if args.child_strategy == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (ranks,))
        for block in model.h:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    x, y = rank_slice(x, y, rank, ranks)
    times = _timed(make_step(model, x, y), args.warmup, args.repeats)
    gathered = [None] * ranks
    dist.all_gather_object(gathered, times)
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"times": summary(gathered), "params": params, "torch": torch.__version__}), flush=True)
    # Measured and said: end here. At interpreter exit a thread PyTorch left behind (FSDP2
    # on gloo) can end the process through std::terminate ("terminate called without an
    # active exception", exit -6), which the parent would read as a failed contender.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- the parent ---------------------------------------------------------------------------

def _env(args) -> dict:
    env = dict(args.env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root(), env.get("PYTHONPATH")) if p)
    return env


def _child_args(args, side: str, strategy: str) -> list[str]:
    return ["-m", "hpcdp.bench.step_time", "--ranks-child", side, "--child-strategy", strategy,
            "--threads", str(args.threads),
            "--warmup", str(args.warmup), "--repeats", str(args.repeats),
            *(["--gpt-config", args.gpt_config] if args.gpt_config else [])]


def _last_json(text: str, what: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"bench step: {what} printed no result")


def run_hpcdp(args, strategy: str) -> dict:
    cmd = [find_mpiexec("hpcdp bench step"), "-n", str(args.ranks), sys.executable,
           *_child_args(args, "hpcdp", strategy)]
    proc = subprocess.run(cmd, env=_env(args), capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    if proc.returncode != 0:
        sys.stderr.write((proc.stdout + proc.stderr)[-4000:])
        raise RuntimeError(f"bench step: {NAMES[strategy][0]} failed (exit {proc.returncode}): {shlex.join(cmd)}")
    return _last_json(proc.stdout, NAMES[strategy][0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torch(args, strategy: str) -> dict:
    """N processes of ``--torch-python`` on gloo; any one failing stops the others."""
    base = {**_env(args), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
            "WORLD_SIZE": str(args.ranks)}
    cmd = [args.torch_python, *_child_args(args, "torch", strategy)]
    procs = [subprocess.Popen(cmd, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(args.ranks)]
    deadline = time.monotonic() + JOB_TIMEOUT_S
    outs = [None] * len(procs)
    failed = None
    while any(o is None for o in outs):
        for i, p in enumerate(procs):
            if outs[i] is None and p.poll() is not None:
                outs[i] = p.communicate()
                if p.returncode != 0 and failed is None:
                    failed = (i, p.returncode, outs[i][0] + outs[i][1])
        if failed or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for i, p in enumerate(procs):
        if outs[i] is None:
            p.kill()
            outs[i] = p.communicate()
    if failed or any(p.returncode != 0 for p in procs):
        i, rc, text = failed or (0, procs[0].returncode, "timed out")
        sys.stderr.write(text[-4000:])
        raise RuntimeError(f"bench step: {NAMES[strategy][1]} failed (rank {i}, exit {rc}): "
                           f"{shlex.join(cmd)} (gloo, {args.ranks} processes)")
    return _last_json(outs[0][0], NAMES[strategy][1])


def schedule(strategies, rounds: int, with_torch: bool) -> list[tuple[int, str, str]]:
    """(round, side, strategy) in run order: pairs adjacent, every other round reversed."""
    order = [(side, s) for s in strategies for side in (("hpcdp", "torch") if with_torch else ("hpcdp",))]
    return [(r, side, s) for r in range(rounds) for side, s in (order if r % 2 == 0 else order[::-1])]


def table(rows: list[dict]) -> str:
    lines = [f"{'strategy':<8} {'round':>5} {'contender':<14} {'median ms':>10} {'IQR ms':>15} {'/ PyTorch':>9}"]
    for row in rows:
        for side in ("hpcdp", "torch"):
            t = row.get(side)
            if t is None:
                continue
            name = NAMES[row["strategy"]][0 if side == "hpcdp" else 1]
            ratio = (f"{row['ratio']:.2f}x" if side == "hpcdp" and row.get("ratio") else "-")
            lines.append(f"{row['strategy']:<8} {row['round'] + 1:>5} {name:<14} {1e3 * t['median_s']:>10.2f} "
                         f"{1e3 * t['q1_s']:>7.2f}-{1e3 * t['q3_s']:<7.2f} {ratio:>9}")
    return "\n".join(lines)


def run(args) -> dict:
    """The parent: every (round, contender) job in turn; prints the table, returns the record."""
    per = per_rank_batch(args.global_batch, args.ranks)
    with_torch = bool(args.torch_python)
    results = {}
    for r, side, strategy in schedule(args.strategies, args.rounds, with_torch):
        print(f"  round {r + 1}: {NAMES[strategy][0 if side == 'hpcdp' else 1]} on {args.ranks} ranks", flush=True)
        out = run_hpcdp(args, strategy) if side == "hpcdp" else run_torch(args, strategy)
        results.setdefault((r, strategy), {"round": r, "strategy": strategy})[side] = out["times"]
        if side == "torch":
            results[(r, strategy)]["torch_version"] = out.get("torch")
        results[(r, strategy)][f"{side}_params"] = out["params"]
    rows = sorted(results.values(), key=lambda row: (STRATEGIES.index(row["strategy"]), row["round"]))
    for row in rows:
        if "torch" in row:
            row["ratio"] = row["hpcdp"]["median_s"] / row["torch"]["median_s"]
    g = args.gpt
    desc = (f"GPT vocab {g['vocab_size']}, block {g['block_size']}, {g['n_layer']} layers, {g['n_head']} heads, "
            f"{g['n_embd']} wide, {per} samples per rank, AdamW, {args.threads} thread(s) per rank")
    print(f"{args.ranks} ranks, {desc}; step = the slowest rank's, median of {args.repeats}")
    print(table(rows))
    if not with_torch:
        print("/ PyTorch \"-\": no --torch-python given (the python of a venv with torch), so PyTorch DDP / "
              "FSDP2 were not measured")
    return {"ranks": args.ranks, "threads": args.threads, "desc": desc, "rows": rows}
