"""``hpcdp scale``: the scaling study and its cost model (docs/scaling.md).

    hpcdp scale --config FILE --ranks 1,2,4 [--study weak,strong]   weak/strong study (hpcdp.scale.study)
    hpcdp scale --study staleness|ps-bytes ...    parameter-server studies (hpcdp.scale.ps_study)
    hpcdp scale --study memory|zero-step ...      ZeRO studies (hpcdp.scale.zero_study)
    hpcdp scale --calibrate --out P.toml          measure a machine profile (hpcdp.scale.calibrate)
    hpcdp scale --predict --profile P             model only (hpcdp.scale.predict)
    hpcdp scale --validate --profile P            held-out points vs the model (hpcdp.scale.validate)
    hpcdp scale --collect DIR                     the table of points run as separate jobs
    hpcdp scale --reproduce NAME|all [--json F]   the model against published scaling tables (hpcdp.scale.reproduce)
    hpcdp scale --predict ... --node-mttf-h H     + checkpoint interval and goodput with failures (hpcdp.scale.goodput)

This module parses the options and hands them to the part of hpcdp.scale that runs them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def build_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="hpcdp scale", description="Weak- and strong-scaling study of a training config; the cost model's "
                                "calibrate, predict and validate (docs/scaling.md).")
    modes = p.add_mutually_exclusive_group()
    modes.add_argument("--calibrate", action="store_true",
                       help="measure this machine (or allocation) and write a profile (--out FILE.toml)")
    modes.add_argument("--predict", action="store_true",
                       help="model only: predicted step, bytes and efficiency per strategy (--profile)")
    modes.add_argument("--validate", action="store_true",
                       help="measure held-out points and compare with a profile's predictions")
    modes.add_argument("--collect", default="", metavar="DIR",
                       help="table and plot of the points gathered in DIR (a study job's folder)")
    modes.add_argument("--reproduce", default="", metavar="NAME",
                       help="predict a published scaling table from the inputs it gives and print "
                            "prediction, published figure and error per point: horovod, tf-ec2-k80, "
                            "all, or a table file written like hpcdp/scale/published/*.toml")
    p.add_argument("--json", default="", metavar="FILE",
                   help="--reproduce: also write the points as JSON records (source, point, published, "
                        "predicted, unit, error)")
    p.add_argument("--sweep", action="store_true",
                   help="--reproduce: also show how the errors move with each ASSUMED input of a table")
    p.add_argument("--config", default="", help="training config (TOML) to scale")
    p.add_argument("--ranks", default="1,2,4", help="rank counts, e.g. 1,2,4 (default)")
    p.add_argument("--nodes", default="",
                   help="node counts instead of --ranks (ranks = nodes x --ranks-per-node)")
    p.add_argument("--batch", type=int, default=0,
                   help="per-rank batch (weak) and global batch (strong); default: the "
                        "config's train.global_batch")
    p.add_argument("--steps", type=int, default=20, help="steps per child job")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds over all points; each point keeps its fastest round")
    p.add_argument("--study", default="weak,strong", help="weak, strong or both; or staleness / ps-bytes (parameter server); "
                        "or memory / zero-step (ZeRO)")
    p.add_argument("--variants", default="bucketed,per_param,no_overlap",
                   help="DDP modes for the weak sweep (bucketed is always run)")
    p.add_argument("--out", default="", help="output folder (default runs/scale-<time>)")
    p.add_argument("--bind", action="store_true", help="pass -bind-to core to mpiexec")
    p.add_argument("--launcher", default="",
                   help="launch command with {n} for the rank count, e.g. 'srun -n {n}' "
                        "inside a Slurm allocation (default: mpiexec -n {n})")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per child job")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="config override for every child job (repeatable)")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the compute-only runs (no contention/communication split)")
    p.add_argument("--profile", default="",
                   help="machine profile (TOML file or shipped name): predict every point")
    p.add_argument("--calibrate-first", action="store_true",
                   help="a study without --profile: calibrate one first (OUT/profile.toml, "
                        "contention at 1 and --ranks-per-node ranks) and predict every point")
    p.add_argument("--inter", action="store_true",
                   help="--calibrate: also measure the inter-node link (2 nodes, 1 rank each; "
                        "needs an allocation and --launcher with {nodes} and {ppn})")
    p.add_argument("--overlap", type=float, default=0.0,
                   help="--calibrate: fraction of communication that can run under compute "
                        "(0: the CPU that computes moves the bytes, as with shared-memory "
                        "MPI here; 1: a NIC or DMA engine does)")
    p.add_argument("--strategies", default="ddp-ring,ddp-hierarchical,ddp-auto,ps1,ps8,zero1,zero2,zero3",
                   help="--predict: ddp-ring|ddp-recursive|ddp-hierarchical|ddp-auto, psK, zero1-3 "
                        "(the ring) or zeroK-recursive|zeroK-hierarchical|zeroK-auto")
    p.add_argument("--node-mttf-h", type=float, default=0.0, metavar="HOURS",
                   help="--predict: a node's mean time to failure; adds the checkpoint interval "
                        "(Young / Daly) and the goodput per rank count, for the classic policy (end, "
                        "requeue, resume) and for a job that keeps training through a rank loss")
    p.add_argument("--ckpt-save-s", type=float, default=None, metavar="SECONDS",
                   help="--node-mttf-h: the training time one checkpoint save costs")
    p.add_argument("--ckpt-bench", default="", metavar="FILE",
                   help="--node-mttf-h: take the save's cost from hpcdp bench ckpt --json FILE "
                        "(its stall per save; --ckpt-mode picks sync, thread or process, default "
                        "the mode that stalls least)")
    p.add_argument("--ckpt-mode", default="", choices=["", "sync", "thread", "process"],
                   help="see --ckpt-bench")
    p.add_argument("--restart-s", type=float, default=300.0, metavar="SECONDS",
                   help="--node-mttf-h: the classic policy's cost of a restart (requeue, launch, "
                        "restore; default 300)")
    p.add_argument("--repair-s", type=float, default=3.0, metavar="SECONDS",
                   help="--node-mttf-h: the continue mode's repair after a rank loss, detection to "
                        "the first committed step (default 3: issue 36's aim, not a measurement)")
    p.add_argument("--rejoin-s", type=float, default=None, metavar="SECONDS",
                   help="--node-mttf-h: until a lost node is back in a continuing job (default: "
                        "--restart-s)")
    p.add_argument("--fatal-fraction", type=float, default=0.0,
                   help="--node-mttf-h: share of failures a continuing job cannot survive (handled "
                        "the classic way, with checkpoints; default 0)")
    p.add_argument("--goodput-strategy", default="",
                   help="--node-mttf-h: whose predicted step to use (default the first of --strategies)")
    p.add_argument("--zero-algorithms", default="ring",
                   help="--study zero-step: parallel.zero.algorithm values to run stages 1-3 "
                        "with, e.g. ring,recursive,auto (default ring)")
    p.add_argument("--probe-max", default="",
                   help="--calibrate: largest message of the link probe; --validate: refit "
                        "the profile's link on its recorded probe up to this size (e.g. 256K: "
                        "calibrate on small messages, predict large ones)")
    p.add_argument("--reuse", action="store_true",
                   help="--validate: take the measurements already in --out (from an earlier "
                        "--validate) and predict them with --profile")
    p.add_argument("--statistic", default="auto", choices=["auto", "fastest", "steady", "median"],
                   help="--validate: a collective point's figure from its repeats: fastest, "
                        "median, steady (the fastest not below 3/4 of its bytes' time at the "
                        "link's rate: drops a rate-limited link's burst) or auto (default: "
                        "steady where the ranks span nodes, fastest within a node)")
    p.add_argument("--no-study", action="store_true",
                   help="--validate: the collectives only (no training study)")
    p.add_argument("--sizes", default="8:64M",
                   help="--validate: allreduce sizes MIN:MAX (x4 steps)")
    p.add_argument("--iters", type=int, default=200,
                   help="--validate: at most this many timed calls per collective point, "
                        "over all rounds (default 200; the bench's by-size count when lower)")
    p.add_argument("--description", default="", help="--calibrate: one line for the profile")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="LOAD",
                   help="before each round, wait until the 1-minute load average is below "
                        "LOAD (a shared machine; at most --wait-max seconds)")
    p.add_argument("--wait-max", type=float, default=1800.0, help="see --wait-quiet")
    p.add_argument("--ranks-per-node", type=int, default=0,
                   help="ranks per node: {nodes}/{ppn} in --launcher and the model's node "
                        "layout (default: all ranks on one node)")
    return p



def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.collect:
        from hpcdp.scale.collect import run as collect
        collect(args)
        return 0
    if args.reproduce:
        from hpcdp.scale.reproduce import run as reproduce
        reproduce(args)  # a bad name or table: ValueError, one error line (exit 2)
        return 0
    if not args.config:
        raise SystemExit("hpcdp scale: --config FILE is required (the training config to study)")
    if args.calibrate_first and not args.profile and not args.calibrate:
        # a study job without a profile: measure one here first, into the results folder
        from argparse import Namespace

        from hpcdp.scale.calibrate import run as calibrate
        out = Path(args.out or f"runs/scale-{time.strftime('%Y%m%d-%H%M%S')}")
        per = args.ranks_per_node or 2
        calibrate(Namespace(**{**vars(args), "out": str(out / "profile.toml"),
                               "ranks": f"1,{per}" if per > 1 else "1"}))
        args.profile, args.out = str(out / "profile.toml"), str(out)
    if args.calibrate:
        from hpcdp.scale.calibrate import run as calibrate
        calibrate(args)
    elif args.predict:
        from hpcdp.scale.predict import run as predict
        predict(args)
    elif args.validate:
        from hpcdp.scale.validate import run as validate
        validate(args)
    else:
        from hpcdp.scale.study import run
        run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
