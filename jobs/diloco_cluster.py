"""DDP against DiLoCo (plain, int8, streaming) on the emulated cluster's rate-limited link:
step time, compute utilisation, bytes across the sites (ledger and veth) and the peak
link rate. Run from the repository root, as root, with the venv on PATH, a cluster of
2 nodes x 2 ranks up under your HPCDP_CLUSTER_PREFIX
(``bash tests/cluster/cluster.sh up --nodes 2 --ppn 2``) and the corpus of
jobs/gpt_diloco.toml made (its comment says how)::

    python jobs/diloco_cluster.py --data pystd-bpe1024.h5 --rates 100mbit,10mbit \\
        --contenders ddp:60,diloco:300,diloco-int8:300,streaming:300 --out runs/diloco-cluster

``--contenders``: ``name:steps`` pairs, run in this order at every rate (interleaved:
rate by rate, every contender once per round, ``--repeats`` rounds). Names:
``ddp`` (parallel.strategy = "ddp", the flat ring over 4 ranks), ``diloco`` (H = 100,
float32), ``diloco-int8``, ``diloco-bf16``, ``streaming`` (P = 3 fragments, the GPT's 3 units, H = 99,
overlap 1, mixing 0.5, float32), ``streaming-int8``, ``streaming2``, ``streaming4``,
``streaming5`` (P = 2, 4, 5 at H = 100; 4 and 5 need more units: ``--set model.n_layer=4``).

Per run (metrics.jsonl of the job, steps after ``--warmup``): the mean step time (DiLoCo's
syncs included: the runs cover whole periods of H), each rank's compute utilisation
``1 - (comm_exposed_s + outer_exposed_s) / step_time_s`` summed over the steps, the bytes
that crossed between the sites per step (the ledger's: DDP's ring = what ranks 1 and 3
send, whose ring successors are on the other node; DiLoCo = every rank's outer bytes;
and both nodes' veth counters, start-up and the final evaluation included), and the
peak link rate: node 0's veth (rx + tx) sampled every 20 ms, the largest bytes in any
window of ``--window`` seconds (default: the run's median step time) over the window, counted
between rank 0's first step line and the one before its last (no start-up, no final
synchronisation: the launcher may forward the last line late).
Writes ``OUT/cluster.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = {
    "ddp": ['parallel.strategy="ddp"'],
    "diloco": [],
    "diloco-int8": ['parallel.diloco.outer_dtype="int8"'],
    "diloco-bf16": ['parallel.diloco.outer_dtype="bfloat16"'],
    # the GPT has 3 units (2 blocks and the root): 3 fragments, H = 99 (a multiple of 3)
    "streaming": ["parallel.diloco.sync_every=99", "parallel.diloco.fragments=3", "parallel.diloco.overlap=1",
                  "parallel.diloco.mixing=0.5"],
    "streaming2": ["parallel.diloco.fragments=2", "parallel.diloco.overlap=1", "parallel.diloco.mixing=0.5"],
    "streaming4": ["parallel.diloco.fragments=4", "parallel.diloco.overlap=1", "parallel.diloco.mixing=0.5"],
    "streaming5": ["parallel.diloco.fragments=5", "parallel.diloco.overlap=1", "parallel.diloco.mixing=0.5"],
    "streaming-int8": ["parallel.diloco.sync_every=99", "parallel.diloco.fragments=3", "parallel.diloco.overlap=1",
                       "parallel.diloco.mixing=0.5", 'parallel.diloco.outer_dtype="int8"'],
}


def veth(prefix: str, node: int) -> int:
    d = Path(f"/sys/class/net/{prefix}v{node}/statistics")
    return int((d / "rx_bytes").read_text()) + int((d / "tx_bytes").read_text())


class Sampler(threading.Thread):
    """Node 0's veth byte counter every ``dt`` seconds."""

    def __init__(self, prefix: str, dt: float = 0.02):
        super().__init__(daemon=True)
        self.prefix, self.dt, self.stop, self.samples = prefix, dt, threading.Event(), []

    def run(self):
        while not self.stop.is_set():
            self.samples.append((time.monotonic(), veth(self.prefix, 0)))
            time.sleep(self.dt)


