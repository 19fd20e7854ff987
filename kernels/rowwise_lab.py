"""Softmax variants, and the other memory-bound kernels measured against copy
bandwidth (each entry: how to build inputs, run into poisoned outputs, the
float64 reference, and the bytes one call must move at minimum).

Softmax:
v1 thread-per-row: one thread walks a whole row three times (max, sum, write);
   no cooperation, uncoalesced across threads.
v2 block, 3 pass: one block per row, tree reductions for max and for sum, then
   the write: reads the row three times.
v3 block, online: the backend's kernel, max and sum of exp in one pass
   (rescaling the running sum), then the write: two reads, one write.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from hpcdp.backend.cuda import elementwise as ew
from hpcdp.backend.cuda import optim, rowwise
from hpcdp.backend.cuda import reduce as red
from hpcdp.backend.cuda._util import row_threads

from . import reference as ref


@cuda.jit
def _thread_row(x, out, R, C):
    r = cuda.grid(1)
    if r < R:
        m = float32(-math.inf)
        for j in range(C):
            m = max(m, x[r * C + j])
        s = float32(0)
        for j in range(C):
            s += math.exp(x[r * C + j] - m)
        for j in range(C):
            out[r * C + j] = math.exp(x[r * C + j] - m) / s


@cuda.jit
def _block_3pass(x, out, C):
    sm = cuda.shared.array(1024, float32)
    base = cuda.blockIdx.x * C
    m = float32(-math.inf)
    j = cuda.threadIdx.x
    while j < C:
        m = max(m, x[base + j])
        j += cuda.blockDim.x
    m = red.block_reduce(red.MAX, sm, m)
    s = float32(0)
    j = cuda.threadIdx.x
    while j < C:
        s += math.exp(x[base + j] - m)
        j += cuda.blockDim.x
    s = red.block_reduce(red.SUM, sm, s)
    j = cuda.threadIdx.x
    while j < C:
        out[base + j] = math.exp(x[base + j] - m) / s
        j += cuda.blockDim.x


def softmax_v1(x, out, R, C):
    _thread_row[(R + 127) // 128, 128](x, out, R, C)


def softmax_v2(x, out, R, C):
    _block_3pass[R, row_threads(C)](x, out, C)


def softmax_v3(x, out, R, C):
    rowwise.launch_rows(rowwise.kernels(np.float32)["softmax"], R, C, rowwise.SOFTMAX, x, out, C)


SOFTMAX_VARIANTS = {"v1_thread_row": softmax_v1, "v2_block_3pass": softmax_v2,
                    "v3_block_online": softmax_v3}


# -- single-variant memory-bound kernels: (inputs, run, reference, bytes) -----------

def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def gelu_case(rng, R, C):
    x = _f32(rng, R * C)
    return dict(inputs=[x], outs=[(R * C,)], bytes=8 * R * C,
                run=lambda x, o: ew.unary(ew.GELU, x, o), ref=lambda: [ref.gelu(x)])


def bias_add_case(rng, R, C):
    x, b = _f32(rng, R * C), _f32(rng, C)
    return dict(inputs=[x, b], outs=[(R * C,)], bytes=8 * R * C,
                run=lambda x, b, o: ew.binary_trailing(ew.ADD, x, b, o),
                ref=lambda: [(x.astype(np.float64).reshape(R, C) + b).reshape(-1)])


def layernorm_case(rng, R, C):
    x, w, b = _f32(rng, R, C), _f32(rng, C), _f32(rng, C)
    k = rowwise.kernels(np.float32)["ln_fwd"]
    T = np.float32

    def run(x_, w_, b_, y, mean, rstd):
        rowwise.launch_rows(k, R, C, x_.reshape(R * C), w_, b_, y, mean, rstd, C, T(1.0 / C), T(1e-5))
    y, m, r = ref.layernorm(x, w, b, 1e-5)
    return dict(inputs=[x, w, b], outs=[(R * C,), (R,), (R,)], bytes=8 * R * C, run=run,
                ref=lambda: [y.reshape(-1), m, r])


def cross_entropy_case(rng, R, C):
    x, t = _f32(rng, R, C), rng.integers(0, C, R)
    k = rowwise.kernels(np.float32)["xent"]
    loss_ref, p_ref = ref.cross_entropy(x, t)
    rows_ref = -np.log(p_ref[np.arange(R), t])

    def run(x_, t_, probs, row_loss):
        rowwise.launch_rows(k, R, C, x_.reshape(R * C), t_, probs, row_loss, C, np.int64(0), False)
    return dict(inputs=[x, t], outs=[(R * C,), (R,)], bytes=8 * R * C, run=run,
                ref=lambda: [p_ref.reshape(-1), rows_ref])


def row_sum_case(rng, R, C):
    x = _f32(rng, R * C)
    return dict(inputs=[x], outs=[(R,)], bytes=4 * R * C,
                run=lambda x_, o: red.reduce3(red.SUM, x_, o, R, C, 1, np.float32, cuda.device_array),
                ref=lambda: [x.astype(np.float64).reshape(R, C).sum(1)])


def adamw_case(rng, R, C):
    n = R * C
    p, g, m = _f32(rng, n), _f32(rng, n), _f32(rng, n) * 0.1
    v = np.abs(_f32(rng, n)) * 0.1
    wp, wm, wv = ref.adamw(p, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3)
    # in-place kernel: the "outputs" are the updated p, m, v (poisoning does not apply)
    return dict(inputs=[p, g, m, v], outs=[], bytes=28 * n, in_place=[0, 2, 3],
                run=lambda p_, g_, m_, v_: optim.adamw(p_, g_, m_, v_, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3),
                ref=lambda: [wp, wm, wv])


MEMORY_BOUND = {"gelu": gelu_case, "bias_add": bias_add_case, "layernorm_fwd": layernorm_case,
                "cross_entropy_fwd": cross_entropy_case, "row_sum": row_sum_case,
                "adamw": adamw_case}
