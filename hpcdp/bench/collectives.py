"""``hpcdp bench collectives``: an OSU-style allreduce table, hpcdp vs MPI.

Run under mpiexec, e.g.::

    mpiexec -n 2 hpcdp bench collectives --json runs/coll_2.json
    mpiexec -n 2 python -m hpcdp.bench.collectives --min 8 --max 64M

For each message size and algorithm it times ``iters`` back-to-back allreduces
(after ``warmup`` untimed ones and a barrier), takes each rank's mean, keeps the
slowest rank's, and repeats that in ``repeats`` interleaved rounds (every
algorithm once per round); the table shows the median round. Columns, as NCCL-tests define them:

- ``algbw = S / t`` (bytes of the buffer per second)
- ``busbw = algbw * 2(N-1)/N``: the per-link bandwidth a ring needs for that time,
  comparable across world sizes and with the hardware's bandwidth
- ``vs_mpi = t / t(MPI_Allreduce)`` in the same run (below 1: faster than MPI)

Algorithms: ``mpi`` (blocking ``comm.Allreduce``, the baseline), ``native``
(MPI's Iallreduce polled under hpcdp's timeout), ``ring``, ``recursive``,
``auto``. All out of place, like OSU's osu_allreduce. The JSON holds every row
plus the environment (world size, MALLOC_* variables, library versions).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

ALGORITHMS = ("mpi", "native", "ring", "recursive", "auto")


def parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def human(n: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _parser():
    p = argparse.ArgumentParser(prog="hpcdp bench collectives", description=__doc__.split("\n")[0])
    p.add_argument("--min", default="8", help="smallest message in bytes (e.g. 8, 4K)")
    p.add_argument("--max", default="64M", help="largest message in bytes (e.g. 64M)")
    p.add_argument("--factor", type=int, default=4, help="size step factor (default 4)")
    p.add_argument("--algorithms", default=",".join(ALGORITHMS),
                   help=f"comma-separated subset of {','.join(ALGORITHMS)}")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--segment-bytes", default="1M", help="ring segment size (pipelining)")
    p.add_argument("--iters", type=int, default=0, help="timed iterations (0: by size)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5,
                   help="rounds; each round times every algorithm in turn, the table shows "
                        "the median round (robust to other jobs on a shared machine)")
    p.add_argument("--json", default=None, help="write the rows here (rank 0)")
    return p


def _iters(nbytes: int, fixed: int) -> int:
    if fixed:
        return fixed
    # about 0.2 s of traffic at ~1 GB/s, between 10 and 2000 iterations
    return int(min(2000, max(10, (200 << 20) // max(nbytes, 1))))


def _time(fn, iters: int, warmup: int, comm) -> float:
    for _ in range(warmup):
        fn()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    mine = (time.perf_counter() - t0) / iters
    return comm.allreduce(mine, op=__import__("mpi4py").MPI.MAX)


def run(args) -> list[dict]:
    from mpi4py import MPI

    from hpcdp.comm import allreduce, get_context

    comm = MPI.COMM_WORLD
    N, rank = comm.Get_size(), comm.Get_rank()
    get_context(comm)
    algos = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    bad = [a for a in algos if a not in ALGORITHMS]
    if bad:
        raise SystemExit(f"--algorithms: unknown {bad}; choose from {ALGORITHMS}")
    if "mpi" not in algos:
        algos = ["mpi"] + algos  # the ratio column needs the baseline
    dtype = np.dtype(args.dtype)
    seg = parse_size(args.segment_bytes)
    lo, hi = parse_size(args.min), parse_size(args.max)
    sizes = []
    s = max(lo, dtype.itemsize)
    while s <= hi:
        sizes.append(s)
        s *= args.factor
    rows = []
    if rank == 0:
        print(f"# hpcdp bench collectives: allreduce, {N} ranks, {dtype.name}, out of place, "
              f"segment {human(seg)}B, MALLOC_MMAP_MAX_={os.environ.get('MALLOC_MMAP_MAX_', 'unset')}")
        print(f"{'size':>8} {'algorithm':>10} {'time_us':>11} {'algbw_GB/s':>11} "
              f"{'busbw_GB/s':>11} {'vs_mpi':>7}")
    for nbytes in sizes:
        n = nbytes // dtype.itemsize
        x = (np.arange(n) % 7 + rank).astype(dtype)
        out = np.empty_like(x)
        iters = max(1, _iters(nbytes, args.iters) // args.repeats)
        fns = {}
        for algo in algos:
            if algo == "mpi":
                def fn():
                    comm.Allreduce(x, out, op=MPI.SUM)
            else:
                def fn(algo=algo):
                    allreduce(x, out, comm=comm, algorithm=algo, segment_bytes=seg)
            fns[algo] = fn
        samples = {algo: [] for algo in algos}
        for _ in range(args.repeats):  # interleaved, so load spikes hit every algorithm
            for algo in algos:
                samples[algo].append(_time(fns[algo], iters, args.warmup, comm))
        t_mpi = float(np.median(samples["mpi"]))
        for algo in algos:
            t = float(np.median(samples[algo]))
            algbw = nbytes / t / 1e9
            busbw = algbw * 2 * (N - 1) / N
            row = {"size": nbytes, "algorithm": algo, "time_us": t * 1e6, "algbw_GBps": algbw,
                   "busbw_GBps": busbw, "vs_mpi": t / t_mpi, "iters": iters,
                   "repeats": args.repeats, "samples_us": [v * 1e6 for v in samples[algo]]}
            rows.append(row)
            if rank == 0:
                print(f"{human(nbytes):>8} {algo:>10} {t * 1e6:11.2f} {algbw:11.3f} "
                      f"{busbw:11.3f} {t / t_mpi:7.2f}", flush=True)
    if rank == 0 and args.json:
        meta = {"world_size": N, "dtype": dtype.name, "segment_bytes": seg,
                "MALLOC_MMAP_MAX_": os.environ.get("MALLOC_MMAP_MAX_"),
                "MALLOC_TRIM_THRESHOLD_": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
                "mpi": MPI.Get_library_version().splitlines()[0].strip(),
                "machine": platform.machine(), "cpus": os.cpu_count(),
                "date": time.strftime("%Y-%m-%d")}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return rows


def main(argv=None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
