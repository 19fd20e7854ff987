"""Run the whole kernel lab: validate every variant, benchmark it against its
ceiling, print a table and write JSON.

    python kernels/run_lab.py                       # full sizes on a GPU
    python kernels/run_lab.py --json lab.json
    NUMBA_ENABLE_CUDASIM=1 python kernels/run_lab.py --smoke   # tiny, validation only

Ceilings: GEMM against the vendor BLAS's FP32 rate measured in the same run
(CuPy, else PyTorch, else "n/a"); memory-bound kernels against device-to-device
copy bandwidth. Exit status 1 when any validation fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np
from numba import cuda

if __package__ in (None, ""):  # run as a script: make `kernels` and `hpcdp` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels import gemm_lab, harness, reference as ref, rowwise_lab  # noqa: E402

GEMM_TOL = 1e-4  # float32 accumulation over K; relative to max |C|
MEM_TOL = 1e-5


def _device_name():
    if harness.simulated():
        return "CUDA simulator (CPU)"
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


def run_gemm(sizes, bench, rng, blas, reps):
    rows = []
    for n in sizes:
        M = N = K = n
        vendor = None
        if bench and blas:
            vendor, vendor_src = harness.vendor_gemm_tflops(n)
        for name, fn in gemm_lab.VARIANTS.items():
            if bench and name == "v1_naive" and n > 2048:
                continue  # minutes at 4096^3; its point is made at smaller sizes
            a, b = gemm_lab.inputs(rng, M, N, K)  # fresh inputs per variant
            A, B = cuda.to_device(a.reshape(-1)), cuda.to_device(b.reshape(-1))
            C = harness.poisoned((M * N,))
            fn(A, B, C, M, N, K)
            err = ref.rel_err(C.copy_to_host().reshape(M, N), ref.matmul(a, b))
            row = dict(kernel="gemm_fp32", variant=name, size=f"{M}x{N}x{K}", rel_err=err,
                       ok=err < GEMM_TOL)
            if bench:
                ms = harness.time_ms(lambda: fn(A, B, C, M, N, K), reps=reps)
                tf = 2 * M * N * K / (ms * 1e-3) / 1e12
                row.update(ms=ms, rate=tf, unit="TFLOP/s", ceiling=vendor,
                           ceiling_what=vendor_src if blas else "skipped",
                           pct=(100 * tf / vendor) if vendor else None)
            rows.append(row)
    return rows


def _validate_case(case, fn_name, runner):
    ins = [cuda.to_device(np.ascontiguousarray(x).reshape(-1) if x.ndim > 1 else x)
           for x in case["inputs"]]
    outs = [harness.poisoned(s) for s in case["outs"]]
    runner(*ins, *outs)
    got = [o.copy_to_host() for o in outs] or [ins[i].copy_to_host() for i in case["in_place"]]
    errs = [ref.rel_err(g, r) for g, r in zip(got, case["ref"]())]
    return max(errs), ins, outs


def run_memory_bound(R, C, bench, rng, copy_bw, reps):
    rows = []
    entries = [("softmax", v, lambda rng_, R_, C_, fn=fn: _softmax_case(rng_, R_, C_, fn))
               for v, fn in rowwise_lab.SOFTMAX_VARIANTS.items()]
    entries += [(k, "v1_backend", f) for k, f in rowwise_lab.MEMORY_BOUND.items()]
    for kernel, variant, make in entries:
        case = make(rng, R, C)  # fresh inputs per kernel and variant
        err, ins, outs = _validate_case(case, kernel, case["run"])
        row = dict(kernel=kernel, variant=variant, size=f"{R}x{C}", rel_err=err, ok=err < MEM_TOL)
        if bench:
            ms = harness.time_ms(lambda: case["run"](*ins, *outs), reps=reps)
            gbs = case["bytes"] / (ms * 1e-3) / 1e9
            row.update(ms=ms, rate=gbs, unit="GB/s", ceiling=copy_bw,
                       ceiling_what="device-to-device copy", pct=100 * gbs / copy_bw)
        rows.append(row)
    return rows


def _softmax_case(rng, R, C, fn):
    x = rng.standard_normal((R, C)).astype(np.float32)
    return dict(inputs=[x], outs=[(R * C,)], bytes=8 * R * C,
                run=lambda x_, o: fn(x_, o, R, C), ref=lambda: [ref.softmax(x).reshape(-1)])


def print_table(rows, out=None):
    out = sys.stdout if out is None else out
    head = f"{'kernel':18} {'variant':18} {'size':16} {'rel_err':>9} {'ok':>3} {'ms':>9} " \
           f"{'rate':>10} {'unit':8} {'ceiling':>9} {'%ceil':>6}"
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        print(f"{r['kernel']:18} {r['variant']:18} {r['size']:16} {r['rel_err']:9.2e} "
              f"{'yes' if r['ok'] else 'NO':>3} {harness.fmt(r.get('ms'), '.4f'):>9} "
              f"{harness.fmt(r.get('rate'), '.4g'):>10} {r.get('unit', ''):8} "
              f"{harness.fmt(r.get('ceiling'), '.4g'):>9} {harness.fmt(r.get('pct'), '.1f'):>6}", file=out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, validation only (simulator/CI)")
    p.add_argument("--json", help="write the rows and device info here")
    p.add_argument("--gemm-sizes", default="1024,2048,4096", help="square GEMM sizes (comma list)")
    p.add_argument("--rows", type=int, default=16384, help="rows of the memory-bound kernels")
    p.add_argument("--cols", type=int, default=1024, help="columns of the memory-bound kernels")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seed", type=int, default=None, help="default: a fresh seed per run")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time_ns() % (2**32))
    rng = np.random.default_rng(seed)
    bench = not args.smoke
    if args.smoke:
        gemm_sizes, R, C = [33], 5, 40  # partial tiles everywhere
    else:
        gemm_sizes, R, C = [int(s) for s in args.gemm_sizes.split(",")], args.rows, args.cols
    info = dict(device=_device_name(), simulated=harness.simulated(), smoke=args.smoke, seed=seed,
                host=platform.node(), python=platform.python_version(), time=time.strftime("%Y-%m-%dT%H:%M:%S"))
    copy_bw = harness.copy_bandwidth_gbs() if bench else None
    info["copy_bandwidth_GBs"] = copy_bw
    rows = run_gemm(gemm_sizes, bench, rng, blas=bench, reps=args.reps)
    rows += run_memory_bound(R, C, bench, rng, copy_bw, args.reps)
    print(f"# kernel lab on {info['device']} (seed {seed}); copy bandwidth "
          f"{harness.fmt(copy_bw, '.4g')} GB/s")
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(info=info, rows=rows), f, indent=1, default=float)
    failed = [f"{r['kernel']}/{r['variant']}" for r in rows if not r["ok"]]
    if failed:
        print("VALIDATION FAILED: " + ", ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
