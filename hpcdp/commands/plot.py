"""``hpcdp plot RUN [RUN ...]``: a run's figures against step, several runs overlaid.

    hpcdp plot runs/gpt-ddp-20261202-101500 [runs/...] [--out plot.png] [--csv series.csv]

Four panels from each run directory's ``metrics.jsonl`` (and ``config.toml``): the
training loss (a line; each evaluation a marker), the throughput (tokens/s for a GPT,
samples/s for an MLP: each run's legend entry says which), the communication time per
step (the mean over ranks of ``comm_s``, ms) and the bytes sent per step (the mean over
ranks of ``bytes_sent``, MiB). Runs above ``run.rank_lists_up_to`` ranks are read
from the spread (hpcdp.metrics.rank_values). ``--csv`` also writes every point.
Needs matplotlib (``pip install 'hpcdp[plot]'``); ``--csv`` alone does not.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tomllib
from pathlib import Path

from hpcdp.data import DataError

COLUMNS = ("run", "step", "loss", "throughput", "unit", "comm_ms", "mib_sent", "eval_loss")


def read_run(run: Path) -> dict:
    """``{"name", "unit", "rows": [{step, loss, throughput, comm_ms, mib_sent}], "evals": [(step, loss)]}``."""
    from hpcdp.metrics import rank_values

    metrics = run / "metrics.jsonl"
    if not metrics.is_file():
        raise DataError(f"hpcdp plot: {run} is not a run directory (no metrics.jsonl)")
    tokens = None
    if (run / "config.toml").is_file():
        model = tomllib.loads((run / "config.toml").read_text()).get("model", {})
        if model.get("kind") == "gpt":
            tokens = int(model.get("block_size", 1))
    rows, evals = [], []
    for line in metrics.read_text().splitlines():
        rec = json.loads(line)
        if "eval" in rec:
            if rec["eval"].get("loss") is not None:
                evals.append((rec["eval"]["step"], rec["eval"]["loss"]))
            continue
        if "step" not in rec:
            continue  # unflushed_step records (a failing writer's own figures)
        rate = rec.get("samples_per_s")
        comm = rank_values(rec, "comm_s", "mean")
        sent = rank_values(rec, "bytes_sent", "mean")
        rows.append({"step": rec["step"], "loss": rec.get("loss"),
                     "throughput": None if rate is None else rate * (tokens or 1),
                     "comm_ms": None if comm is None else 1e3 * comm,
                     "mib_sent": None if sent is None else sent / 2**20})
    return {"name": run.name, "unit": "tokens/s" if tokens else "samples/s", "rows": rows, "evals": evals}


def write_csv(runs: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in runs:
            evals = dict(r["evals"])
            for row in r["rows"]:
                w.writerow([r["name"], row["step"], row["loss"], row["throughput"], r["unit"], row["comm_ms"],
                            row["mib_sent"], evals.get(row["step"])])


def plot(runs: list[dict], path: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        raise DataError("hpcdp plot: needs matplotlib: pip install 'hpcdp[plot]' (or give --csv alone)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    panels = ((axes[0][0], "loss", "training loss (markers: evaluations)"),
              (axes[0][1], "throughput", "throughput"),
              (axes[1][0], "comm_ms", "communication time per step, ms (mean over ranks)"),
              (axes[1][1], "mib_sent", "MiB sent per step (mean over ranks)"))
    units = sorted({r["unit"] for r in runs})
    for i, r in enumerate(runs):
        color = f"C{i % 10}"
        for ax, key, _ in panels:
            pts = [(row["step"], row[key]) for row in r["rows"] if row[key] is not None]
            if pts:
                label = f"{r['name']} ({r['unit']})" if key == "throughput" else r["name"]
                ax.plot([s for s, _ in pts], [v for _, v in pts], color=color, lw=1.2, label=label)
        if r["evals"]:
            axes[0][0].plot([s for s, _ in r["evals"]], [v for _, v in r["evals"]], "o", color=color, ms=5,
                            mfc="none")
    for ax, key, title in panels:
        if key == "throughput":  # MLP runs count samples, GPT runs tokens: each legend entry says which
            title = (f"throughput, {units[0]}" if len(units) == 1 else
                     "throughput: samples/s (MLP runs), tokens/s (GPT runs)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not reported by these runs", ha="center", va="center", transform=ax.transAxes)
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hpcdp plot", description="Plot runs' loss, throughput, communication "
                                "time and bytes against step (several runs overlaid).")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (holding metrics.jsonl)")
    p.add_argument("--out", default=None, help="the PNG to write (default: RUN/plot.png for one run, "
                   "plot.png here for several)")
    p.add_argument("--csv", default=None, help="also write every point here (run, step, loss, throughput, unit, "
                   "comm_ms, mib_sent, eval_loss)")
    p.add_argument("--no-png", action="store_true", help="write only --csv")
    args = p.parse_args(argv)
    runs = [read_run(Path(r)) for r in args.runs]
    if args.csv:
        write_csv(runs, Path(args.csv))
        print(f"wrote {args.csv}")
    if not args.no_png:
        out = Path(args.out) if args.out else (Path(args.runs[0]) / "plot.png" if len(runs) == 1 else Path("plot.png"))
        plot(runs, out)
        print(f"wrote {out}: {len(runs)} run(s), " + ", ".join(f"{r['name']} ({len(r['rows'])} steps, {r['unit']})"
                                                                for r in runs))
    elif not args.csv:
        print("hpcdp plot: --no-png without --csv writes nothing", file=sys.stderr)
        return 2
    return 0


__all__ = ["main", "read_run", "write_csv"]
