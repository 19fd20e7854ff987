"""``hpcdp scale --predict --profile P --config C --ranks 1,2,4,...,4096``: the cost model
alone, for rank counts no machine here has.

For every strategy and rank count: predicted step time (compute + the communication the
step waits for), all communication time, bytes on the busiest rank's links and through
the busiest node's NICs per step, memory per rank (parameters, gradients, optimizer
state), and weak (and strong) scaling efficiency. Then the crossovers:

- where K parameter servers stop keeping up (their pushes and pulls take longer than the
  workers' compute: an asynchronous PS could no longer hide them);
- where the ring's latency ``2(N-1) alpha`` reaches its bandwidth time for one bucket, and
  where hpcdp's software cost (per message and per call) does;
- what bounds the flat ring at the largest N, the wire (latency + bandwidth) or hpcdp's
  software, and from which N on, for one bucket;
- where the hierarchical allreduce beats the flat ring for one bucket.

Outputs in ``--out``: ``predict.txt``, ``predict.json``, ``predict.png``.
"""

from __future__ import annotations

import time
from pathlib import Path

DEFAULT_STRATEGIES = "ddp-ring,ddp-hierarchical,ddp-auto,ps1,ps8,zero1,zero2,zero3"


def expand_ranks(text: str) -> list[int]:
    """``1,2,4,...,4096`` -> powers of the last ratio up to the end; plain lists as is."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if "..." not in parts:
        from hpcdp.scale.study import study_ranks
        return study_ranks(text)
    i = parts.index("...")
    try:
        head, end = [int(p) for p in parts[:i]], int(parts[i + 1])
    except (ValueError, IndexError):
        raise SystemExit(f"hpcdp scale: --ranks {text!r}: write e.g. 1,2,4,...,4096") from None
    if len(head) < 2 or head[-1] <= head[-2] or head[-1] % head[-2] or head[0] < 1:
        raise SystemExit(f"hpcdp scale: --ranks {text!r}: give two growing terms before '...'")
    ratio, out = head[-1] // head[-2], list(head)
    while out[-1] * ratio <= end:
        out.append(out[-1] * ratio)
    return sorted(set(out + ([end] if end not in out else [])) | {1})


ZERO_ALGORITHMS = ("-ring", "-recursive", "-hierarchical", "-auto")  # zeroK-<algorithm>


def _strategies(text: str):
    out = []
    for name in [s.strip() for s in text.split(",") if s.strip()]:
        if name[:5] in ("zero1", "zero2", "zero3") and name[5:] in ZERO_ALGORITHMS:
            out.append((name, name[:5], {"algorithm": name[6:]}))  # zeroK-<algorithm>
            continue
        if name.startswith("ddp-") and name[4:] in ("ring", "recursive", "hierarchical", "auto"):
            out.append((name, "ddp", {"algorithm": name[4:]}))
        elif name.startswith("ps") and name[2:].isdigit() and int(name[2:]) >= 1:
            out.append((name, "ps", {"servers": int(name[2:])}))
        elif name in ("zero1", "zero2", "zero3", "hybrid1", "hybrid2", "hybrid3"):
            out.append((name, name, {}))
        elif name == "diloco" or name.startswith("diloco-"):
            out.append((name, "diloco", diloco_options(name)))
        else:
            raise SystemExit(f"hpcdp scale --predict: --strategies: {name!r}; choose from "
                             "ddp-ring, ddp-recursive, ddp-hierarchical, ddp-auto, psK (K servers), "
                             "zero1, zero2, zero3, hybrid1, hybrid2, hybrid3 (ZeRO sharded in the node), "
                             "diloco[-H<n>][-P<n>][-T<n>][-float32|-bfloat16|-int8]")
    return out


def diloco_options(name: str, defaults=None) -> dict:
    """``diloco-H100-P4-T1-int8`` -> sync_every 100, fragments 4, overlap 1, outer_dtype
    "int8"; unnamed ones from ``defaults`` (the config's [parallel.diloco]) or DiLoCo's own."""
    from hpcdp.config_parallel import DiLoCoConfig

    d = defaults or DiLoCoConfig()
    out = {"sync_every": d.sync_every, "fragments": d.fragments, "overlap": d.overlap,
           "outer_dtype": d.outer_dtype, "outer_block": d.outer_block}
    keys = {"H": "sync_every", "P": "fragments", "T": "overlap"}
    for part in name.split("-")[1:]:
        if part in ("float32", "bfloat16", "int8"):
            out["outer_dtype"] = part
        elif part[:1] in keys and part[1:].isdigit():
            out[keys[part[:1]]] = int(part[1:])
        else:
            raise SystemExit(f"hpcdp scale --predict: --strategies: {name!r}: {part!r} is not H<n>, P<n>, "
                             "T<n>, float32, bfloat16 or int8")
    try:
        DiLoCoConfig(**out)
    except Exception as e:  # ConfigError: the same rules as the config's
        raise SystemExit(f"hpcdp scale --predict: --strategies: {name!r}: {e}") from None
    return out


def link_rate(text: str) -> float:
    """``10mbit``, ``100mbit``, ``1gbit``, ``250kbit`` -> bits per second (tc's spelling)."""
    t = text.strip().lower()
    for unit, k in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if t.endswith(unit):
            try:
                return float(t[:-len(unit)]) * k
            except ValueError:
                break
    raise SystemExit(f"hpcdp scale --predict: --link {text!r}: write a rate like 10mbit, 100mbit or 1gbit")


def with_link(profile, bits_per_s: float):
    """``profile`` with its inter-node link at ``bits_per_s`` (a rate-limited link: every
    byte costs ``8 / rate`` seconds at any message size; its latency is kept)."""
    import dataclasses

    beta = 8.0 / bits_per_s
    inter = dataclasses.replace(profile.inter, beta_s_per_byte=beta, ring_beta_s_per_byte=beta,
                                rndv_beta_s_per_byte=beta if profile.inter.eager_bytes else 0.0)
    return dataclasses.replace(profile, inter=inter, name=f"{profile.name} @ {bits_per_s / 1e6:g} Mbit/s")


def predict(profile, wl, ranks, batch, strategies, per_node=None, strong_batch=None) -> dict:
    """Every (strategy, N) point plus the crossovers, as a JSON-able dict."""
    from hpcdp.comm.model import cost as CM
    from hpcdp.scale import model as M

    per_node = per_node or profile.ranks_per_node
    # Efficiency of every strategy is against plain one-rank training (no communication).
    base = M.step(profile, wl, "ddp", 1, batch, per_node=per_node)
    base_strong = M.step(profile, wl, "ddp", 1, strong_batch, per_node=per_node) if strong_batch else None
    rows = []
    for label, strategy, kw in strategies:
        for N in ranks:
            if strategy == "ps" and kw["servers"] > N:
                continue
            if strategy == "diloco":
                st = M.diloco_step(profile, wl, CM.Topology.of(N, per_node), batch, **kw)
            else:
                st = M.step(profile, wl, strategy, N, batch, per_node=per_node, **kw)
            row = {**st.as_dict(), "strategy": label, "strategy_kind": st.strategy}
            row["weak_efficiency"] = base.step_s / st.step_s
            row["utilisation"] = st.compute_s / st.step_s
            if strong_batch:
                sn = (M.diloco_step(profile, wl, CM.Topology.of(N, per_node), strong_batch / N, **kw)
                      if strategy == "diloco" else
                      M.step(profile, wl, strategy, N, strong_batch / N, per_node=per_node, **kw))
                row["strong_step_s"] = sn.step_s
                row["strong_efficiency"] = base_strong.step_s / (N * sn.step_s)
            rows.append(row)
    bucket = max(wl.buckets) * wl.itemsize
    lat, soft = M.ring_latency_crossover(profile, bucket, per_node, itemsize=wl.itemsize)
    bound, bound_from = M.ring_bound(profile, bucket, per_node, max(max(ranks), 2), wl.itemsize)
    wire_bytes = {str(N): M.ring_wire_bytes(profile, N, per_node, wl.itemsize) for N in ranks if N > 1}
    ps = {}
    for label, strategy, kw in strategies:
        if strategy == "ps":
            last, first = M.ps_keeps_up_until(profile, wl, batch, kw["servers"], ranks, per_node)
            ps[label] = {"keeps_up_until": last, "stops_at": first}
    hier = M.hierarchical_crossover(profile, bucket, per_node, ranks, wl.itemsize)
    sizes = [1 << k for k in range(10, 29, 2)]
    top = CM.Topology.of(max(ranks), per_node)
    curve = {a: [CM.priced()[a](profile, s, top, wl.itemsize).total_s for s in sizes]
             for a in CM.priced()}
    return {
        "profile": profile.name, "workload": wl.name, "params": wl.params,
        "buckets": wl.buckets, "batch_per_rank": batch, "strong_batch": strong_batch,
        "ranks": ranks, "ranks_per_node": per_node, "rows": rows,
        "crossovers": {
            "bucket_bytes": bucket,
            "ring_latency_reaches_bandwidth_at": lat,
            "software_reaches_bandwidth_at": soft,
            "ring_bound_at_max_ranks": bound,
            "ring_bound_from": bound_from,
            "ring_wire_bound_from_bytes": wire_bytes,
            "itemsize": wl.itemsize,
            "hierarchical_beats_ring_from": hier,
            "parameter_server": ps,
        },
        "allreduce_at_max_ranks": {"ranks": max(ranks), "sizes": sizes, "seconds": curve},
    }


def _bytes(b) -> str:
    if b is None:
        return "never (software-bound up to 1 TiB)"
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k:
            return f"{b / (1 << k):.3g} {unit}"
    return f"{b} B"


def format_predict(res: dict) -> str:
    lines = [f"cost model: profile {res['profile']!r}, {res['workload']}, "
             f"{len(res['buckets'])} bucket(s), batch {res['batch_per_rank']} per rank (weak), "
             f"{res['ranks_per_node']} ranks per node"]
    strong = res.get("strong_batch")
    w = max([len("strategy")] + [len(r["strategy"]) for r in res["rows"]])  # e.g. zero3-hierarchical
    hdr = (f"{'strategy':<{w}} {'ranks':>5} {'step ms':>9} {'compute':>8} {'comm ms':>9} "
           f"{'exposed':>9} {'link MB':>8} {'NIC MB':>8} {'mem MB':>7} {'util':>6} {'weak eff':>8}"
           + (f" {'strong eff':>10}" if strong else "") + "  allreduce")
    lines += [hdr, "-" * len(hdr)]
    for r in res["rows"]:
        lines.append(
            f"{r['strategy']:<{w}} {r['ranks']:>5} {1e3 * r['step_s']:>9.2f} {1e3 * r['compute_s']:>8.2f} "
            f"{1e3 * r['comm_s']:>9.2f} {1e3 * r['exposed_s']:>9.2f} {r['link_bytes'] / 1e6:>8.2f} "
            f"{r['inter_bytes_node'] / 1e6:>8.2f} {r['memory_bytes'] / 1e6:>7.1f} "
            f"{r.get('utilisation', 0.0):>6.1%} {r['weak_efficiency']:>8.1%}"
            + (f" {r['strong_efficiency']:>10.1%}" if strong else "") + f"  {r['algorithms']}")
    c = res["crossovers"]
    mb = c["bucket_bytes"] / 2**20
    lines.append("")
    lines.append(f"crossovers (bucket of {mb:.2f} MiB, {res['ranks_per_node']} ranks per node):")
    lines.append(f"  ring wire latency 2(N-1) alpha >= its bandwidth time from N = "
                 f"{c['ring_latency_reaches_bandwidth_at'] or 'beyond 2^20'}")
    lines.append(f"  hpcdp's software (per message, per call) >= bandwidth "
                 f"time from N = {c['software_reaches_bandwidth_at'] or 'beyond 2^20'}")
    what = {"wire": "the wire (latency + bandwidth)", "software": "hpcdp's software (per message, per call)"}
    lines.append(f"  the flat ring is bound by {what[c['ring_bound_at_max_ranks']]} from N = "
                 f"{c['ring_bound_from']} up to N = {max(res['ranks'])}")
    wb = c.get("ring_wire_bound_from_bytes") or {}
    if wb:
        lines.append("  the flat ring's allreduce is bound by the wire, not hpcdp's software, from "
                     + ", ".join(f"N = {n}: " + ("every size" if b == int(n) * c["itemsize"]
                                                 else _bytes(b)) for n, b in wb.items()))
    lines.append(f"  hierarchical allreduce faster than the flat ring from N = "
                 f"{c['hierarchical_beats_ring_from'] or 'never in this range'}")
    for label, v in c["parameter_server"].items():
        lines.append(f"  {label}: servers keep up with compute up to N = {v['keeps_up_until'] or '-'}, "
                     f"stop keeping up at N = {v['stops_at'] or 'beyond this range'}")
    lines.append("columns: link MB = bytes the busiest rank sends + receives per step; NIC MB = "
                 "bytes through the busiest node's NICs per step; mem = params + grads + "
                 "optimizer state per rank; util = compute / step time; diloco: per step "
                 "amortised (1/H of an outer exchange per fragment synced)")
    return "\n".join(lines)


MARKERS = ("o", "s", "^", "v", "D", "x", "+", "*", "P", "<", ">")
STYLES = ("-", "--", ":", "-.")


def distinct_series(rows) -> list[tuple[list[str], list, list, list]]:
    """``(strategy names, ranks, weak efficiency %, ms per step)`` per distinct curve:
    strategies whose predicted figures are equal (to 6 digits) share one entry."""
    by: dict = {}
    for r in rows:
        by.setdefault(r["strategy"], []).append(r)
    groups: dict = {}
    for name, rs in by.items():
        ks = [r["ranks"] for r in rs]
        eff = [100 * r["weak_efficiency"] for r in rs]
        step = [1e3 * r["step_s"] for r in rs]
        key = (tuple(ks), tuple(round(v, 6) for v in eff), tuple(float(f"{v:.6g}") for v in step))
        groups.setdefault(key, ([], ks, eff, step))[0].append(name)
    return list(groups.values())


def plot_predict(res: dict, path: Path) -> str | None:
    from hpcdp.scale.report import NO_MATPLOTLIB, pyplot

    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    for i, (names, ks, eff, step) in enumerate(distinct_series(res["rows"])):
        # strategies the model gives the same figures are one line, named together; the
        # others differ in colour, line style and marker, so none hides another
        style = {"marker": MARKERS[i % len(MARKERS)], "ls": STYLES[i % len(STYLES)], "ms": 4,
                 "color": f"C{i % 10}", "label": " = ".join(names)}
        axes[0].plot(ks, eff, **style)
        axes[1].plot(ks, step, **style)
    c = res["crossovers"]
    for ax in axes[:2]:
        ax.set_xscale("log", base=2)
        for key, style in (("ring_latency_reaches_bandwidth_at", ":"),
                           ("hierarchical_beats_ring_from", "--")):
            if c[key]:
                ax.axvline(c[key], color="gray", ls=style, lw=0.8)
    axes[0].set(xlabel="ranks", ylabel="weak efficiency %", title="weak scaling (model)")
    axes[1].set(xlabel="ranks", ylabel="ms per step", yscale="log", title="step time (model)")
    cur = res["allreduce_at_max_ranks"]
    for a, ts in cur["seconds"].items():
        axes[2].plot(cur["sizes"], [1e3 * t for t in ts], marker=".", label=a)
    axes[2].set(xscale="log", yscale="log", xlabel="allreduce bytes", ylabel="ms",
                title=f"allreduce at {cur['ranks']} ranks (model)")
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle(f"profile {res['profile']}: {res['workload']}, batch {res['batch_per_rank']} per rank; "
                 "dotted: ring latency = bandwidth; dashed: hierarchical beats ring", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def run(args) -> dict:
    from hpcdp.config import load_config
    from hpcdp.comm.model.cost import load_profile
    from hpcdp.scale.model import workload_from_config

    if not args.profile:
        raise SystemExit("hpcdp scale --predict: --profile P is required (a TOML file, or a "
                         "shipped name such as example-cluster)")
    try:
        profile = load_profile(args.profile)
    except ValueError as e:
        raise SystemExit(f"hpcdp scale --predict: --profile: {e}") from None
    cfg = load_config(args.config, args.set or [], shared_options=True)
    if getattr(args, "link", ""):
        profile = with_link(profile, link_rate(args.link))
    wl = workload_from_config(cfg)
    ranks = expand_ranks(args.ranks)
    batch = args.batch or cfg.train.global_batch
    studies = [s.strip() for s in args.study.split(",")]
    strong = batch * max(ranks) if "strong" in studies else None
    strategies = _strategies(args.strategies)
    own = cfg.parallel.sub("diloco") if hasattr(cfg.parallel, "sub") else None
    if own is not None:  # the config's [parallel.diloco] for what a name leaves out
        strategies = [(lb, k, diloco_options(lb, own) if k == "diloco" else kw) for lb, k, kw in strategies]
    res = predict(profile, wl, ranks, batch, strategies,
                  args.ranks_per_node or None, strong)
    res.update(config=str(args.config), date=time.strftime("%Y-%m-%d %H:%M:%S"))
    text = format_predict(res)
    if getattr(args, "node_mttf_h", 0.0):
        res["goodput"], more = goodput_of(args, res)
        text += "\n\n" + more
    out = Path(args.out or f"runs/predict-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    from hpcdp.scale.report import write_outputs
    write_outputs(out, "predict", text, res, plot_predict)
    return res


def goodput_of(args, res: dict) -> tuple[dict, str]:
    """The checkpoint interval and goodput per rank count (hpcdp.scale.goodput) with
    the predicted step of one strategy (``--goodput-strategy``, default the first)."""
    from hpcdp.scale import goodput as G

    label = args.goodput_strategy or res["rows"][0]["strategy"]
    steps = {r["ranks"]: r["step_s"] for r in res["rows"] if r["strategy"] == label}
    if not steps:
        raise ValueError(f"--goodput-strategy {label!r} is not one of the predicted strategies")
    if args.ckpt_bench:
        save_s, source = G.save_s_from_bench(args.ckpt_bench, args.ckpt_mode)
    elif args.ckpt_save_s is not None:
        save_s, source = args.ckpt_save_s, "--ckpt-save-s"
    else:
        raise ValueError("--node-mttf-h needs the time a checkpoint save costs: --ckpt-bench FILE "
                         "(hpcdp bench ckpt --json FILE) or --ckpt-save-s SECONDS")
    node_mttf = args.node_mttf_h * G.HOUR
    rejoin = args.restart_s if args.rejoin_s is None else args.rejoin_s
    rows = G.plan(sorted(steps), res["ranks_per_node"], node_mttf, save_s, args.restart_s,
                  steps.__getitem__, args.repair_s, rejoin, args.fatal_fraction)
    text = (f"strategy {label}: " + G.format_plan(rows, node_mttf, save_s, args.restart_s,
                                                    args.repair_s, rejoin, source))
    return {"strategy": label, "node_mttf_s": node_mttf, "save_s": save_s, "save_source": source,
            "restart_s": args.restart_s, "repair_s": args.repair_s, "rejoin_s": rejoin,
            "fatal_fraction": args.fatal_fraction, "rows": [r.as_dict() for r in rows]}, text
