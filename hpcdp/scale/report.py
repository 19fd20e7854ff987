"""The table, the figure and the model's predictions of an ``hpcdp scale`` study.

Shared by the study itself and by ``hpcdp scale --collect`` (a results folder gathered
by the cluster job), so both print the same table and draw the same plot.
"""

from __future__ import annotations

import json
from pathlib import Path

NO_MATPLOTLIB = "matplotlib is not installed: skipped the PNG (pip install 'hpcdp[plot]')"


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def write_outputs(out: Path, stem: str, table: str, data: dict, plotter) -> None:
    """Print ``table``; write ``stem``.txt, .json and .png (``plotter(data, path)``)."""
    print(table)
    (out / f"{stem}.txt").write_text(table + "\n")
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    msg = plotter(data, out / f"{stem}.png")
    print(msg or f"wrote {out / (stem + '.png')}")
    print(f"wrote {out / (stem + '.json')} and {out / (stem + '.txt')}")


def predict_points(result: dict, profile, cfg, per_node: int) -> None:
    """Add the cost model's ``pred_step_s`` / ``pred_error`` to every measured point
    (weak, strong, compute-only), and the predicted efficiencies."""
    from dataclasses import replace

    from hpcdp.scale import model as M
    from hpcdp.scale.points import VARIANTS
    from hpcdp.config import load_config

    algorithm = getattr(cfg.parallel.sub("ddp"), "algorithm", "ring") if hasattr(cfg.parallel, "sub") else "ring"
    if algorithm not in ("ring", "recursive", "hierarchical", "auto"):
        algorithm = "ring"  # MPI's own allreduce is not modelled; the ring is the closest
    loads = {}

    def workload(variant):
        if variant not in loads:
            sets = [f"{k}={v}" for k, v in VARIANTS.get(variant, {}).items()]
            loads[variant] = M.workload_from_config(load_config(result["config"], result["overrides"] + sets,
                                                                shared_options=True))
        return loads[variant]

    def predict(p):
        v = p["variant"]
        prof = replace(profile, overlap=0.0) if v == "no_overlap" else profile
        wl = workload("bucketed" if v == "compute_only" else v)
        bpr = p["global_batch"] / p["ranks"]
        st = M.step(prof, wl, "ddp", p["ranks"], bpr, algorithm, per_node=per_node)
        pred = st.compute_s if v == "compute_only" else st.step_s
        p["pred_step_s"] = pred
        p["pred_comm_exposed_s"] = 0.0 if v == "compute_only" else st.exposed_s
        p["pred_error"] = p["step_time_s"] / pred - 1.0
        if per_node and profile.cores_per_node and min(p["ranks"], per_node) > profile.cores_per_node:
            p["oversubscribed"] = True

    for study in ("weak", "strong"):
        for p in result.get(study, []):
            predict(p)
        base = next((p for p in result.get(study, []) if p["ranks"] == 1), None)
        for p in result.get(study, []):
            if base is not None:
                p["pred_efficiency"] = base["pred_step_s"] / (p["ranks"] * p["pred_step_s"]) * (
                    p["ranks"] if study == "weak" else 1)
    for p in result.get("baseline", []):
        predict(p)


def format_table(result: dict) -> str:
    pred = any("pred_step_s" in p for s in ("weak", "strong") for p in result.get(s, []))
    lines = []
    hdr = (f"{'study':<7} {'variant':<11} {'ranks':>5} {'batch':>6} {'step ms':>9} "
           f"{'samples/s':>10} {'eff':>6} {'comm ms':>8} {'exposed':>8} {'hidden':>8} "
           f"{'MiB/step':>9}")
    if pred:
        hdr += f" {'pred ms':>8} {'error':>7}"
    lines.append(hdr)
    lines.append("-" * len(hdr))
    for study in ("weak", "strong"):
        for p in result.get(study, []):
            row = (f"{study:<7} {p['variant']:<11} {p['ranks']:>5} {p['global_batch']:>6} "
                   f"{1e3 * p['step_time_s']:>9.2f} {p['samples_per_s']:>10.1f} "
                   f"{p.get('efficiency', float('nan')):>6.1%} {1e3 * p['comm_s']:>8.2f} "
                   f"{1e3 * p['comm_exposed_s']:>8.2f} {1e3 * p['comm_hidden_s']:>8.2f} "
                   f"{p['grad_bytes_sent'] / 2**20:>9.3f}")
            if pred:
                row += _pred_cells(p)
            lines.append(row)
    att = [p for p in result.get("weak", []) if "eff_contention" in p]
    if att:
        lines.append("")
        lines.append("weak-scaling efficiency, split (compute-only baseline: same ranks, data "
                     "and step, no collective):")
        lines.append(f"  {'variant':<11} {'ranks':>5} {'eff':>6} {'compute-only ms':>15} "
                     f"{'contention':>10} {'comm':>6} {'lost to contention':>18} {'lost to comm':>12}"
                     + (f" {'pred c-o ms':>11} {'error':>7}" if pred else ""))
        base = {b["ranks"]: b for b in result.get("baseline", [])}
        for p in att:
            row = (f"  {p['variant']:<11} {p['ranks']:>5} {p['efficiency']:>6.1%} "
                   f"{1e3 * p['compute_only_step_s']:>15.2f} {p['eff_contention']:>10.1%} "
                   f"{p['eff_comm']:>6.1%} {p['loss_contention']:>18.1%} {p['loss_comm']:>12.1%}")
            b = base.get(p["ranks"])
            if pred and b is not None and "pred_step_s" in b:
                row += _pred_cells(b, 11)
            lines.append(row)
    cmp_ = result.get("variant_speedup", [])
    if cmp_:
        lines.append("")
        lines.append("speedup of bucketed+overlapped (weak scaling, same ranks):")
        for c in cmp_:
            lines.append(f"  {c['ranks']} ranks: {c['over']:<11} {c['speedup']:.3f}x "
                         f"(step {1e3 * c['other_step_s']:.2f} ms -> "
                         f"{1e3 * c['bucketed_step_s']:.2f} ms)")
    if pred:
        lines.append("")
        lines.append(f"pred: the cost model with profile {result.get('profile')!r} "
                     "(error = measured / predicted - 1; * = oversubscribed, outside the model)")
    if result.get("incomplete"):
        lines.append(f"INCOMPLETE: {result['incomplete']}")
    if result.get("oversubscribed"):
        lines.append(f"note: {result['oversubscribed']}")
    if result.get("load_before"):
        lines.append(f"load average before/after: {result['load_before']} / {result.get('load_after')}")
    return "\n".join(lines)


