"""``python -m hpcdp.scale.linkprobe --json F`` under ``mpiexec -n 2``: the timings a
machine profile is fitted from (``hpcdp scale --calibrate`` runs it).

Between ranks 0 and 1 (on one node for the intra-node link, on two nodes for the
inter-node one), each timed like ``hpcdp bench collectives`` (warmup, barrier, mean of
``iters`` calls, the slower rank's), keeping the fastest of interleaved rounds:

- ``exchange``: MPI ``Sendrecv`` of S bytes each way at once (a ring step at N=2 in C):
  its line ``alpha + S * beta`` is the link;
- ``segments``: hpcdp's ring allreduce of one buffer cut into segments of several sizes:
  the slope over the number of messages is the cost of one message in hpcdp's ring
  (link latency + hpcdp's per-message work);
- ``ring_large``: hpcdp's ring allreduce (out of place, 1 MiB segments, the engine
  the environment selects) at two large sizes (RING_SIZES, those within
  ``--max-bytes``): the slope between them is what a large ring step costs per byte,
  working buffers and cache effects included (hpcdp.scale.calibrate.fit_ring_beta);
- ``segments_small``: the same on an 8 KiB buffer cut into 512 B-2 KiB segments (4-16
  messages at equal bytes, all below the eager limits): the segments of a step are
  independent, so they pipeline and the slope is the cost of a message's posting,
  polling and bookkeeping (hpcdp's and MPI's C code), without the wire's latency, which
  only a step's dependent message pays; under the compiled engine the same on the
  Python engine (``segments_small_python``: the Python requests the few-step
  collectives still run as);
- ``calls``: hpcdp's ring and recursive-doubling allreduce of 8 bytes (per-call cost);
- ``py_call_s`` (each rank alone): mpi4py's own cost of one ``Sendrecv`` call, to
  ``MPI.PROC_NULL`` (MPI returns at once): the Python in every ``exchange`` point, which
  hpcdp's compiled ring does not pay (it calls MPI's C functions), so the calibration
  takes it off the exchanges to get the wire's line;
- ``tokens`` (rank 0 alone): posting one arrival token each way and reaping it, the
  per-peer control cost every hpcdp collective pays.

JSON on rank 0: ``{"meta": ..., "exchange": [[bytes, s]...], "segments": [[messages,
s]...], "segments_bytes": S, "segments_small": [[messages, s]...][, "segments_small_python": ...],
"ring_large": [[bytes, s]...], "calls": {"ring": s, "recursive": s}, "py_call_s": s,
"token_pair_s": s}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

# x8 steps, plus 1-2 KiB, 8-16 KiB and 64 KiB around MPI's eager-to-rendezvous switch
# (UCX's active-message eager limit is 8100 B in MPICH 5's UCX netmod, printed with
# MPIR_CVAR_DEBUG_SUMMARY=1; shared memory's cells; a tbf rate limiter's burst)
EXCHANGE_SIZES = [8, 64, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 262144,
                  1 << 20, 4 << 20, 16 << 20]
SEGMENT_BUFFER = 256 << 10
SEGMENTS = [2048, 8192, 32768, 131072]
# equal bytes, eager segments only (below shared memory's 4 KiB cells, UCX's 8100 B):
# 4-16 messages whose slope is hpcdp's (and MPI's C) cost per message, no latency. Not
# more: with 32-64 small messages in flight a loaded trial took 20x longer per message
# (1.16-1.28 ms against 53 us at 16), a cliff, not a slope

SMALL_BUFFER = 8192
SMALL_SEGMENTS = [512, 1024, 2048]
RING_SIZES = [2 << 20, 16 << 20]


def _iters(nbytes: int) -> int:
    return int(min(1000, max(5, (64 << 20) // max(nbytes, 1))))


def _rounds(fns: dict, iters: dict, rounds: int, comm) -> dict:
    """The fastest of interleaved rounds (the least disturbed by other processes on a
    shared machine) of the slower rank's mean time per call."""
    from mpi4py import MPI

    samples = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            fn()  # warm
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters[k]):
                fn()
            mine = (time.perf_counter() - t0) / iters[k]
            samples[k].append(comm.allreduce(mine, op=MPI.MAX))
    return {k: min(v) for k, v in samples.items()}


