"""``hpcdp bench collectives``: OSU/NCCL-tests style tables, hpcdp vs MPI, per collective.

Run under mpiexec, e.g.::

    mpiexec -n 2 hpcdp bench collectives --collective all --json runs/coll_2.json
    mpiexec -n 2 python -m hpcdp.bench.collectives --collective reduce_scatter --min 8 --max 64M

For each collective, message size and algorithm it times ``iters`` back-to-back
calls (after ``warmup`` untimed ones and a barrier), takes each rank's mean, keeps
the slowest rank's, and repeats that in ``repeats`` interleaved rounds (every
algorithm once per round, so a load spike on a shared machine hits all of them);
the table shows the median round (time and bandwidth). The size S is the full buffer (NCCL-tests'
convention: the allreduce buffer, reduce-scatter's input, all-gather's output).
Columns, as NCCL-tests define them:

- ``algbw = S / t`` (bytes of the buffer per second)
- ``busbw = algbw * factor``: the per-link bandwidth a ring needs for that time,
  comparable across world sizes and with the hardware's: factor 2(N-1)/N for
  allreduce, (N-1)/N for reduce-scatter and all-gather
- ``vs_mpi``: the median over rounds of ``t / t(MPI)`` in the same round (below 1:
  faster than MPI; a ratio of paired rounds, not of two medians), and ``q1-q3`` its
  interquartile range over the rounds: a cell whose range straddles 1 is not decided
  by this run (more rounds, or a quieter machine)

Algorithms: ``mpi`` (blocking ``Allreduce`` / ``Reduce_scatter`` / ``Allgatherv``,
the baseline), ``native`` (MPI's non-blocking collective polled under hpcdp's
timeout), ``ring``, ``recursive`` (allreduce only), ``auto``, ``hierarchical``
(allreduce only; nodes from shared memory or ``HPCDP_RANKS_PER_NODE``; not in the
default list). All out of place, like OSU's benchmarks. The JSON holds every row
plus the environment (world size, MALLOC_* variables, library versions, load average).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

ALGORITHMS = ("mpi", "native", "ring", "recursive", "auto", "hierarchical", "bruck")
DEFAULT_ALGORITHMS = ("mpi", "native", "ring", "recursive", "auto")
ONLY = {"bruck": ("all_gather",)}  # algorithms of some collectives only
COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather")


def busbw_factor(collective: str, N: int) -> float:
    """NCCL-tests' bus-bandwidth factor of ``collective`` on ``N`` ranks."""
    return (2 if collective == "allreduce" else 1) * (N - 1) / N


