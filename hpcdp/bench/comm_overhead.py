"""``hpcdp bench comm-overhead``: where the time of one small collective goes, by layer.

Run under mpiexec::

    mpiexec -n 2 hpcdp bench comm-overhead [--collective allreduce] [--bytes 8]
        [--iters 300] [--rounds 15] [--json runs/overhead.json]

For one small float32 buffer it times, in interleaved rounds (every layer once per
round, so a load spike on the shared machine hits all of them), each layer's
microseconds per call:

- ``MPI blocking``: MPI's own collective, one mpi4py call (the baseline);
- ``MPI non-blocking + Test loop``: what a deadline needs, still no hpcdp;
- ``hpcdp auto``: the public call as users make it (below the crossover: the lean
  path, hpcdp.comm.fast, in compiled code when this MPI can be bound,
  hpcdp.comm.engines.compiled.lean);
- ``hpcdp auto, mpi4py lean path``: the same call on a communicator whose lean path
  runs through mpi4py (``set_lean_path(comm, "mpi4py")``);
- ``hpcdp native, general request``: MPI's collective through the general front
  (forced by ``max_message_bytes``: the arguments checked, the chooser asked, the call
  arrived), then the same engine as the lean path (hpcdp.comm.engines.mpi; before it
  was a generator-driven request of its own);
- ``hpcdp recursive doubling`` (allreduce only) and ``hpcdp ring``: hpcdp's own
  algorithms on point-to-point messages;
- ``hpcdp ring, compiled engine``: the same ring run by hpcdp.comm.engines.compiled (when
  this MPI can be bound);
- ``hpcdp auto, debug mode``: plus the fingerprint all-to-all of ``HPCDP_DEBUG=1``.

The differences are the price of each layer. Rank 0 prints the median and the
minimum round (the minimum is the least disturbed by other jobs) and the median's
ratio to ``MPI blocking``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather")


def _parser():
    p = argparse.ArgumentParser(prog="hpcdp bench comm-overhead", description=__doc__.split("\n")[0])
    p.add_argument("--collective", default="allreduce", choices=COLLECTIVES)
    p.add_argument("--bytes", type=int, default=8, help="buffer size in bytes (float32; default 8)")
    p.add_argument("--iters", type=int, default=300, help="calls per layer per round (default 300)")
    p.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    p.add_argument("--json", default=None, help="write the rows here (rank 0)")
    return p


def check_args(args) -> None:
    """Clear errors instead of a hang or a ZeroDivisionError."""
    from hpcdp.bench.collectives import usage_error

    for name in ("bytes", "iters", "rounds"):
        if getattr(args, name) < 1:
            usage_error("hpcdp bench comm-overhead", f"--{name} must be >= 1, got {getattr(args, name)}")


def _layers(comm, name, a, b, chunk):
    """(label, fn) per layer for collective ``name`` on send ``a`` / result ``b``."""
    from mpi4py import MPI

    import hpcdp.comm as C
    from hpcdp.comm import get_context
    from hpcdp.shard import shard_bounds

    bounds = shard_bounds(a.size if name != "all_gather" else b.size, comm.size)
    counts, displs = [s for _, s in bounds], [o for o, _ in bounds]
    T = MPI.Datatype.fromcode(a.dtype.char)
    split = 1 << 30  # any max_message_bytes takes the general front

    def spin(req):
        while not req.Test():
            pass

    if name == "allreduce":
        rows = [("MPI blocking", lambda: comm.Allreduce([a, T], [b, T], MPI.SUM)),
                ("MPI non-blocking + Test loop", lambda: spin(comm.Iallreduce([a, T], [b, T], MPI.SUM)))]
        call = lambda comm=comm, **kw: C.allreduce(a, b, comm=comm, **kw)  # noqa: E731
    elif name == "reduce_scatter":
        rows = [("MPI blocking", lambda: comm.Reduce_scatter([a, T], [chunk, T], counts, MPI.SUM)),
                ("MPI non-blocking + Test loop",
                 lambda: spin(comm.Ireduce_scatter([a, T], [chunk, T], counts, MPI.SUM)))]
        call = lambda comm=comm, **kw: C.reduce_scatter(a, chunk, comm=comm, **kw)  # noqa: E731
    else:
        rows = [("MPI blocking", lambda: comm.Allgatherv([chunk, T], [b, counts, displs, T])),
                ("MPI non-blocking + Test loop",
                 lambda: spin(comm.Iallgatherv([chunk, T], [b, counts, displs, T])))]
        call = lambda comm=comm, **kw: C.all_gather(chunk, b, comm=comm, **kw)  # noqa: E731
    from hpcdp.comm import set_lean_path

    viampi4py = comm.Dup()  # the same calls through the mpi4py lean path
    set_lean_path(viampi4py, "mpi4py")
    rows += [("hpcdp auto", lambda: call()),
             ("hpcdp auto, mpi4py lean path", lambda: call(comm=viampi4py)),
             ("hpcdp native, general request", lambda: call(algorithm="native", max_message_bytes=split))]
    if name == "allreduce":
        rows.append(("hpcdp recursive doubling", lambda: call(algorithm="recursive")))
    rows.append(("hpcdp ring", lambda: call(algorithm="ring")))
    from hpcdp.comm import active_engine, set_engine

    compiled = comm.Dup()  # the same calls on a communicator whose ring runs compiled
    set_engine(compiled, "compiled")
    if active_engine(compiled) == "compiled":
        rows.append(("hpcdp ring, compiled engine", lambda: call(algorithm="ring", comm=compiled)))

    ctx = get_context(comm)

    def debug():
        ctx.debug = True
        try:
            call()
        finally:
            ctx.debug = False
    rows.append(("hpcdp auto, debug mode", debug))
    return rows


def run(args) -> list[dict]:
    from mpi4py import MPI

    from hpcdp.comm import get_context
    from hpcdp.shard import shard_range

    check_args(args)
    comm = MPI.COMM_WORLD
    N, rank = comm.Get_size(), comm.Get_rank()
    get_context(comm)
    n = max(1, args.bytes // 4)
    a = np.ones(n, np.float32)
    b = np.empty_like(a)
    chunk = np.ones(shard_range(n, N, rank)[1], np.float32)
    layers = _layers(comm, args.collective, a, b, chunk)
    samples = {label: [] for label, _ in layers}
    for label, fn in layers:  # warm up every path (first calls set up caches)
        for _ in range(20):
            fn()
    for _ in range(args.rounds):
        for label, fn in layers:
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                fn()
            mine = (time.perf_counter() - t0) / args.iters * 1e6
            samples[label].append(comm.allreduce(mine, op=MPI.MAX))
    base = float(np.median(samples["MPI blocking"]))
    rows = [{"layer": label, "median_us": float(np.median(v)), "min_us": float(np.min(v)),
             "vs_mpi": float(np.median(v)) / base, "samples_us": v} for label, v in samples.items()]
    if rank == 0:
        load = os.getloadavg()
        print(f"# {args.collective} of {a.nbytes} B float32, {N} ranks, {args.rounds} interleaved "
              f"rounds x {args.iters} calls; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
        print(f"{'layer':34s} {'median_us':>10s} {'min_us':>9s} {'vs_mpi':>7s}")
        for r in rows:
            print(f"{r['layer']:34s} {r['median_us']:10.2f} {r['min_us']:9.2f} {r['vs_mpi']:7.2f}")
        if args.json:
            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            with open(args.json, "w") as f:
                json.dump({"meta": {"collective": args.collective, "bytes": int(a.nbytes),
                                    "world_size": N, "loadavg": load,
                                    "date": time.strftime("%Y-%m-%d %H:%M")}, "rows": rows}, f, indent=1)
    return rows


def main(argv=None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