def token_pair_s(reps: int = 4000) -> float:
    """One fingerprint message each way, as debug mode (hpcdp.comm.core.debug.debug_check)
    posts and reaps them per peer and collective, on COMM_SELF (no peer latency)."""
    from mpi4py import MPI

    comm = MPI.COMM_SELF
    fp = np.zeros(7, dtype=np.int64)
    inbox = np.zeros(7, dtype=np.int64)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for i in range(reps):
            s = comm.Isend([fp, MPI.INT64_T], 0, i % 1000)
            r = comm.Irecv([inbox, MPI.INT64_T], 0, i % 1000)
            MPI.Request.Testall([s, r])
            MPI.Request.Waitall([s, r])
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def py_call_s(reps: int = 4000) -> float:
    """mpi4py's cost of one ``Sendrecv`` of 8 bytes to ``MPI.PROC_NULL`` (MPI does nothing):
    the buffer parsing and call that every ``exchange`` point carries once."""
    from mpi4py import MPI

    comm, null = MPI.COMM_WORLD, MPI.PROC_NULL
    a, b = np.ones(8, np.uint8), np.empty(8, np.uint8)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            comm.Sendrecv([a, MPI.BYTE], null, 0, [b, MPI.BYTE], null, 0)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def _segments(comm, rounds: int, buffer: int, segments: list) -> list:
    """hpcdp's ring allreduce of one ``buffer``-byte float32 buffer cut into segments of
    each size (the engine ``comm`` runs on): ``[[messages, s], ...]``."""
    from hpcdp.comm import allreduce

    x = np.ones(buffer // 4, np.float32)
    y = np.empty_like(x)
    fns = {seg: (lambda seg=seg: allreduce(x, y, comm=comm, algorithm="ring", segment_bytes=seg))
           for seg in segments}
    times = _rounds(fns, {seg: 50 for seg in segments}, rounds, comm)
    chunk = buffer // 2
    return [[2 * -(-chunk // seg), times[seg]] for seg in segments]


def run(args) -> dict:
    from mpi4py import MPI

    from hpcdp.comm import allreduce, get_context

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 2:
        raise SystemExit("hpcdp.scale.linkprobe runs on exactly 2 ranks (mpiexec -n 2)")
    rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
    get_context(comm)
    out: dict = {}
    fns, iters = {}, {}
    sizes = [S for S in EXCHANGE_SIZES if S <= args.max_bytes]
    for S in sizes:
        a, b = np.ones(S, np.uint8), np.empty(S, np.uint8)
        fns[S] = lambda a=a, b=b: comm.Sendrecv([a, MPI.BYTE], peer, 0, [b, MPI.BYTE], peer, 0)
        iters[S] = _iters(S)
    times = _rounds(fns, iters, args.rounds, comm)
    out["exchange"] = [[S, times[S]] for S in sizes]

    out["segments"] = _segments(comm, args.rounds, SEGMENT_BUFFER, SEGMENTS)
    out["segments_bytes"] = SEGMENT_BUFFER
    out["segments_small"] = _segments(comm, args.rounds, SMALL_BUFFER, SMALL_SEGMENTS)
    from hpcdp.comm import active_engine, set_engine

    if active_engine(comm) == "compiled":  # the few-step collectives' Python requests
        set_engine(comm, "python")
        out["segments_small_python"] = _segments(comm, args.rounds, SMALL_BUFFER, SMALL_SEGMENTS)
        set_engine(comm, "compiled")

    ring_sizes = [S for S in RING_SIZES if S <= args.max_bytes]
    if len(ring_sizes) == 2:
        bufs = {S: (np.ones(S // 4, np.float32), np.empty(S // 4, np.float32)) for S in ring_sizes}
        fns = {S: (lambda a=a, b=b: allreduce(a, b, comm=comm, algorithm="ring"))
               for S, (a, b) in bufs.items()}
        times = _rounds(fns, {S: max(3, (64 << 20) // S) for S in ring_sizes}, args.rounds, comm)
        out["ring_large"] = [[S, times[S]] for S in ring_sizes]
        del bufs, fns

    small, res = np.ones(2, np.float32), np.empty(2, np.float32)
    fns = {a: (lambda a=a: allreduce(small, res, comm=comm, algorithm=a)) for a in ("ring", "recursive")}
    out["calls"] = _rounds(fns, {"ring": 300, "recursive": 300}, args.rounds, comm)
    comm.Barrier()
    out["py_call_s"] = py_call_s()
    comm.Barrier()
    if rank == 0:
        out["token_pair_s"] = token_pair_s()
        out["meta"] = {"mpi": MPI.Get_library_version().splitlines()[0].strip(),
                       "processor": MPI.Get_processor_name(), "date": time.strftime("%Y-%m-%d %H:%M")}
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    comm.Barrier()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hpcdp.scale.linkprobe", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default="", help="write the timings here (rank 0)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the fastest is kept)")
    p.add_argument("--max-bytes", type=int, default=EXCHANGE_SIZES[-1],
                   help="largest exchange (to calibrate on small messages only)")
    run(p.parse_args(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