def peak_rate(samples, window: float) -> float:
    """Largest bytes in any window of ``window`` seconds, per second."""
    best, j = 0.0, 0
    for i in range(len(samples)):
        while samples[i][0] - samples[j][0] > window:
            j += 1
        best = max(best, samples[i][1] - samples[j][1])
    return best / window


def run(name: str, steps: int, rate: str, args, rnd: int) -> dict:
    prefix = os.environ.get("HPCDP_CLUSTER_PREFIX", "hpcdpn")
    out = Path(args.out) / f"{rate}-{name}-{rnd}"
    if out.exists():
        shutil.rmtree(out)
    cmd = [str(ROOT / "tests/cluster/mpiexec"), "-n", "4", sys.executable, "-m", "hpcdp.cli", "train",
           "--config", str(ROOT / "jobs/gpt_diloco.toml"), "--set", f'data.path="{Path(args.data).resolve()}"',
           "--set", f"train.steps={steps}", "--set", "run.log_every=50", "--set", "run.eval_every=0",
           "--set", "sample.length=0", "--set", f'run.out_dir="{out}"']
    for s in SETS[name] + (args.set or []):
        cmd += ["--set", s]
    before = [veth(prefix, 0), veth(prefix, 1)]
    sampler = Sampler(prefix)
    sampler.start()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []  # (monotonic time, line): the training steps' span is between rank 0's first and last step line
    for line in proc.stdout:
        lines.append((time.monotonic(), line))
    rc = proc.wait(timeout=args.timeout)
    wall = time.monotonic() - t0
    sampler.stop.set()
    sampler.join()
    if rc:
        raise SystemExit(f"{name} at {rate}: exit {rc}\n{''.join(x for _, x in lines)[-3000:]}")
    steps_at = [t for t, x in lines if x.startswith("step ")]
    # from the first step line to the one before the last: the launcher forwards lines with a
    # delay, so the last one may arrive after the final synchronisation has run
    span = (steps_at[0], steps_at[-2]) if len(steps_at) >= 3 else (t0, t0 + wall)
    after = [veth(prefix, 0), veth(prefix, 1)]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step" in r and "ranks" in r]
    body = rows[args.warmup:]
    rk = lambda r, k: r["ranks"].get(k, [0.0] * 4)  # noqa: E731
    step_s = statistics.mean(r["step_time_s"] for r in body)
    util = []
    for k in range(4):
        t = sum(rk(r, "step_time_s")[k] for r in body)
        e = sum(rk(r, "comm_exposed_s")[k] + rk(r, "outer_exposed_s")[k] for r in body)
        util.append(1.0 - e / t)
    if name == "ddp":
        ledger = sum(rk(r, "bytes_sent")[1] + rk(r, "bytes_sent")[3] for r in rows)  # the crossing ranks
    else:
        ledger = sum(sum(rk(r, "outer_bytes_sent")) for r in rows)
    window = args.window or statistics.median(r["step_time_s"] for r in body)
    inside = [x for x in sampler.samples if span[0] <= x[0] <= span[1]]  # steps 2..N: no start-up, no final sync
    return {"name": name, "rate": rate, "round": rnd, "steps": steps, "step_s": step_s, "wall_s": wall,
            "utilisation": util, "inter_bytes_ledger": ledger,
            "inter_bytes_veth": [(a - b) for a, b in zip(after, before)],
            "tokens": steps * 32 * 64, "peak_rate_Bps": peak_rate(inside, window), "window_s": window,
            "step_times": [r["step_time_s"] for r in rows],
            "veth_samples": [(round(t - span[0], 4), b - inside[0][1]) for t, b in inside] if inside else []}


def eval_curve(run_dir) -> list:
    """``[(step, eval loss), ...]`` of a run directory's metrics.jsonl."""
    out = []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        d = json.loads(line)
        if "eval" in d:
            out.append((d["eval"]["step"], d["eval"]["loss"]))
    return out


