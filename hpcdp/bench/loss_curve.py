"""Plot a run's loss curves from its metrics.jsonl: training loss per step (and a
running mean) and every evaluation's loss. Needs matplotlib (``hpcdp[plot]``).

    python -m hpcdp.bench.loss_curve RUN_DIR --out docs/figures/curve.png [--title ...] [--csv out.csv]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def read_run(run_dir: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """([(step, train loss)], [(step, eval loss)]) of a run directory."""
    train, evals = [], []
    for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "eval" in rec:
            evals.append((rec["eval"]["step"], rec["eval"]["loss"]))
        elif "loss" in rec:
            train.append((rec["step"], rec["loss"]))
    return train, evals


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpcdp.bench.loss_curve", description=__doc__.split("\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--out", required=True, help="PNG to write")
    p.add_argument("--title", default="")
    p.add_argument("--csv", help="also write step,train_loss,eval_loss rows here")
    args = p.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, evals = read_run(Path(args.run_dir))
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        s, v = np.array(train).T
        ax.plot(s, v, color="0.75", lw=0.8, label="train loss (global batch)")
        k = max(1, len(v) // 50)
        if k > 1:
            ax.plot(s[k - 1:], np.convolve(v, np.ones(k) / k, mode="valid"), color="C0", lw=1.2,
                    label=f"train loss, mean of {k} steps")
    if evals:
        s, v = np.array(evals).T
        ax.plot(s, v, "o-", color="C3", lw=1.5, ms=4, label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    if args.csv:
        ev = dict(evals)
        rows = ["step,train_loss,eval_loss"] + [f"{s},{v},{ev.get(s, '')}" for s, v in train]
        Path(args.csv).write_text("\n".join(rows) + "\n")
    print(f"wrote {args.out}: {len(train)} steps, {len(evals)} evaluations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