def _pred_cells(p: dict, width: int = 8) -> str:
    flag = "*" if p.get("oversubscribed") else " "
    return f" {1e3 * p['pred_step_s']:>{width}.2f} {p['pred_error']:>+6.1%}{flag}"


def plot(result: dict, path: Path) -> str | None:
    """scale.png: step time (measured, and predicted when a profile was given) and
    efficiency of every variant, the efficiency lost to contention vs communication,
    exposed vs hidden communication. Weak points are filled, strong ones hollow and
    larger, so the shared one-rank point shows both; legends sit below the panels."""
    plt = pyplot()
    if plt is None:
        return NO_MATPLOTLIB
    fig, axes = plt.subplots(1, 4, figsize=(19, 5.8))
    all_ranks = sorted({p["ranks"] for s in ("weak", "strong") for p in result.get(s, [])})
    variants = list(dict.fromkeys(p["variant"] for s in ("weak", "strong") for p in result.get(s, [])))
    markers = dict(zip(variants, "osD^v<>"))
    colors = {v: f"C{i}" for i, v in enumerate(variants)}
    for study in ("weak", "strong"):
        for variant in variants:
            pts = [p for p in result.get(study, []) if p["variant"] == variant]
            if not pts:
                continue
            ks = [p["ranks"] for p in pts]
            style = (dict(color=colors[variant], marker=markers[variant], ms=6) if study == "weak" else
                     dict(color=colors[variant], marker=markers[variant], ms=11, mfc="none", mew=1.5))
            name = f"{study} {variant}"
            axes[0].plot(ks, [1e3 * p["step_time_s"] for p in pts], ls="", label=f"{name} measured", **style)
            if all("pred_step_s" in p for p in pts):
                axes[0].plot(ks, [1e3 * p["pred_step_s"] for p in pts], ls="--" if study == "weak" else ":",
                             color=colors[variant], label=f"{name} model")
            axes[1].plot(ks, [100 * p["efficiency"] for p in pts], ls="-" if study == "weak" else ":",
                         label=name, **style)
            if all("pred_efficiency" in p for p in pts):
                axes[1].plot(ks, [100 * p["pred_efficiency"] for p in pts], ls="--", color=colors[variant],
                             label=f"{name} model")
    base = result.get("baseline", [])
    if base:
        axes[0].plot([b["ranks"] for b in base], [1e3 * b["step_time_s"] for b in base], "x",
                     color="gray", ms=8, label="compute-only")
    axes[0].set(xlabel="ranks", ylabel="ms per step", title="step time")
    axes[1].axhline(100, color="k", ls="--", lw=0.8)
    axes[1].set(xlabel="ranks", ylabel="efficiency %", title="scaling efficiency")
    att = [p for p in result.get("weak", []) if p.get("loss_contention") is not None]
    if att:
        import numpy as np

        x = np.arange(len(att))
        cont = [100 * p["loss_contention"] for p in att]
        comm = [100 * p["loss_comm"] for p in att]
        axes[2].bar(x - 0.2, cont, 0.4, label="contention (compute-only slower than 1 rank)", color="C4")
        axes[2].bar(x + 0.2, comm, 0.4, label="communication (exposed + CPU)", color="C5")
        for xi, v in list(zip(x - 0.2, cont)) + list(zip(x + 0.2, comm)):
            axes[2].annotate(f"{v:+.0f}", (xi, v), ha="center", va="bottom" if v >= 0 else "top", fontsize=8)
        axes[2].axhline(0, color="k", lw=0.8)
        axes[2].set_xticks(list(x), [f"{p['variant']} n={p['ranks']}" for p in att], fontsize=8, rotation=30,
                           ha="right", rotation_mode="anchor")
        axes[2].margins(y=0.15)
    axes[2].set(ylabel="efficiency points lost (< 0: gained)", title="weak scaling: where efficiency goes")
    labels, exposed, hidden = [], [], []
    for p in result.get("weak", []):
        if p["ranks"] > 1:
            labels.append(f"{p['variant']} n={p['ranks']}")
            exposed.append(1e3 * p["comm_exposed_s"])
            hidden.append(1e3 * p["comm_hidden_s"])
    if labels:
        x = range(len(labels))
        axes[3].bar(x, exposed, label="exposed")
        axes[3].bar(x, hidden, bottom=exposed, label="hidden behind backward")
        axes[3].set_xticks(list(x), labels, fontsize=8, rotation=30, ha="right", rotation_mode="anchor")
        axes[3].margins(y=0.1)
    axes[3].set(ylabel="ms per step", title="gradient communication (weak)")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    for ax in axes[:2]:
        ax.set_xticks(all_ranks)
    fig.suptitle(result.get("title", "hpcdp scale"), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
