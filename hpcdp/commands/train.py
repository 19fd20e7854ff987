"""``hpcdp train [--config FILE.toml] [--set section.key=value ...] [--resume DIR|latest]``:
train a model (one rank, or every rank of an mpiexec/srun launch), under the job's failure
policy (hpcdp.failure.policy: a failure on one rank ends every rank)."""

from __future__ import annotations

import argparse


KEYS_HELP = """config keys: every key, its default and allowed values are in
  docs/user-guide.md, "The config file";
  hpcdp train --print-config [--config FILE] [--set ...] prints the resolved config
  (every key) without training."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpcdp train", description="Train a model (one rank, or "
                                "every rank of an mpiexec/srun launch).", epilog=KEYS_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="TOML config file (default: the built-in digits MLP job)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config key; the value is TOML (e.g. 0.05, true, [64, 10], \"s\")")
    p.add_argument("--resume", metavar="DIR|latest",
                   help="continue from a checkpoint: a step-* directory, a folder of them (its newest "
                        "complete one), a run directory, or 'latest' (the newest in checkpoint.dir)")
    p.add_argument("--print-config", action="store_true",
                   help="print the resolved config (every key, as TOML) and exit without training; "
                        "a bad key or value is the same one-line error as in training")
    return p


def print_config(args) -> int:
    """``--print-config``: the config a run would resolve (the file, the overrides, the
    defaults, the seeds filled in) as TOML on stdout, the warning line on stderr; no MPI."""
    import sys

    from hpcdp.config import dump_toml, load_config

    cfg = load_config(args.config, args.set)
    for line in cfg.warnings:
        print(line, file=sys.stderr)
    sys.stdout.write(dump_toml(cfg.to_dict()))
    return 0


def main(argv=None, *, build_strategy=None) -> int:
    """``build_strategy``: the strategy factory the run uses (default
    hpcdp.strategies.build_strategy); the compute-only baseline of ``hpcdp scale`` passes
    its own (hpcdp.scale.compute_only)."""
    args = build_parser().parse_args(argv)
    if args.print_config:
        return print_config(args)
    from hpcdp.failure.policy import run_job

    def train():
        from hpcdp.train import main_train
        main_train(args.config, args.set, resume=args.resume, build_strategy=build_strategy)

    return run_job(train)
