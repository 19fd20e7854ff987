"""Where the small-message latency of hpcdp's allreduce goes (run under mpiexec).

    mpiexec -n 2 python -m hpcdp.bench.comm_overhead [--bytes 8] [--iters 4000]

Times, for one small float32 buffer: MPI's blocking Allreduce; MPI's Iallreduce
polled with Test (what a timeout needs, in C); hpcdp's "native" and "recursive"
algorithms. The differences are the price of each layer. Rank 0 prints
microseconds per call.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI


def _time(comm, fn, iters: int) -> float:
    for _ in range(max(50, iters // 10)):
        fn()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hpcdp.bench.comm_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", type=int, default=8, help="message size in bytes (float32)")
    p.add_argument("--iters", type=int, default=4000)
    args = p.parse_args(argv)
    import hpcdp.comm.collectives as C

    comm = MPI.COMM_WORLD
    a = np.ones(max(1, args.bytes // 4), np.float32)
    b = np.empty_like(a)

    def polled():
        req = comm.Iallreduce(a, b)
        while not req.Test():
            pass

    rows = [("MPI_Allreduce (blocking, C)", lambda: comm.Allreduce(a, b)),
            ("MPI_Iallreduce + Test loop", polled),
            ("hpcdp native", lambda: C.allreduce(a, b, comm=comm, algorithm="native")),
            ("hpcdp recursive doubling", lambda: C.allreduce(a, b, comm=comm, algorithm="recursive"))]
    results = [(name, _time(comm, fn, args.iters)) for name, fn in rows]
    if comm.rank == 0:
        print(f"# allreduce of {a.nbytes} B, {comm.size} ranks, {args.iters} calls each")
        for name, us in results:
            print(f"{name:40s} {us:8.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
