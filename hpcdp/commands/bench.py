"""``hpcdp bench NAME [options]``: the micro-benchmarks (hpcdp.bench), one module each.

Performance is measured here, never asserted in tests; every figure goes to
docs/results.md with its command, machine and load.
"""

from __future__ import annotations

import importlib
import sys

# NAME -> the module whose main(argv) -> int runs ``hpcdp bench NAME``
BENCHMARKS = {
    "step": "hpcdp.bench.step_time",
    "collectives": "hpcdp.bench.collectives",
    "faults": "hpcdp.bench.faults",
    "soak": "hpcdp.bench.soak",
    "data": "hpcdp.bench.data",
    "comm-overhead": "hpcdp.bench.comm_overhead",
    "startup": "hpcdp.bench.startup",
    "exact": "hpcdp.bench.exact",
    "ckpt": "hpcdp.bench.ckpt",
    "threads": "hpcdp.bench.threads",
}


# NAME -> one line for ``hpcdp bench --help``
SUMMARY = {
    "step": "training-step time vs hand-written NumPy / PyTorch",
    "collectives": "OSU-style table of the collectives (under mpiexec)",
    "faults": "fault-injection table: how jobs end when a rank fails",
    "soak": "resident memory of every rank over a long run",
    "data": "on-disk loader throughput and time waiting for data",
    "comm-overhead": "one small collective's time by layer (under mpiexec)",
    "startup": "launch to first step and to exit, per rank count",
    "exact": "exact vs fast mode: step time, bytes, loss curves",
    "ckpt": "checkpoint write/read bandwidth vs dd, save stall",
    "threads": "ranks sharing a node: one thread per rank vs pools as wide as the node",
}


def usage() -> str:
    width = max(map(len, BENCHMARKS))
    return ("usage: hpcdp bench NAME [options]   (hpcdp bench NAME --help for its options)\n\n"
            + "\n".join(f"  {name:<{width}}  {SUMMARY.get(name, '')}" for name in BENCHMARKS)
            + "\n\nEvery figure goes to docs/results.md with its command, machine and load.")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    if not argv or argv[0] not in BENCHMARKS:
        print(usage(), file=sys.stderr)
        print(f"\nhpcdp bench: error: {'unknown benchmark ' + repr(argv[0]) if argv else 'no benchmark given'}",
              file=sys.stderr)
        return 2
    return importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:]) or 0
