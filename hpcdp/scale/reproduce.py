"""``hpcdp scale --reproduce NAME``: hpcdp's cost model against scaling results someone
else measured, from the inputs their publications give.

A published table is a TOML file in ``hpcdp/scale/published/`` (package data): its
sources, the machine (GPUs and NICs per node, link rates and latencies, overlap), the
models (parameters, one GPU's images/s at the batch used) and the points (GPU count and
the published figure), with every input that was not published marked ASSUMED and
reasoned in the file's header. Nothing in a table is fitted to its points.

Each point is priced by the same code that prices hpcdp's own jobs: the table's machine
becomes a :class:`hpcdp.comm.model.cost.Profile` (compute in images: ``flops_per_s`` = one
GPU's images/s, one "flop" a sample), the model a :class:`hpcdp.scale.model.Workload`
(its gradient in buckets of the table's fusion size, backward order), and

- ``strategy = "ddp"``: :func:`hpcdp.scale.model.step` with the flat ring allreduce
  (Horovod over NCCL 2: one ring over every GPU, overlapped with backward);
- ``strategy = "ps-replicated"``: the gradient summed over a machine's GPUs (hpcdp's ring
  allreduce on the in-machine link), then the synchronous parameter server's push and
  pull with K servers over the M machines (:func:`hpcdp.comm.model.cost.ps_push_pull`), after
  backward (TensorFlow's ``distributed_replicated``).

The predicted figure is the weak-scaling efficiency ``t(1) / t(N)`` in percent, the
published one images/s(N) / (N images/s(1)). Error = predicted - published, in
percentage points; the summary gives the median and largest |error| against the aim
(every point within 10 points, the median within 5).
"""

from __future__ import annotations

import json
import statistics
import tomllib
from pathlib import Path

TABLE_DIR = Path(__file__).resolve().parent / "published"
AIM_MEDIAN, AIM_MAX = 5.0, 10.0  # percentage points
STRATEGIES = ("ddp", "ps-replicated")


def available() -> list[str]:
    return sorted(p.stem for p in TABLE_DIR.glob("*.toml"))


def load_table(name: str) -> dict:
    """A published table by name (``hpcdp/scale/published/NAME.toml``) or path."""
    path = Path(name)
    if not path.is_file():
        path = TABLE_DIR / f"{name}.toml"
    if not path.is_file():
        raise ValueError(f"--reproduce {name!r}: no such table; shipped: {', '.join(available())}, "
                         "or all (or the path of a table written like them)")
    try:
        t = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"--reproduce: {path}: {e}") from None
    for key in ("name", "strategy", "machine", "models", "points", "sources"):
        if key not in t:
            raise ValueError(f"--reproduce: {path}: no '{key}' (see hpcdp/scale/published/horovod.toml)")
    if t["strategy"] not in STRATEGIES:
        raise ValueError(f"--reproduce: {path}: strategy {t['strategy']!r}; choose {', '.join(STRATEGIES)}")
    for pt in t["points"]:
        if pt.get("model") not in t["models"]:
            raise ValueError(f"--reproduce: {path}: a point names model {pt.get('model')!r}, "
                             f"not one of {', '.join(t['models'])}")
        if pt.get("source") not in t["sources"]:
            raise ValueError(f"--reproduce: {path}: a point's source {pt.get('source')!r} is not in [sources]")
    t["path"] = str(path)
    return t


def profile_of(machine: dict, images_per_s: float, **override):
    """The table's machine as a cost-model Profile; compute counted in images."""
    from hpcdp.comm.model.cost import Link, Profile

    m = {**machine, **override}
    gpn = int(m["gpus_per_node"])
    return Profile(
        name="published", intra=Link(m["intra_alpha_s"], 1.0 / m["intra_bytes_per_s"]),
        inter=Link(m["inter_alpha_s"], 1.0 / m["inter_bytes_per_s"]),
        gamma_s_per_byte=m.get("gamma_s_per_byte", 0.0), call_s={"ring": m.get("call_s", 0.0)},
        msg_s=0.0, ctrl_msg_s=0.0, flops_per_s=images_per_s, optimizer_s_per_param=0.0,
        ranks_per_node=gpn, nics_per_node=int(m.get("nics_per_node", 1)),
        overlap=float(m.get("overlap", 1.0)), contention={gpn: float(m.get("contention", 1.0))})


