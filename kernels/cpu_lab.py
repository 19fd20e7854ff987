"""The CPU side of the lab: the backend's fused numba kernels (hpcdp/backend/
cpu_kernels.py) beside the unfused NumPy chains they replace, validated against the
float64 references of ``reference.py`` and timed against the host's copy bandwidth.

Kernels (float32, the GPT's memory-bound chains):

| kernel | v1_numpy (what it replaces) | v2_fused (the backend's) |
|---|---|---|
| gelu_fwd | u = s (x + c x^3); np.tanh; 0.5 x (1 + t): 3 passes, 2 temporaries | `gelu_f32`: x sigmoid(2u) in one pass, own SIMD exp |
| gelu_bwd | tanh pass + the derivative pass | `gelu_bwd_f32`: one pass |
| causal_softmax_fwd | x * scale; causal fill -inf; max, np.exp, sum: 5 passes | `causal_softmax_f32`: scale, mask, softmax in one pass over the kept half |
| causal_softmax_bwd | softmax backward; causal fill 0; * scale: 3 passes | `causal_softmax_bwd_f32`: one pass |
| layernorm_fwd | mean, var, normalize, affine in NumPy | `layernorm_fwd_f32` (float32 row sums in SIMD lanes) |
| layernorm_bwd | the NumPy formula | `layernorm_bwd_f32` (weight and bias gradients in the same pass) |
| layernorm_bwd_res | the NumPy formula, then + the residual stream's gradient | `layernorm_bwd_f32` with the add in its pass |
| cross_entropy_fwd | max, exp, sum, divide, log in NumPy | `cross_entropy_fwd_f32` (its own SIMD exp; the float64 kernel calls a scalar exp) |
| bias_residual | copy z; z += b; z += r: 3 passes | copy z; `bias_residual_add`: 2 passes (the backend's runs in place on the GEMM output, no copy) |

Validation (every run, every variant): fresh inputs (a new seed per run unless
``--seed``), outputs filled with NaN before the kernel runs (an element it does not
write fails), relative error ``max|out - ref| / max|ref|`` below 1e-5.
Rates count the minimum bytes a call must move (e.g. gelu_fwd: read x, write y) and
are set against the host's one-thread copy bandwidth (``np.copyto`` of 64 MiB, read +
write counted), the ceiling for a memory-bound kernel on one core.

    python kernels/cpu_lab.py                  # the GPT's sizes, one thread
    python kernels/cpu_lab.py --smoke          # tiny, validation only (a unit test)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time

import numpy as np

if __package__ in (None, ""):  # run as a script: make `kernels` and `hpcdp` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hpcdp.backend import cpu_kernels as K  # noqa: E402
from kernels import reference as ref  # noqa: E402

TOL = 1e-5
_S, _C = math.sqrt(2.0 / math.pi), 0.044715


def poisoned(shape, dtype=np.float32):
    return np.full(shape, np.nan, dtype=dtype)


def time_ms(fn, reps=20, warmup=3) -> float:
    """Median milliseconds of ``fn()`` (perf_counter around each call)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_bandwidth_gbs(nbytes=64 << 20, reps=10) -> float:
    """One-thread host copy bandwidth (read + write counted)."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    ms = time_ms(lambda: np.copyto(dst, src), reps=reps, warmup=2)
    return 2 * nbytes / (ms * 1e-3) / 1e9


# -- the unfused NumPy chains (v1) -------------------------------------------------------

def _np_gelu(x, y):
    t = np.tanh(np.float32(_S) * (x + np.float32(_C) * x * x * x))
    np.multiply(np.float32(0.5) * x, 1 + t, out=y)


def _np_gelu_bwd(x, gy, gx):
    t = np.tanh(np.float32(_S) * (x + np.float32(_C) * x * x * x))
    du = np.float32(_S) * (1 + np.float32(3 * _C) * x * x)
    np.multiply(gy, 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du, out=gx)


def _np_causal_softmax(x, scale, y):
    t1, t2 = x.shape[-2:]
    z = np.where(np.tril(np.ones((t1, t2), dtype=bool)), x * scale, np.float32(-np.inf))
    e = np.exp(z - z.max(-1, keepdims=True))
    np.divide(e, e.sum(-1, keepdims=True), out=y)


def _np_causal_softmax_bwd(y, gy, scale, gx):
    t1, t2 = y.shape[-2:]
    g = y * (gy - (gy * y).sum(-1, keepdims=True))
    np.multiply(np.where(np.tril(np.ones((t1, t2), dtype=bool)), g, np.float32(0)), scale, out=gx)


def _np_layernorm(x, w, b, eps, y, mean, rstd):
    m = x.mean(-1, keepdims=True)
    d = x - m
    r = 1 / np.sqrt((d * d).mean(-1, keepdims=True) + eps)
    np.add(d * r * w, b, out=y)
    mean[:], rstd[:] = m[:, 0], r[:, 0]


def _np_layernorm_bwd(gy, x, w, mean, rstd, gx, gw, gb):
    xh = (x - mean[:, None]) * rstd[:, None]
    g = gy * w
    np.multiply(rstd[:, None], g - g.mean(-1, keepdims=True) - xh * (g * xh).mean(-1, keepdims=True), out=gx)
    gw[:] = (gy * xh).sum(0)
    gb[:] = gy.sum(0)


def _np_layernorm_bwd_res(gy, x, w, mean, rstd, gres, gx, gw, gb):
    _np_layernorm_bwd(gy, x, w, mean, rstd, gx, gw, gb)
    np.add(gres, gx, out=gx)


def _fused_layernorm_bwd(gy, x, w, mean, rstd, gx, gw, gb):
    K.layernorm_bwd_f32(gy, x, w, mean, rstd, gy, False, gx, gw, gb)


def _fused_layernorm_bwd_res(gy, x, w, mean, rstd, gres, gx, gw, gb):
    K.layernorm_bwd_f32(gy, x, w, mean, rstd, gres, True, gx, gw, gb)


def _np_cross_entropy(x, t, probs, loss):
    m = x.max(-1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(-1, keepdims=True)
    np.divide(e, s, out=probs)
    loss[0] = np.mean(np.log(s[:, 0]) + m[:, 0] - x[np.arange(len(t)), t])


def _fused_cross_entropy(x, t, probs, loss):
    loss[0] = K.cross_entropy_fwd_f32(x, t, probs, np.int64(0), False)


def _np_bias_residual(z, b, r, y):
    np.copyto(y, z)
    y += b
    y += r


def _fused_bias_residual(z, b, r, y):
    np.copyto(y, z)
    K.bias_residual_add(y, b, r)


# -- cases: inputs, outputs to poison, variants, the float64 reference, bytes ----------

def _f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def gelu_fwd_case(rng, R, C, T):
    x = _f32(rng, R * C, scale=3.0)
    return dict(size=f"{R}x{C}", inputs=[x], outs=[(R * C,)], bytes=8 * R * C,
                variants={"v1_numpy": _np_gelu, "v2_fused": K.gelu_f32},
                ref=lambda: [ref.gelu(x)])


def gelu_bwd_case(rng, R, C, T):
    x, gy = _f32(rng, R * C, scale=3.0), _f32(rng, R * C)
    return dict(size=f"{R}x{C}", inputs=[x, gy], outs=[(R * C,)], bytes=12 * R * C,
                variants={"v1_numpy": _np_gelu_bwd, "v2_fused": K.gelu_bwd_f32},
                ref=lambda: [ref.gelu_backward(x, gy)])


def _att_shape(R, C, T):
    return (max(1, R * C // (T * T)), T, T)


def causal_softmax_fwd_case(rng, R, C, T):
    shape = _att_shape(R, C, T)
    x, scale = _f32(rng, *shape, scale=4.0), np.float32(1 / math.sqrt(32))
    return dict(size="x".join(map(str, shape)), inputs=[x, scale], outs=[shape],
                bytes=8 * x.size, variants={"v1_numpy": _np_causal_softmax, "v2_fused": K.causal_softmax_f32},
                ref=lambda: [ref.causal_softmax(x, float(scale))])


def causal_softmax_bwd_case(rng, R, C, T):
    shape = _att_shape(R, C, T)
    scale = np.float32(1 / math.sqrt(32))
    y = ref.causal_softmax(_f32(rng, *shape, scale=4.0), float(scale)).astype(np.float32)
    gy = _f32(rng, *shape)
    return dict(size="x".join(map(str, shape)), inputs=[y, gy, scale], outs=[shape],
                bytes=12 * y.size,
                variants={"v1_numpy": _np_causal_softmax_bwd, "v2_fused": K.causal_softmax_bwd_f32},
                ref=lambda: [ref.causal_softmax_backward(y, gy, float(scale))])


def layernorm_fwd_case(rng, R, C, T):
    x, w, b = _f32(rng, R, C), _f32(rng, C), _f32(rng, C)
    y, m, r = ref.layernorm(x, w, b, 1e-5)
    return dict(size=f"{R}x{C}", inputs=[x, w, b, np.float32(1e-5)], outs=[(R, C), (R,), (R,)],
                bytes=8 * R * C, variants={"v1_numpy": _np_layernorm, "v2_fused": K.layernorm_fwd_f32},
                ref=lambda: [y, m, r])


def _layernorm_bwd_inputs(rng, R, C):
    x, w, gy = _f32(rng, R, C, scale=2.0) + np.float32(0.5), _f32(rng, C), _f32(rng, R, C)
    _, m, r = ref.layernorm(x, w, np.zeros_like(w), 1e-5)
    return x, w, gy, m.astype(np.float32), r.astype(np.float32)


def layernorm_bwd_case(rng, R, C, T):
    x, w, gy, m, r = _layernorm_bwd_inputs(rng, R, C)
    gx, gw, gb = ref.layernorm_backward(gy, x, w, 1e-5)
    return dict(size=f"{R}x{C}", inputs=[gy, x, w, m, r], outs=[(R, C), (C,), (C,)], bytes=12 * R * C,
                variants={"v1_numpy": _np_layernorm_bwd, "v2_fused": _fused_layernorm_bwd},
                ref=lambda: [gx, gw, gb])


def layernorm_bwd_res_case(rng, R, C, T):
    x, w, gy, m, r = _layernorm_bwd_inputs(rng, R, C)
    gres = _f32(rng, R, C)
    gx, gw, gb = ref.layernorm_backward(gy, x, w, 1e-5)
    return dict(size=f"{R}x{C}", inputs=[gy, x, w, m, r, gres], outs=[(R, C), (C,), (C,)],
                bytes=16 * R * C,
                variants={"v1_numpy": _np_layernorm_bwd_res, "v2_fused": _fused_layernorm_bwd_res},
                ref=lambda: [gx + gres.astype(np.float64), gw, gb])


def cross_entropy_case(rng, R, C, T):
    c = min(C, 32)  # the GPT's vocabulary of jobs/gpt_ddp.toml
    x, t = _f32(rng, R, c, scale=3.0), rng.integers(0, c, R)
    loss, probs = ref.cross_entropy(x, t)
    return dict(size=f"{R}x{c}", inputs=[x, t], outs=[(R, c), (1,)], out_dtypes=[np.float32, np.float64],
                bytes=8 * R * c, variants={"v1_numpy": _np_cross_entropy, "v2_fused": _fused_cross_entropy},
                ref=lambda: [probs, np.array([loss])])


def bias_residual_case(rng, R, C, T):
    z, b, r = _f32(rng, R, C), _f32(rng, C), _f32(rng, R, C)
    return dict(size=f"{R}x{C}", inputs=[z, b, r], outs=[(R, C)], bytes=12 * R * C,
                variants={"v1_numpy": _np_bias_residual, "v2_fused": _fused_bias_residual},
                ref=lambda: [z.astype(np.float64) + b + r])


CASES = {"gelu_fwd": gelu_fwd_case, "gelu_bwd": gelu_bwd_case,
         "causal_softmax_fwd": causal_softmax_fwd_case, "causal_softmax_bwd": causal_softmax_bwd_case,
         "layernorm_fwd": layernorm_fwd_case, "layernorm_bwd": layernorm_bwd_case,
         "layernorm_bwd_res": layernorm_bwd_res_case, "bias_residual": bias_residual_case,
         "cross_entropy_fwd": cross_entropy_case}


def run(R, C, T, bench, rng, copy_bw, reps):
    rows = []
    for kernel, make in CASES.items():
        for variant in ("v1_numpy", "v2_fused"):
            case = make(rng, R, C, T)  # fresh inputs per kernel and variant
            fn = case["variants"][variant]
            dtypes = case.get("out_dtypes", [np.float32] * len(case["outs"]))
            outs = [poisoned(s, d) for s, d in zip(case["outs"], dtypes)]
            fn(*case["inputs"], *outs)
            err = max(ref.rel_err(o, r) for o, r in zip(outs, case["ref"]()))
            row = dict(kernel=kernel, variant=variant, size=case["size"], rel_err=err, ok=err < TOL)
            if bench:
                ms = time_ms(lambda: fn(*case["inputs"], *outs), reps=reps)
                gbs = case["bytes"] / (ms * 1e-3) / 1e9
                row.update(ms=ms, rate=gbs, unit="GB/s", ceiling=copy_bw, pct=100 * gbs / copy_bw)
            rows.append(row)
    return rows


def _fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def print_table(rows, out=None):
    out = sys.stdout if out is None else out
    head = (f"{'kernel':20} {'variant':9} {'size':12} {'rel_err':>9} {'ok':>3} {'ms':>9} "
            f"{'GB/s':>8} {'%copy':>6}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for r in rows:
        print(f"{r['kernel']:20} {r['variant']:9} {r['size']:12} {r['rel_err']:9.2e} "
              f"{'yes' if r['ok'] else 'NO':>3} {_fmt(r.get('ms'), '.4f'):>9} "
              f"{_fmt(r.get('rate'), '.4g'):>8} {_fmt(r.get('pct'), '.1f'):>6}", file=out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, validation only")
    p.add_argument("--json", help="write the rows and host info here")
    p.add_argument("--rows", type=int, default=1024,
                   help="rows of GELU and layer norm (default 1024: the GPT's 16 x 64 tokens)")
    p.add_argument("--cols", type=int, default=512, help="columns (default 512: the MLP's 4 x 128)")
    p.add_argument("--seq", type=int, default=64, help="attention's T (softmax (R*C/T^2, T, T))")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seed", type=int, default=None, help="default: a fresh seed per run")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time_ns() % (2**32))
    rng = np.random.default_rng(seed)
    bench = not args.smoke
    R, C, T = (5, 40, 7) if args.smoke else (args.rows, args.cols, args.seq)
    copy_bw = copy_bandwidth_gbs() if bench else None
    info = dict(host=platform.node(), processor=platform.processor(), python=platform.python_version(),
                numpy=np.__version__, seed=seed, smoke=args.smoke, copy_bandwidth_GBs=copy_bw,
                threads=os.environ.get("NUMBA_NUM_THREADS"), time=time.strftime("%Y-%m-%dT%H:%M:%S"))
    rows = run(R, C, T, bench, rng, copy_bw, args.reps)
    print(f"# CPU kernel lab (seed {seed}); one-thread copy bandwidth {_fmt(copy_bw, '.4g')} GB/s")
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
