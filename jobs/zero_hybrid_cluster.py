"""ZeRO-3 on the emulated cluster: the flat ring against the few-step collectives
(``parallel.zero.algorithm = "recursive"`` / ``"hierarchical"``) and hybrid sharding
(``parallel.zero.shard = "node"``), at several link rates, with the cost model's
prediction beside each point. Run from the repository root, as root, with the venv on
PATH and a cluster of 2 nodes x 2 ranks up under your HPCDP_CLUSTER_PREFIX
(``bash tests/cluster/cluster.sh up --nodes 2 --ppn 2``)::

    python jobs/zero_hybrid_cluster.py --rates none,250mbit --steps 10 --warmup 3 --repeats 2

``--variants`` picks rows (default every one: flat, flat-recursive, flat-hierarchical,
hybrid).

Per rate and layout, interleaved over ``--repeats`` rounds (the fastest round kept):
the median step time after ``--warmup`` (``step_time_s`` of metrics.jsonl), and the
inter-node bytes one node sends per step, twice: from the ledger (hybrid and the
hierarchical collectives: the ``*.inter`` bytes of the node's ranks, ``inter_bytes_sent``;
flat ring: the bytes of the node's last rank, whose ring successor is on the other node;
recursive halving / doubling: not split by link kind in the ledger, "-") and from
the node's veth counters (everything the node's link carried, start-up and the final
evaluation included, divided by the steps; so above the ledger). The prediction:
``hpcdp.scale.model.step`` with ``hpcdp/comm/model/profiles/emulated-cluster.toml``, its
inter-node bandwidth capped at the rate (tbf), the global batch of the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# variant -> (parallel.zero.shard, parallel.zero.algorithm)
VARIANTS = {"flat": ('"world"', "ring"), "flat-recursive": ('"world"', "recursive"),
            "flat-hierarchical": ('"world"', "hierarchical"), "hybrid": ('"node"', "ring")}


def veth_bytes(prefix: str, nodes: int) -> list[int]:
    """tx bytes of each node's veth in the root namespace (what the node received) plus
    rx (what it sent), per node."""
    out = []
    for i in range(nodes):
        d = Path(f"/sys/class/net/{prefix}v{i}/statistics")
        out.append(int((d / "rx_bytes").read_text()) + int((d / "tx_bytes").read_text()))
    return out


def run(layout: str, steps: int, out: Path, batch: int) -> dict:
    prefix = os.environ.get("HPCDP_CLUSTER_PREFIX", "hpcdpn")
    cmd = [str(ROOT / "tests/cluster/mpiexec"), "-n", "4", sys.executable, "-m", "hpcdp.cli", "train",
           "--config", "jobs/gpt_ddp.toml", "--set", 'parallel.strategy="zero"',
           "--set", "parallel.zero.stage=3", "--set", f"parallel.zero.shard={VARIANTS[layout][0]}",
           "--set", f'parallel.zero.algorithm="{VARIANTS[layout][1]}"',
           "--set", f"train.steps={steps}", "--set", "run.log_every=1", "--set", f"train.global_batch={batch}",
           "--set", f'run.out_dir="{out}"']
    if out.exists():  # a run directory holds one run: this point's last one goes
        shutil.rmtree(out)
    before = veth_bytes(prefix, 2)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise SystemExit(f"{layout}: exit {proc.returncode}\n{(proc.stdout + proc.stderr)[-3000:]}")
    after = veth_bytes(prefix, 2)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return {"rows": [r for r in rows if "step" in r and "ranks" in r],
            "veth_per_step": [(a - b) / 2 / steps for a, b in zip(after, before)]}  # sent, each way


def summarize(layout: str, res: dict, warmup: int) -> dict:
    rows = res["rows"][warmup:]
    step = statistics.median(r["step_time_s"] for r in rows)
    rk = rows[-1]["ranks"]
    if layout in ("hybrid", "flat-hierarchical"):
        ledger = sum(rk["inter_bytes_sent"][:2])  # node 0's two ranks
    elif layout == "flat":
        ledger = rk["bytes_sent"][1]  # rank 1 sends to rank 2 (node 1): node 0's crossing
    else:
        ledger = None  # recursive: its rounds cross nodes or not by distance; the ledger does not split them
    return {"step_ms": 1e3 * step, "ledger_inter": ledger, "veth_inter": res["veth_per_step"][0]}


def predict(layout: str, rate: str, batch_per_rank: float) -> dict:
    from hpcdp.comm.model.cost import load_profile
    from hpcdp.config import load_config
    from hpcdp.scale import model as M

    p = load_profile("emulated-cluster")
    if rate != "none":
        bits = float(rate.lower().replace("gbit", "e9").replace("mbit", "e6").replace("kbit", "e3"))
        cap = 8.0 / bits  # the rate limits both protocols' lines
        p = dataclasses.replace(p, inter=dataclasses.replace(
            p.inter, beta_s_per_byte=max(p.inter.beta_s_per_byte, cap), ring_beta_s_per_byte=0.0,
            rndv_beta_s_per_byte=max(p.inter.rndv_beta_s_per_byte, cap) if p.inter.eager_bytes else 0.0))
    wl = M.workload_from_config(load_config(ROOT / "jobs/gpt_ddp.toml", []))
    shard, algorithm = VARIANTS[layout]
    st = M.step(p, wl, "hybrid3" if layout == "hybrid" else "zero3", 4, batch_per_rank,
                algorithm=algorithm, per_node=2)
    return {"step_ms": 1e3 * st.step_s, "inter": st.inter_bytes_node / 2}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="none,250mbit")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16, help="global batch (4 per rank by default)")
    ap.add_argument("--out", default="runs/zero-hybrid-cluster")
    args = ap.parse_args(argv)
    out = ROOT / args.out
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or "flat" not in variants:
        ap.error(f"--variants: {unknown or 'flat is needed (the ratio column)'}; choose from {', '.join(VARIANTS)}")
    table = []
    for rate in args.rates.split(","):
        subprocess.run(["bash", str(ROOT / "tests/cluster/cluster.sh"), "rate", rate], check=True,
                       capture_output=True)
        best: dict = {}
        load = os.getloadavg()[0]
        for rnd in range(args.repeats):
            for layout in variants:
                s = summarize(layout, run(layout, args.steps, out / f"{rate}-{layout}-{rnd}", args.batch),
                              args.warmup)
                if layout not in best or s["step_ms"] < best[layout]["step_ms"]:
                    best[layout] = s
        for layout in variants:
            table.append((rate, layout, best[layout], predict(layout, rate, args.batch / 4), load))
    subprocess.run(["bash", str(ROOT / "tests/cluster/cluster.sh"), "rate", "none"], capture_output=True)
    print("| rate | ZeRO-3 variant | step ms (predicted) | inter-node MB per step and node, ledger / veth "
          "(predicted) | inter bytes / flat ring's (ledger) | load |")
    print("|---|---|---|---|---|---|")
    flat = {}
    for rate, layout, m, pr, load in table:
        if layout == "flat":
            flat[rate] = m["ledger_inter"]
        led = m["ledger_inter"]
        ratio = f"{led / flat[rate]:.2f}" if layout != "flat" and led is not None else "-"
        led_s = "-" if led is None else f"{led / 1e6:.2f}"
        print(f"| {rate} | {layout} | {m['step_ms']:.0f} ({pr['step_ms']:.0f}, "
              f"{100 * (pr['step_ms'] - m['step_ms']) / m['step_ms']:+.0f}%) | {led_s} / "
              f"{m['veth_inter'] / 1e6:.2f} ({pr['inter'] / 1e6:.2f}) | {ratio} | {load:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