def workload_of(model: dict, fusion_bytes: int = 0, itemsize: int = 4):
    """A model as a Workload: its gradient in buckets of ``fusion_bytes`` (backward
    order; one bucket when 0), one "flop" per image."""
    from hpcdp.scale.model import Workload

    P = int(model["params"])
    cap = max(1, fusion_bytes // itemsize) if fusion_bytes else P
    buckets, left = [], P
    while left > 0:
        buckets.append(min(cap, left))
        left -= buckets[-1]
    return Workload(name=model.get("label", "model"), params=P, itemsize=itemsize, buckets=buckets,
                    flops_per_sample=1.0, optimizer_state=1, batch=int(model["batch"]))


def predicted_step_s(table: dict, model_key: str, gpus: int, **override) -> float:
    """The model's step time of ``model_key`` on ``gpus`` GPUs (each at the table's batch)."""
    from hpcdp.comm.model.cost import Topology, ps_push_pull, ring_allreduce
    from hpcdp.scale.model import step

    mdl, mach = table["models"][model_key], {**table["machine"], **override}
    p = profile_of(mach, float(mdl["images_per_s"]))
    wl = workload_of(mdl, int(mach.get("fusion_bytes", 0)))
    gpn = int(mach["gpus_per_node"])
    if table["strategy"] == "ddp":
        return step(p, wl, "ddp", gpus, wl.batch, algorithm="ring", per_node=gpn).step_s
    # ps-replicated: sum over the machine's GPUs, then push + pull over the machines
    compute = step(p, wl, "ddp", 1, wl.batch, per_node=gpn).step_s
    local = ring_allreduce(p, wl.grad_bytes, Topology.of(min(gpus, gpn), gpn)).total_s
    machines = -(-gpus // gpn)
    servers = int({int(k): v for k, v in mdl.get("servers", {}).items()}.get(machines, machines))
    push_pull = ps_push_pull(p, wl.grad_bytes, Topology(machines, 1), servers).total_s if machines > 1 else 0.0
    return compute + local + push_pull


def published_value(table: dict, pt: dict) -> float:
    """The point's published figure: given, or images/s(N) / (N images/s(1)) in percent."""
    if "published" in pt:
        return float(pt["published"])
    one = float(table["models"][pt["model"]]["images_per_s"])
    return round(100.0 * float(pt["images_per_s"]) / (pt["gpus"] * one), 1)


def reproduce(table: dict, **override) -> list[dict]:
    """One record per published point: source, point, published, predicted, unit, error."""
    out = []
    for pt in table["points"]:
        key, gpus = pt["model"], int(pt["gpus"])
        t1 = predicted_step_s(table, key, 1, **override)
        tn = predicted_step_s(table, key, gpus, **override)
        pred = 100.0 * t1 / tn
        pub = published_value(table, pt)
        label = table["models"][key].get("label", key)
        out.append({"table": table["name"], "source": table["sources"][pt["source"]],
                    "point": f"{label}, {gpus} GPUs", "model": key, "gpus": gpus,
                    "published": pub, "predicted": round(pred, 1), "unit": table.get("unit", "%"),
                    "error": round(pred - pub, 1), "step_s": tn, "step_1_s": t1})
    return out


def summarize(records: list[dict]) -> dict:
    errs = [abs(r["error"]) for r in records]
    if not errs:
        return {"points": 0}
    med, mx = statistics.median(errs), max(errs)
    return {"points": len(errs), "median_abs_error": round(med, 2), "max_abs_error": round(mx, 2),
            "within_10": sum(e <= AIM_MAX for e in errs), "median_met": med <= AIM_MEDIAN,
            "max_met": mx <= AIM_MAX}


def sweep_lines(table: dict) -> list[str]:
    """How the predictions move with each ASSUMED input the table lists under
    ``machine.sweep``: per value, the median and largest |error|."""
    lines = []
    for key, values in table["machine"].get("sweep", {}).items():
        for v in values:
            s = summarize(reproduce(table, **{key: v}))
            lines.append(f"  {key} = {v:g} (table: {table['machine'][key]:g}): median |error| "
                         f"{s['median_abs_error']:.1f}, largest {s['max_abs_error']:.1f} points")
    return lines


def format_records(table: dict, records: list[dict], sweep: bool = False) -> str:
    s = summarize(records)
    lines = [f"{table['title']}", f"  table: {table['path']}", "",
             f"{'point':<28} {'published':>9} {'predicted':>9} {'error':>7}"]
    for r in records:
        lines.append(f"{r['point']:<28} {r['published']:>8.1f}% {r['predicted']:>8.1f}% {r['error']:>+6.1f}")
    lines.append(f"{s['points']} points: median |error| {s['median_abs_error']:.1f} points "
                 f"(aim <= {AIM_MEDIAN:g}: {'met' if s['median_met'] else 'NOT met'}), largest "
                 f"{s['max_abs_error']:.1f} (aim every point <= {AIM_MAX:g}: "
                 f"{'met' if s['max_met'] else 'NOT met'}, {s['within_10']}/{s['points']} within)")
    if sweep:
        lines += ["", "the ASSUMED inputs moved one at a time (every other input as the table has it):"]
        lines += sweep_lines(table)
    lines.append("sources: " + "; ".join(f"[{k}] {v}" for k, v in table["sources"].items()))
    return "\n".join(lines)


def run(args) -> list[dict]:
    names = available() if args.reproduce == "all" else [args.reproduce]
    records, blocks = [], []
    for name in names:
        table = load_table(name)
        recs = reproduce(table)
        records += recs
        blocks.append(format_records(table, recs, getattr(args, "sweep", False)))
    if len(names) > 1:
        s = summarize(records)
        blocks.append(f"all {s['points']} points of {len(names)} tables: median |error| "
                      f"{s['median_abs_error']:.1f} points, largest {s['max_abs_error']:.1f} "
                      f"({s['within_10']}/{s['points']} within {AIM_MAX:g})")
    print("\n\n".join(blocks))
    if getattr(args, "json", ""):
        keep = ("table", "source", "point", "model", "gpus", "published", "predicted", "unit", "error")
        Path(args.json).write_text(json.dumps([{k: r[k] for k in keep} for r in records], indent=1) + "\n")
        print(f"wrote {args.json}")
    return records


__all__ = ["available", "load_table", "reproduce", "summarize", "predicted_step_s", "published_value",
           "profile_of", "workload_of", "format_records", "run", "TABLE_DIR"]
