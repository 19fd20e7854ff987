"""The ``hpcdp`` command: finds the subcommand's module (hpcdp/commands/) and runs it.

    hpcdp train [--config FILE.toml] [--set section.key=value ...]
    hpcdp train --print-config [--config FILE] [--set ...]   the resolved config, every key; no training
    hpcdp bench step [options]          training-step time vs hand-written NumPy / PyTorch
    hpcdp bench collectives [options]   OSU-style table of the collectives (under mpiexec)
    hpcdp bench faults [options]        fault-injection table: how jobs end when a rank fails
    hpcdp bench soak --config FILE      resident memory of every rank over a long run
    hpcdp bench data [options]          on-disk loader throughput and time waiting for data
    hpcdp bench comm-overhead [options] one small collective's time by layer (under mpiexec)
    hpcdp bench startup [options]       launch to first step and to exit, per rank count
    hpcdp bench exact [options]         exact vs fast mode: step time, bytes, loss curves
    hpcdp bench ckpt [options]          checkpoint write/read bandwidth vs dd, save stall
    hpcdp bench threads [options]       ranks sharing a node: one thread per rank vs node-wide pools
    hpcdp scale --config FILE --ranks 1,2,4   scaling study (launches mpiexec jobs)
    hpcdp data prepare --text PATH... --out corpus.h5   tokenize text for data.kind = "tokens"
    hpcdp data train-tokenizer --text PATH... --vocab-size V --out tokenizer.json   a byte-level BPE
    hpcdp data info corpus.h5           describe a token corpus
    hpcdp check-exact --config FILE --ranks 1,2,3,4 [--strategies ddp,ps]   exact mode's hashes agree?
    hpcdp ckpt {ls,info,verify,export} ...    inspect, check and export checkpoints
    hpcdp sample --resume DIR|latest [--prompt TEXT]   generate from a checkpoint's GPT (one process)
    hpcdp plot RUN... [--out plot.png]   loss, throughput, communication time and bytes against step

Bad input (config, data files, a launch without a strategy) prints one error line
on rank 0, without a traceback, and exits with status 2 on every rank. A failure on
any rank during training ends every rank within seconds, the failing rank printing
one line (hpcdp.failure.policy; docs/user-guide.md, "When things go wrong"). Set
``HPCDP_TRACEBACK=1`` to see the traceback.
"""

from __future__ import annotations

import os
import sys

USAGE_ERROR = 2


def _rank() -> int:
    """This process's MPI rank, without initializing MPI (launcher env, else mpi4py)."""
    from hpcdp.launch import RANK_VARS

    for var in RANK_VARS:
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


# NAME of ``hpcdp NAME``: the module ``hpcdp.commands.<NAME with - as _>`` (its main(argv) -> int)
COMMANDS = ("train", "bench", "scale", "data", "check-exact", "ckpt", "sample", "plot")


def command_module(name: str) -> str:
    """The module that runs ``hpcdp NAME`` (hpcdp/commands/, one file per subcommand)."""
    return "hpcdp.commands." + name.replace("-", "_")


def _one_thread_per_rank_under_a_launcher() -> None:
    """Several ranks on one node each start a BLAS/numba/OpenMP thread pool as wide as
    the node: they then fight for the cores. When the launcher says that several ranks
    share this node (or does not say how many), default every pool the user left unset
    to one thread (SLURM_CPUS_PER_TASK if set), before numpy is imported, as torchrun
    does, and say so in one line on rank 0. A user's own setting wins; one rank per node
    keeps the libraries' own defaults (every core)."""
    from hpcdp.launch import THREAD_VARS, launched_rank, local_ranks

    rank, size = launched_rank()
    launched = any(os.environ.get(v) for v in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",
                                                "SLURM_STEP_NUM_TASKS"))
    if not launched:
        return
    local = local_ranks()
    if local is None:
        local = size  # not said: assume the ranks share a node (the safe side)
    if local <= 1:
        return
    threads = os.environ.get("SLURM_CPUS_PER_TASK", "1")
    unset = [v for v in THREAD_VARS if not os.environ.get(v)]
    for var in unset:
        os.environ[var] = threads
    if unset and rank == 0:
        print(f"hpcdp: {local} ranks share this node: {threads} thread(s) per rank ("
              + " ".join(f"{v}={threads}" for v in unset) + "; set them to choose)", flush=True)


def main(argv=None) -> int:
    """``hpcdp ARGV``; its output cut short by a pipe (``hpcdp ckpt info X | head``)
    ends it quietly (status 141, as the shell reports SIGPIPE), without a traceback."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, not at exit, so that a closed pipe is caught
        return status
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 141


def _watch_the_rank() -> None:
    """Under a launcher with several ranks, a watcher process names this rank if a
    signal kills it (hpcdp.failure.watch); ``HPCDP_WATCH=0``: no watcher."""
    from hpcdp.failure import watch
    from hpcdp.launch import launched_rank

    rank, size = launched_rank()
    if size > 1 and watch.enabled():
        watch.watch(rank, size)


def _main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _one_thread_per_rank_under_a_launcher()
    from hpcdp.failure.transport import leave_peer_loss_to_hpcdp
    leave_peer_loss_to_hpcdp()  # before MPI starts: hpcdp's deadline finds a lost peer
    if argv[:1] in (["-V"], ["--version"]):
        from hpcdp import __version__
        print(f"hpcdp {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        asked = argv[:1] in (["-h"], ["--help"])
        out = sys.stdout if asked else sys.stderr
        print("usage: hpcdp COMMAND [options]   (hpcdp COMMAND --help for its options; hpcdp --version)\n",
              file=out)
        print(__doc__.strip().split("\n\n")[1], file=out)
        if argv and not asked:
            import difflib
            close = difflib.get_close_matches(argv[0], COMMANDS, n=1)
            print(f"\nhpcdp: error: unknown command {argv[0]!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
                  file=out)
        elif not argv:
            print("\nhpcdp: error: no command given", file=out)
        return 0 if asked else USAGE_ERROR
    if argv[0] == "train":
        _watch_the_rank()
    import importlib

    from hpcdp.launch import ChildFailed

    try:
        return importlib.import_module(command_module(argv[0])).main(argv[1:]) or 0
    except (ValueError, FileNotFoundError) as e:  # ConfigError, DataError and setup errors
        return _user_error(e)
    except ChildFailed as e:  # a job a tool launched failed: its command and output's tail
        if os.environ.get("HPCDP_TRACEBACK"):
            raise
        print(f"hpcdp {argv[0]}: {e}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