def usage_error(prog: str, msg: str):
    """One line on stderr (rank 0 only under a launcher) and exit status 2, before any
    MPI work: every rank checks the same arguments, so every rank exits."""
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    if rank == "0":
        print(f"{prog}: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        usage_error("hpcdp bench collectives", f"{text!r} is not a size in bytes (e.g. 8, 4K, 64M)")


def human(n: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _parser():
    p = argparse.ArgumentParser(prog="hpcdp bench collectives", description=__doc__.split("\n")[0])
    p.add_argument("--collective", default="allreduce", choices=COLLECTIVES + ("all",),
                   help="which collective to time (default allreduce; all: each in turn)")
    p.add_argument("--min", default="8", help="smallest message in bytes (e.g. 8, 4K)")
    p.add_argument("--max", default="64M", help="largest message in bytes (e.g. 64M)")
    p.add_argument("--factor", type=int, default=4, help="size step factor, >= 2 (default 4)")
    p.add_argument("--algorithms", default=",".join(DEFAULT_ALGORITHMS),
                   help=f"comma-separated subset of {','.join(ALGORITHMS)}")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--segment-bytes", default="1M", help="ring segment size (pipelining)")
    p.add_argument("--iters", type=int, default=0, help="timed iterations (0: by size)")
    p.add_argument("--max-iters", type=int, default=2000,
                   help="at most this many timed iterations per point when --iters is 0 "
                        "(by size: about 0.2 s of traffic, 10-2000; default 2000)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5,
                   help="rounds, >= 1; each round times every algorithm in turn, the table shows "
                        "the median round (robust to other jobs on a shared machine)")
    p.add_argument("--engine", default=None, choices=("python", "compiled"),
                   help="the ring's engine (default: HPCDP_COMM_ENGINE, else compiled wherever mpi4py's MPI "
                        "library can be bound, else python)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds a rank waits for the others before the job ends naming the missing "
                        "ranks (default: HPCDP_COMM_TIMEOUT, else 300)")
    p.add_argument("--json", default=None, help="write the rows here (rank 0)")
    return p


def check_args(args) -> dict:
    """Validate the arguments before any MPI work; a clear SystemExit otherwise.
    Returns the parsed values (sizes, dtype, algorithms)."""
    def bad(msg):
        usage_error("hpcdp bench collectives", msg)

    if args.factor < 2:
        bad(f"--factor must be an integer >= 2 (the size grows by it each row), got {args.factor}")
    if args.repeats < 1:
        bad(f"--repeats must be >= 1, got {args.repeats}")
    if args.iters < 0 or args.warmup < 0:
        bad(f"--iters and --warmup must be >= 0, got {args.iters} and {args.warmup}")
    if args.max_iters < 1:
        bad(f"--max-iters must be >= 1, got {args.max_iters}")
    if args.timeout is not None and not 1.0 <= args.timeout <= 604800.0:
        bad(f"--timeout must be between 1 and 604800 seconds, got {args.timeout:g}")
    lo, hi, seg = parse_size(args.min), parse_size(args.max), parse_size(args.segment_bytes)
    if lo < 1 or hi < lo:
        bad(f"--min must be >= 1 and --max >= --min, got --min {args.min} --max {args.max}")
    if seg < 1:
        bad(f"--segment-bytes must be >= 1, got {args.segment_bytes}")
    try:
        dtype = np.dtype(args.dtype)
    except TypeError:
        bad(f"--dtype {args.dtype!r} is not a NumPy dtype (e.g. float32)")
    if dtype.kind not in "fiu":
        bad(f"--dtype must be numeric (float16/32/64, int32/64), got {dtype}")
    algos = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    unknown = [a for a in algos if a not in ALGORITHMS]
    if unknown or not algos:
        bad(f"--algorithms: unknown {unknown or algos}; choose from {','.join(ALGORITHMS)}")
    if "mpi" not in algos:
        algos = ["mpi"] + algos  # the ratio column needs the baseline
    collectives = COLLECTIVES if args.collective == "all" else (args.collective,)
    return {"lo": lo, "hi": hi, "seg": seg, "dtype": dtype, "algos": algos,
            "collectives": collectives}


def _iters(nbytes: int, fixed: int, most: int = 2000) -> int:
    if fixed:
        return fixed
    # about 0.2 s of traffic at ~1 GB/s, between 10 and 2000 (at most ``most``) iterations
    return int(min(2000, most, max(10, (200 << 20) // max(nbytes, 1))))


def paired_ratios(times, baseline) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) over the rounds of each round's time
    over the baseline's time in the same round: the rounds interleave every algorithm,
    so a load spike or a slow spell of the machine that spans a round divides out
    instead of landing on one side of the ratio (as with a ratio of two medians)."""
    ratios = [t / b for t, b in zip(times, baseline)]
    q1, med, q3 = np.percentile(ratios, (25, 50, 75))
    return float(q1), float(med), float(q3)


def _time(fn, iters: int, warmup: int, comm, watch=None, what: str = "") -> float:
    """The slowest rank's mean time of ``fn``. The MPI baseline's calls block in MPI:
    ``watch`` (a BlockingWatch) ends the job naming a rank that stopped meanwhile;
    the barrier and the reduction of the times are hpcdp's (deadline, diagnosis)."""
    import hpcdp.comm as C

    if watch is not None:
        watch.arm(what)
    try:
        for _ in range(warmup):
            fn()
        C.allreduce(np.zeros(1), comm=comm, op="max")  # the barrier, under hpcdp's deadline
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        mine = np.array([(time.perf_counter() - t0) / iters])
        C.allreduce(mine, comm=comm, op="max")
    finally:
        if watch is not None:
            watch.disarm()
    return float(mine[0])


def _calls(collective, algos, comm, nbytes, dtype, seg):
    """{algorithm: fn} for one collective on buffers of ``nbytes`` (out of place)."""
    from mpi4py import MPI

    import hpcdp.comm as C
    from hpcdp.shard import shard_bounds

    N, rank = comm.Get_size(), comm.Get_rank()
    n = nbytes // dtype.itemsize
    T = MPI.Datatype.fromcode(dtype.char)
    bounds = shard_bounds(n, N)
    counts, displs = [s for _, s in bounds], [o for o, _ in bounds]
    full = (np.arange(n) % 7 + rank).astype(dtype)
    out = np.empty_like(full)
    chunk = np.ones(counts[rank], dtype=dtype)
    fns = {}
    for algo in algos:
        if collective == "allreduce":
            if algo == "mpi":
                fns[algo] = lambda: comm.Allreduce([full, T], [out, T], MPI.SUM)
            elif collective in ONLY.get(algo, COLLECTIVES):
                fns[algo] = lambda a=algo: C.allreduce(full, out, comm=comm, algorithm=a, segment_bytes=seg)
        elif collective == "reduce_scatter":
            if algo == "mpi":
                fns[algo] = lambda: comm.Reduce_scatter([full, T], [chunk, T], counts, MPI.SUM)
            elif collective in ONLY.get(algo, COLLECTIVES):
                fns[algo] = lambda a=algo: C.reduce_scatter(full, chunk, comm=comm, algorithm=a,
                                                            segment_bytes=seg)
        else:
            if algo == "mpi":
                fns[algo] = lambda: comm.Allgatherv([chunk, T], [out, counts, displs, T])
            elif collective in ONLY.get(algo, COLLECTIVES):
                fns[algo] = lambda a=algo: C.all_gather(chunk, out, comm=comm, algorithm=a,
                                                        segment_bytes=seg)
    return fns


def run(args) -> list[dict]:
    opts = check_args(args)
    from mpi4py import MPI

    from hpcdp.comm import get_context

    comm = MPI.COMM_WORLD
    N, rank = comm.Get_size(), comm.Get_rank()
    get_context(comm)
    from hpcdp.comm import set_timeout
    from hpcdp.comm import default_timeout, grace_s
    from hpcdp.failure.deadline import BlockingWatch

    timeout = float(args.timeout) if args.timeout is not None else default_timeout()
    set_timeout(comm, timeout)
    # hpcdp's collectives time out and name a stopped rank themselves; the MPI
    # baseline blocks in MPI: the watch ends the job then (after hpcdp's diagnosis)
    watch = BlockingWatch(comm, timeout, margin=2 * grace_s(timeout) + 1.0) if N > 1 else None
    try:
        rows = _run(args, opts, comm, watch)
    except BaseException:
        if watch is not None:
            watch.close(free=False)  # failing: the peers may be gone
        raise
    if watch is not None:
        watch.close()
    return rows


def _run(args, opts, comm, watch) -> list[dict]:
    from mpi4py import MPI

    N, rank = comm.Get_size(), comm.Get_rank()
    from hpcdp.comm import active_engine, set_engine

    if args.engine is not None:
        set_engine(comm, args.engine)
    engine = active_engine(comm)
    dtype, seg = opts["dtype"], opts["seg"]
    sizes = []
    s = max(opts["lo"], dtype.itemsize)
    while s <= opts["hi"]:
        sizes.append(s)
        s *= args.factor
    rows = []
    for collective in opts["collectives"]:
        factor = busbw_factor(collective, N)
        if rank == 0:
            load = os.getloadavg()
            print(f"# hpcdp bench collectives: {collective}, {N} ranks, {dtype.name}, out of place, "
                  f"segment {human(seg)}B, engine {engine}, MALLOC_MMAP_MAX_={os.environ.get('MALLOC_MMAP_MAX_', 'unset')}, "
                  f"load average {load[0]:.2f}")
            print(f"{'size':>8} {'algorithm':>10} {'time_us':>11} {'algbw_GB/s':>11} "
                  f"{'busbw_GB/s':>11} {'vs_mpi':>7} {'q1-q3':<11}")
        for nbytes in sizes:
            fns = _calls(collective, opts["algos"], comm, nbytes, dtype, seg)
            iters = max(1, _iters(nbytes, args.iters, args.max_iters) // args.repeats)
            samples = {algo: [] for algo in fns}
            for _ in range(args.repeats):  # interleaved, so load spikes hit every algorithm
                for algo, fn in fns.items():
                    samples[algo].append(_time(fn, iters, args.warmup, comm, watch,
                                               f"{collective} of {human(nbytes)}B by {algo}"))
            for algo in fns:
                t = float(np.median(samples[algo]))
                q1, vs, q3 = paired_ratios(samples[algo], samples["mpi"])
                algbw = nbytes / t / 1e9
                row = {"collective": collective, "size": nbytes, "algorithm": algo,
                       "time_us": t * 1e6, "algbw_GBps": algbw, "busbw_GBps": algbw * factor,
                       "vs_mpi": vs, "vs_mpi_q1": q1, "vs_mpi_q3": q3,
                       "iters": iters, "repeats": args.repeats,
                       "samples_us": [v * 1e6 for v in samples[algo]]}
                rows.append(row)
                if rank == 0:
                    print(f"{human(nbytes):>8} {algo:>10} {t * 1e6:11.2f} {algbw:11.3f} "
                          f"{algbw * factor:11.3f} {vs:7.2f} {q1:5.2f}-{q3:<5.2f}", flush=True)
    if rank == 0 and args.json:
        meta = {"world_size": N, "dtype": dtype.name, "segment_bytes": seg, "engine": engine,
                "collectives": list(opts["collectives"]),
                "MALLOC_MMAP_MAX_": os.environ.get("MALLOC_MMAP_MAX_"),
                "MALLOC_TRIM_THRESHOLD_": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
                "mpi": MPI.Get_library_version().splitlines()[0].strip(),
                "machine": platform.machine(), "cpus": os.cpu_count(),
                "loadavg": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M")}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return rows


def main(argv=None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    check_args(args)  # before any MPI work: a usage error exits 2 on every rank alike
    from hpcdp.failure.policy import run_job

    # a failure on one rank (a stopped or lost peer) ends every rank with one line
    return run_job(lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