def plot(runs: dict, cluster: dict, path: Path, tokens_per_step: int = 32 * 64) -> dict:
    """Loss against tokens (the full runs ``runs``: label -> (contender, run dir)) and
    against wall time at each rate of ``cluster`` (cluster.json): each run's eval curve
    with its steps turned into seconds by that contender's measured mean step time on
    the link. Returns the curves and the times to a target (the worst final loss)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step_s = {}
    for r in cluster["results"]:
        step_s.setdefault((r["rate"], r["name"]), []).append(r["step_s"])
    step_s = {k: statistics.median(v) for k, v in step_s.items()}
    rates = sorted({r for r, _ in step_s}, key=lambda r: -float(r.rstrip("mbit") or 0))
    curves = {label: eval_curve(d) for label, (_, d) in runs.items()}
    target = max(c[-1][1] for c in curves.values())
    fig, axes = plt.subplots(1, 1 + len(rates), figsize=(5.2 * (1 + len(rates)), 4.6))
    summary = {"target": target, "time_to_target_s": {}, "final": {k: c[-1] for k, c in curves.items()}}
    for label, (name, _) in runs.items():
        c = curves[label]
        axes[0].plot([s * tokens_per_step / 1e6 for s, _ in c], [v for _, v in c], label=label)
        for ax, rate in zip(axes[1:], rates):
            if (rate, name) not in step_s:
                continue
            sec = step_s[(rate, name)]
            ax.plot([s * sec for s, _ in c], [v for _, v in c], label=label)
            first = next((s for s, v in c if v <= target), None)
            summary["time_to_target_s"][f"{rate} {label}"] = None if first is None else first * sec
    axes[0].set(xlabel="tokens (millions)", ylabel="validation loss (nats)", title="loss against tokens")
    for ax, rate in zip(axes[1:], rates):
        ax.set(xlabel="wall time (s)", ylabel="validation loss (nats)",
               title=f"loss against wall time, link {rate.replace('mbit', ' Mbit/s')}")
        ax.axhline(target, color="gray", ls=":", lw=0.8)
    for ax in axes:
        ax.legend(fontsize=7)
        ax.set_ylim(top=min(6.0, ax.get_ylim()[1]))
    fig.suptitle("DDP and DiLoCo, 2 sites x 2 ranks, GPT 169,728 params on BPE Python source; wall time = "
                 "steps x the mean step time measured on the emulated link", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="", help="the corpus of jobs/gpt_diloco.toml (runs)")
    p.add_argument("--rates", default="100mbit,10mbit")
    p.add_argument("--contenders", default="ddp:60,diloco:300,diloco-int8:300,streaming:300")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--window", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a config override for every run (e.g. model.n_layer=4)")
    p.add_argument("--out", default="runs/diloco-cluster")
    p.add_argument("--plot", nargs="*", metavar="LABEL=CONTENDER:RUN_DIR",
                   help="no runs: plot full runs (their eval curves) against tokens and, with OUT/cluster.json's "
                        "step times, against wall time; writes OUT/diloco.png and OUT/summary.json")
    args = p.parse_args(argv)
    if args.plot is not None:
        runs = {}
        for item in args.plot:
            label, _, rest = item.partition("=")
            name, _, d = rest.partition(":")
            runs[label] = (name, d)
        cluster = json.loads((Path(args.out) / "cluster.json").read_text())
        summary = plot(runs, cluster, Path(args.out) / "diloco.png")
        (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps(summary, indent=1))
        return 0
    Path(args.out).mkdir(parents=True, exist_ok=True)
    contenders = [(c.split(":")[0], int(c.split(":")[1])) for c in args.contenders.split(",")]
    results = []
    for rate in args.rates.split(","):
        subprocess.run(["bash", str(ROOT / "tests/cluster/cluster.sh"), "rate", rate], check=True,
                       capture_output=True)
        for rnd in range(args.repeats):
            for name, steps in contenders:
                r = run(name, steps, rate, args, rnd)
                r["load"] = os.getloadavg()
                results.append(r)
                print(f"{rate:>8} {name:<15} {steps:>5} steps  {1e3 * r['step_s']:8.1f} ms/step  util "
                      f"{min(r['utilisation']):.3f}-{max(r['utilisation']):.3f}  inter {r['inter_bytes_ledger'] / steps:10.0f}"
                      f" B/step (veth {sum(r['inter_bytes_veth']) / 2 / steps:10.0f})  peak "
                      f"{8 * r['peak_rate_Bps'] / 1e6:7.2f} Mbit/s  load {r['load'][0]:.1f}", flush=True)
    (Path(args.out) / "cluster.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "argv": sys.argv, "results": results},
        indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
