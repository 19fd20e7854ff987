"""Compile every kernel of the cuda backend to PTX for a target GPU, without a
GPU: catches typing and lowering errors the simulator cannot (it runs kernels
as Python). Needs NVVM (e.g. the ``nvidia-cuda-nvcc-cu12`` and
``nvidia-cuda-nvrtc-cu12`` wheels); no driver.

    python kernels/ptx_check.py --cc 9.0     # H100/H200
Prints one line per kernel and signature, and the registers/shared memory are
left to the real run (ptxas is not invoked here).
"""

from __future__ import annotations

import argparse
import os
import sys

from numba import boolean, cuda, float32, float64, int64, types, uint64

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hpcdp.backend.cuda import elementwise as ew  # noqa: E402
from hpcdp.backend.cuda import embedding as emb  # noqa: E402
from hpcdp.backend.cuda import gemm, layout, optim, rowwise  # noqa: E402
from hpcdp.backend.cuda import reduce as red  # noqa: E402


def _signatures():
    i64, u64, b = int64, uint64, boolean
    t6 = types.UniTuple(int64, 6)
    t3 = types.UniTuple(int64, 3)
    I = int64[::1]
    out = [("layout.strided_copy", layout._strided_copy, (float32[::1], i64, t6, float32[::1], i64, t6, t6, i64, i64))]
    for f in (float32, float64):
        A = f[::1]
        k = ew.K(str(f))
        out += [
            (f"ew.unary[{f}]", k["unary"], (i64, A, A, i64)),
            (f"ew.binary_same[{f}]", k["binary_same"], (i64, A, A, A, i64)),
            (f"ew.binary_scalar[{f}]", k["binary_scalar"], (i64, A, f, A, i64)),
            (f"ew.binary_trailing[{f}]", k["binary_trailing"], (i64, A, A, A, i64, i64, b)),
            (f"ew.binary_strided[{f}]", k["binary_strided"], (i64, A, t6, A, t6, A, t6, i64)),
            (f"ew.fill[{f}]", k["fill"], (A, f, i64)),
            (f"ew.iadd[{f}]", k["iadd"], (A, A, i64, f)),
            (f"ew.causal_fill[{f}]", k["causal_fill"], (A, A, i64, i64, f, i64)),
            (f"ew.dropout[{f}]", ew._dropout, (A, uint64[::1], i64, i64, u64, u64, u64, u64, u64, f, f)),
        ]
        rows, cols, partials = red._kernels(str(f) if f is float64 else "float32")
        out += [(f"red.rows[{f}]", rows, (i64, A, A, i64, f)),
                (f"red.cols[{f}]", cols, (i64, A, A, i64, i64, f)),
                (f"red.partials[{f}]", partials, (i64, A, A, i64, f))]
        rk = rowwise.kernels(str(f))
        out += [
            (f"rowwise.softmax[{f}]", rk["softmax"], (i64, A, A, i64)),
            (f"rowwise.softmax_bwd[{f}]", rk["softmax_bwd"], (i64, A, A, A, i64)),
            (f"rowwise.xent[{f}]", rk["xent"], (A, I, A, A, i64, int64, b)),
            (f"rowwise.xent_counted[{f}]", rk["xent_counted"], (I, int64, A, i64)),
            (f"rowwise.xent_bwd[{f}]", rk["xent_bwd"], (A, I, A, A, i64, f, A, int64, b)),
            (f"rowwise.ln_fwd[{f}]", rk["ln_fwd"], (A, A, A, A, A, A, i64, f, f)),
            (f"rowwise.ln_bwd_x[{f}]", rk["ln_bwd_x"], (A, A, A, A, A, A, i64, f)),
            (f"rowwise.ln_bwd_wb[{f}]", rk["ln_bwd_wb"], (A, A, A, A, A, A, i64, i64)),
        ]
        for name, cfg in gemm.CONFIGS.items():
            kern, _ = gemm.make_gemm(str(f), *cfg)
            out.append((f"gemm.{name}[{f}]", kern, (A, A, A, i64, i64, i64, i64, i64, i64, i64, t3, t3, t3, b, b)))
        sgd, adamw = optim._kernels(str(f))
        out += [(f"optim.sgd[{f}]", sgd, (A, A, A, i64, f, f, f, b, b)),
                (f"optim.adamw[{f}]", adamw, (A, A, A, A, i64, f, f, f, f, f, f, f))]
        out += [(f"emb.lookup[{f}]", emb._lookup, (A, I, A, i64, i64)),
                (f"emb.gather_sum[{f}]", emb._gather_sum(str(f)), (A, I, I, A, i64))]
    out += [("emb.count", emb._count, (I, I, int64)), ("emb.scan", emb._scan, (I, I, I, int64)),
            ("emb.scatter", emb._scatter, (I, I, I, int64)), ("emb.sort_buckets", emb._sort_buckets, (I, I, int64))]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cc", default="9.0", help="compute capability, e.g. 9.0 (H100/H200), 8.0 (A100)")
    args = p.parse_args(argv)
    cc = tuple(int(x) for x in args.cc.split("."))
    # device functions called from a kernel are compiled for "the current device";
    # without a GPU, say which one that is (only inside this check)
    from numba.cuda import dispatcher

    class _Target:
        compute_capability = cc
    dispatcher.get_current_device = lambda: _Target()
    failed = 0
    for name, kern, sig in _signatures():
        try:
            ptx, _ = cuda.compile_ptx(kern.py_func, sig, cc=cc)
            print(f"ok    {name}  ({len(ptx)} chars of PTX)")
        except Exception as e:  # report every kernel, then fail
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    print(f"{failed} kernel(s) failed to compile for sm_{cc[0]}{cc[1]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
