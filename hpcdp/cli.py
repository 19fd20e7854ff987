"""The ``hpcdp`` command.

    hpcdp train [--config FILE.toml] [--set section.key=value ...]
    hpcdp bench step [options]          training-step time vs hand-written NumPy / PyTorch
    hpcdp bench collectives [options]   OSU-style table of the collectives (under mpiexec)
    hpcdp bench faults [options]        fault-injection table: how jobs end when a rank fails
    hpcdp bench soak --config FILE      resident memory of every rank over a long run
    hpcdp bench data [options]          on-disk loader throughput and time waiting for data
    hpcdp bench comm-overhead [options] one small collective's time by layer (under mpiexec)
    hpcdp bench startup [options]       launch to first step and to exit, per rank count
    hpcdp bench exact [options]         exact vs fast mode: step time, bytes, loss curves
    hpcdp bench ckpt [options]          checkpoint write/read bandwidth vs dd, save stall
    hpcdp scale --config FILE --ranks 1,2,4   scaling study (launches mpiexec jobs)
    hpcdp data prepare --text PATH... --out corpus.h5   tokenize text for data.kind = "tokens"
    hpcdp data info corpus.h5           describe a token corpus
    hpcdp check-exact --config FILE --ranks 1,2,3,4 [--strategies ddp,ps]   exact mode's hashes agree?
    hpcdp ckpt {ls,info,verify,export} ...    inspect, check and export checkpoints
    hpcdp sample --resume DIR|latest [--prompt TEXT]   generate from a checkpoint's GPT (one process)

Bad input (config, data files, a launch without a strategy) prints one error line
on rank 0, without a traceback, and exits with status 2 on every rank. A failure on
any rank during training ends every rank within seconds, the failing rank printing
one line (hpcdp.failure.policy; docs/user-guide.md, "When things go wrong"). Set
``HPCDP_TRACEBACK=1`` to see the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

USAGE_ERROR = 2


def _rank() -> int:
    """This process's MPI rank, without initializing MPI (launcher env, else mpi4py)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank()
    return 0


def _user_error(e: BaseException) -> int:
    if os.environ.get("HPCDP_TRACEBACK"):
        raise e
    if _rank() == 0:
        print(f"hpcdp: error: {e}", file=sys.stderr, flush=True)
    return USAGE_ERROR


def _train(argv) -> int:
    p = argparse.ArgumentParser(prog="hpcdp train", description="Train a model (one rank, or "
                                "every rank of an mpiexec/srun launch).")
    p.add_argument("--config", help="TOML config file (default: the built-in digits MLP job)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config key; the value is TOML (e.g. 0.05, true, [64, 10], \"s\")")
    p.add_argument("--resume", metavar="DIR|latest",
                   help="continue from a checkpoint: a step-* directory, a folder of them (its newest "
                        "complete one), a run directory, or 'latest' (the newest in checkpoint.dir)")
    args = p.parse_args(argv)
    from hpcdp.failure.policy import run_job

    def train():
        from hpcdp.train import main_train
        main_train(args.config, args.set, resume=args.resume)

    return run_job(train)


def _bench(argv) -> int:
    commands = {"step": "hpcdp.bench.step", "collectives": "hpcdp.bench.collectives",
                "faults": "hpcdp.bench.faults", "soak": "hpcdp.bench.soak", "data": "hpcdp.bench.data",
                "comm-overhead": "hpcdp.bench.comm_overhead", "startup": "hpcdp.bench.startup",
                "exact": "hpcdp.exact.bench", "ckpt": "hpcdp.bench.ckpt"}
    if not argv or argv[0] not in commands:
        print(f"usage: hpcdp bench {{{','.join(commands)}}} [options]", file=sys.stderr)
        return USAGE_ERROR
    import importlib

    return importlib.import_module(commands[argv[0]]).main(argv[1:]) or 0


def _data(argv) -> int:
    from hpcdp.data.command import main as data_main

    return data_main(argv)


def _scale(argv) -> int:
    from hpcdp.bench.scale import main as scale_main

    return scale_main(argv) or 0


def _check_exact(argv) -> int:
    from hpcdp.exact.check import main as check_main

    return check_main(argv)


def _ckpt(argv) -> int:
    from hpcdp.io.cli import main as ckpt_main

    return ckpt_main(argv)


def _sample(argv) -> int:
    from hpcdp.sample_command import main as sample_main

    return sample_main(argv)


def _one_thread_per_rank_under_a_launcher() -> None:
    """Several ranks on one node each start a BLAS/numba thread pool as wide as the
    node: they then fight for the cores. Under an MPI launcher, default every pool to
    one thread (before numpy is imported); a user's own setting wins."""
    launched = any(os.environ.get(v) for v in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                                                "SLURM_STEP_NUM_TASKS"))
    if launched:
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
            os.environ.setdefault(var, os.environ.get("SLURM_CPUS_PER_TASK", "1"))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _one_thread_per_rank_under_a_launcher()
    commands = {"train": _train, "bench": _bench, "scale": _scale, "data": _data,
                "check-exact": _check_exact, "ckpt": _ckpt, "sample": _sample}
    if argv[:1] in (["-V"], ["--version"]):
        from hpcdp import __version__
        print(f"hpcdp {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        asked = argv[:1] in (["-h"], ["--help"])
        out = sys.stdout if asked else sys.stderr
        print("usage: hpcdp COMMAND [options]   (hpcdp COMMAND --help for its options; hpcdp --version)\n",
              file=out)
        print(__doc__.strip().split("\n\n")[1], file=out)
        if argv and not asked:
            import difflib
            close = difflib.get_close_matches(argv[0], commands, n=1)
            print(f"\nhpcdp: error: unknown command {argv[0]!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
                  file=out)
        elif not argv:
            print("\nhpcdp: error: no command given", file=out)
        return 0 if asked else USAGE_ERROR
    try:
        return commands[argv[0]](argv[1:])
    except (ValueError, FileNotFoundError) as e:  # ConfigError, DataError and setup errors
        return _user_error(e)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
