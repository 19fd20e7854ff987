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
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: hpcdp bench {{{','.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    return importlib.import_module(BENCHMARKS[argv[0]]).main(argv[1:]) or 0
