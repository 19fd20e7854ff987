"""``hpcdp check-exact``: train one config in exact mode on several rank counts and
strategies (and across a restart) and check that the weights' SHA-256 agree.

    hpcdp check-exact --config jobs/gpt_small.toml --ranks 1,2,3,4 \\
        --strategies ddp,ps --steps 20 [--restart-at 10 --restart-ranks 3]

Every cell is one child job, ``mpiexec -n N hpcdp train --config ... --set
train.reproducible="exact" --set parallel.strategy=...`` in its own run directory
under ``--out``; its hashes come from the eval records of its metrics.jsonl (every
``run.eval_every`` steps and after the last). The table lists, per job, the short
hash at each eval step; the verdict line says whether every job's every hash equals
the first job's. Exit status: 0 all equal, 1 some differ (the odd ones are marked),
2 bad input or a job that failed.

Each check's jobs go into a folder of their own: ``runs/check-exact-<date>-<time>``,
or ``--out DIR``. An earlier check's results in ``--out`` are never deleted silently:
the check refuses to start (status 2) unless ``--replace`` is given, and then names
what it deletes.

``--restart-at K --restart-ranks Q``: for each strategy, the job on the largest
rank count P of ``--ranks`` also saves a checkpoint after step K
(``checkpoint.every = K``); a further job resumes it on Q ranks (``hpcdp train
--resume``) and trains to the end. Its final hash must equal the others'.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from hpcdp.launch import ChildFailed, launch_train, parse_ranks

# --strategies names -> --set overrides of [parallel].
STRATEGIES = {
    "none": ['parallel.strategy="none"'],
    "ddp": ['parallel.strategy="ddp"'],
    "ps": ['parallel.strategy="ps"', 'parallel.ps.mode="sync"'],
    "ps-dedicated": ['parallel.strategy="ps"', 'parallel.ps.mode="sync"', "parallel.ps.colocated=false"],
    **{f"zero{k}": ['parallel.strategy="zero"', f"parallel.zero.stage={k}"] for k in (1, 2, 3)},
}


MIN_RANKS = {"ps-dedicated": 2}  # one rank serves, at least one works


def strategy_sets(name: str) -> list[str]:
    if name not in STRATEGIES:
        raise ValueError(f"--strategies: {name!r} is not a strategy check-exact knows; "
                         f"choose from {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def _hashes(run_dir: Path) -> list[tuple[int, str]]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        ev = rec.get("eval")
        if ev and "weights_sha256" in ev:
            out.append((int(ev["step"]), ev["weights_sha256"]))
    return out


def _launch(args, n: int, sets: list[str], run_dir: Path, resume: str | None = None) -> list[tuple[int, str]]:
    launch_train(n, args.config, ['train.reproducible="exact"'] + sets, run_dir,
                 timeout=args.timeout, resume=resume)  # a folder jobs_folder made free
    found = _hashes(run_dir)
    if not found:
        raise RuntimeError(f"{run_dir}/metrics.jsonl has no weights_sha256 (an hpcdp older than exact mode?)")
    return found


def jobs_folder(out, names: list[str], *, replace: bool) -> Path:
    """The folder of this check's jobs: a new ``runs/check-exact-<stamp>`` when ``out`` is
    None; else ``out``, where the job folders ``names`` of an earlier check are refused
    (one line, status 2) unless ``replace``, which deletes them and says so."""
    from hpcdp.rundir import new_stamped_dir

    if out is None:
        path = new_stamped_dir(Path("runs") / "check-exact", "--out")
        print(f"jobs in {path}", flush=True)
        return path
    path = Path(out)
    earlier = [n for n in names if (path / n).exists()]
    if earlier and not replace:
        raise ValueError(f"--out {path}: it holds an earlier check's results ({', '.join(earlier)}); "
                         "choose another --out (or none: a new folder), or add --replace to delete them")
    for n in earlier:
        print(f"--replace: deleting {path / n}", flush=True)
        shutil.rmtree(path / n)
    path.mkdir(parents=True, exist_ok=True)
    return path


def format_table(rows: list[dict]) -> tuple[str, bool]:
    """Rows of {label, hashes: [(step, hex)]}; returns (table, all equal)."""
    ref = dict(rows[0]["hashes"])
    steps = sorted({s for r in rows for s, _ in r["hashes"]})
    width = max(len(r["label"]) for r in rows)
    lines = [f"{'job':<{width}}  " + "  ".join(f"{'step ' + str(s):<17}" for s in steps) + "  same"]
    ok, last = True, steps[-1]
    for r in rows:
        got = dict(r["hashes"])
        # equal wherever both have a hash, and the job reached the last eval
        same = last in got and last in ref and all(ref.get(s, h) == h for s, h in got.items())
        cells = [f"{got[s][:16]}{' ' if ref.get(s, got[s]) == got[s] else '*'}" if s in got else f"{'-':<17}"
                 for s in steps]
        ok &= same
        lines.append(f"{r['label']:<{width}}  " + "  ".join(cells) + f"  {'yes' if same else 'NO'}")
    return "\n".join(lines), ok


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpcdp check-exact", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="TOML config (default: the built-in job)")
    p.add_argument("--ranks", default="1,2", help="rank counts, e.g. 1,2,3,4 (default 1,2)")
    p.add_argument("--strategies", default="ddp", help="comma list: none, ddp, ps, ps-dedicated, "
                   "zero1, zero2, zero3 (default ddp)")
    p.add_argument("--steps", type=int, default=0, help="train.steps for every job (0: the config's)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="extra override for every job (e.g. train.exact_micro_batch=4)")
    p.add_argument("--restart-at", type=int, default=0, metavar="K",
                   help="also save at step K on the largest rank count and resume elsewhere")
    p.add_argument("--restart-ranks", type=int, default=0, metavar="Q", help="ranks of the resumed job")
    p.add_argument("--out", default=None, help="folder of the jobs' run directories (default: a new "
                   "runs/check-exact-<date>-<time>); one that holds an earlier check's results needs --replace")
    p.add_argument("--replace", action="store_true",
                   help="delete the earlier results in --out that this check's jobs would write over")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per job")
    return p


def run(args) -> int:
    ranks = parse_ranks(args.ranks)
    names = [s for s in args.strategies.split(",") if s]
    if not names:
        raise ValueError("--strategies: give at least one strategy")
    sets = {name: strategy_sets(name) for name in names}
    common = list(args.set) + ([f"train.steps={args.steps}", "train.epochs=0"] if args.steps else [])
    if bool(args.restart_at) != bool(args.restart_ranks):
        raise ValueError("--restart-at and --restart-ranks go together (e.g. --restart-at 10 --restart-ranks 3)")
    if args.restart_at < 0 or args.restart_ranks < 0:
        raise ValueError(f"--restart-at / --restart-ranks: need a step >= 1 and a rank count >= 1, "
                         f"got {args.restart_at} and {args.restart_ranks}")
    # Check the config once here, so bad input is one clear error, not N failed jobs.
    from hpcdp.config import load_config
    cfg = load_config(args.config, common + ['train.reproducible="exact"'] + sets[names[0]],
                      shared_options=True)
    if cfg.train.exact_micro_chosen:  # unset: one micro-batch size that every rank count holds
        from hpcdp.config import choose_micro_batch
        micro = choose_micro_batch(cfg.train.global_batch, ranks + [args.restart_ranks] * bool(args.restart_ranks))
        common.append(f"train.exact_micro_batch={micro}")
        print(f"train.exact_micro_batch unset: {micro} samples per micro-batch, so that each of "
              f"{', '.join(map(str, ranks))} rank(s) holds one (set it to choose)", flush=True)
    if args.restart_at and cfg.train.steps and args.restart_at >= cfg.train.steps:
        raise ValueError(f"--restart-at {args.restart_at}: save before the last step "
                         f"(train.steps = {cfg.train.steps}), e.g. --restart-at {cfg.train.steps // 2}")

    out = jobs_folder(args.out, [f"{name}-n{n}" for name in names for n in ranks]
                      + [f"{name}-restart" for name in names if args.restart_at]
                      + [f"{name}-n{max(ranks)}-checkpoints" for name in names if args.restart_at],
                      replace=args.replace)
    big = max(ranks)
    if args.restart_at and any(big < MIN_RANKS.get(name, 1) for name in names):
        raise ValueError("--restart-at: the largest rank count is too small for a strategy in --strategies")
    rows = []
    for name in names:
        for n in ranks:
            if n < MIN_RANKS.get(name, 1):
                print(f"  (skipped: {name} on {n} rank(s); it needs >= {MIN_RANKS[name]})", flush=True)
                continue
            extra = []
            ckdir = out / f"{name}-n{n}-checkpoints"
            if args.restart_at and n == big:
                extra = [f"checkpoint.every={args.restart_at}", f'checkpoint.dir="{ckdir}"',
                         "checkpoint.final=false"]
            rows.append({"label": f"{name} x{n}",
                         "hashes": _launch(args, n, common + sets[name] + extra, out / f"{name}-n{n}")})
        if args.restart_at:
            step_dir = out / f"{name}-n{big}-checkpoints" / f"step-{args.restart_at:08d}"
            label = f"{name} x{big}->x{args.restart_ranks} @{args.restart_at}"
            rows.append({"label": label, "hashes": _launch(args, args.restart_ranks, common + sets[name],
                                                           out / f"{name}-restart", resume=str(step_dir))})
    table, ok = format_table(rows)
    print(table)
    final = dict(rows[0]["hashes"])[max(dict(rows[0]["hashes"]))]
    if ok:
        print(f"exact: all {len(rows)} jobs agree; final weights sha256 {final}")
        return 0
    print("NOT exact: the jobs marked NO differ from the first job (* marks the differing hashes)")
    return 1


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except (ChildFailed, RuntimeError) as e:  # a job failed: its command and output's tail
        print(f"hpcdp check-exact: {e}", file=sys.stderr)
        return 2


__all__ = ["main", "format_table", "strategy_sets"]
