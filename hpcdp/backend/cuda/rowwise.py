"""Fused row-wise kernels, one block per row of a (rows, C) view: softmax and
log-softmax (online max/sum: one read pass for the statistics, one read+write
pass for the output), their backward passes, cross-entropy with its
probabilities, and LayerNorm forward/backward.

Row statistics go through a shared-memory tree (``reduce.block_reduce``), so
results are deterministic. LayerNorm's weight/bias gradients are column sums over
rows: a separate column kernel, no atomics.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda

from ._util import nbtype, row_threads
from .reduce import COLS_X, COLS_Y, MAX, SMEM, SUM, block_reduce

SOFTMAX, LOG_SOFTMAX = 0, 1


@cuda.jit(device=True)
def block_max_sumexp(sm_m, sm_s, m, s):
    """Combine per-thread online-softmax pairs (max, sum of exp(x - max))."""
    tid = cuda.threadIdx.x
    sm_m[tid] = m
    sm_s[tid] = s
    cuda.syncthreads()
    h = cuda.blockDim.x // 2
    while h > 0:
        if tid < h:
            m1 = sm_m[tid]
            m2 = sm_m[tid + h]
            mm = max(m1, m2)
            # a thread that saw no element has (-inf, 0): keep its 0, avoid exp(nan)
            s1 = sm_s[tid]
            if m1 != mm:
                s1 = s1 * math.exp(m1 - mm)
            s2 = sm_s[tid + h]
            if m2 != mm:
                s2 = s2 * math.exp(m2 - mm)
            sm_m[tid] = mm
            sm_s[tid] = s1 + s2
        cuda.syncthreads()
        h //= 2
    m = sm_m[0]
    s = sm_s[0]
    cuda.syncthreads()
    return m, s


@cuda.jit(device=True)
def row_stats(sm_m, sm_s, x, base, C, zero, one, ninf):
    """(max, sum exp(x - max)) of x[base : base + C], online in one pass."""
    m = ninf
    s = zero
    j = cuda.threadIdx.x
    while j < C:
        v = x[base + j]
        if v > m:
            if s != zero:
                s = s * math.exp(m - v)
            s = s + one
            m = v
        elif v != ninf:  # -inf (masked) adds nothing; exp(-inf - -inf) would be NaN
            s += math.exp(v - m)
        j += cuda.blockDim.x
    return block_max_sumexp(sm_m, sm_s, m, s)


@lru_cache(maxsize=None)
def _kernels(dtype):
    t = nbtype(dtype)
    T = np.dtype(dtype).type
    Z, ONE, NINF = T(0), T(1), T(-np.inf)

    @cuda.jit
    def softmax(mode, x, out, C):
        sm_m = cuda.shared.array(SMEM, t)
        sm_s = cuda.shared.array(SMEM, t)
        base = cuda.blockIdx.x * C
        m, s = row_stats(sm_m, sm_s, x, base, C, Z, ONE, NINF)
        ls = math.log(s)
        inv = ONE / s
        j = cuda.threadIdx.x
        while j < C:
            if mode == SOFTMAX:
                out[base + j] = math.exp(x[base + j] - m) * inv
            else:
                out[base + j] = x[base + j] - m - ls
            j += cuda.blockDim.x

    @cuda.jit
    def softmax_bwd(mode, y, gy, gx, C):
        # softmax:     gx = y * (gy - sum(gy * y))
        # log_softmax: gx = gy - exp(y) * sum(gy)
        sm = cuda.shared.array(SMEM, t)
        base = cuda.blockIdx.x * C
        acc = Z
        j = cuda.threadIdx.x
        while j < C:
            if mode == SOFTMAX:
                acc += gy[base + j] * y[base + j]
            else:
                acc += gy[base + j]
            j += cuda.blockDim.x
        d = block_reduce(SUM, sm, acc)
        j = cuda.threadIdx.x
        while j < C:
            if mode == SOFTMAX:
                gx[base + j] = y[base + j] * (gy[base + j] - d)
            else:
                gx[base + j] = gy[base + j] - math.exp(y[base + j]) * d
            j += cuda.blockDim.x

    @cuda.jit
    def xent(x, targets, probs, row_loss, C, ignore, use_ignore):
        sm_m = cuda.shared.array(SMEM, t)
        sm_s = cuda.shared.array(SMEM, t)
        r = cuda.blockIdx.x
        base = r * C
        m, s = row_stats(sm_m, sm_s, x, base, C, Z, ONE, NINF)
        inv = ONE / s
        j = cuda.threadIdx.x
        while j < C:
            probs[base + j] = math.exp(x[base + j] - m) * inv
            j += cuda.blockDim.x
        if cuda.threadIdx.x == 0:
            tr = targets[r]
            if use_ignore and tr == ignore:  # left out: never read x at an ignored (maybe negative) id
                row_loss[r] = Z
            else:
                row_loss[r] = m + math.log(s) - x[base + tr]

    @cuda.jit
    def xent_counted(targets, ignore, w, n):
        # w[r] = 1 for a row that counts, 0 for one whose target is ``ignore``
        i = cuda.grid(1)
        while i < n:
            w[i] = Z if targets[i] == ignore else ONE
            i += cuda.gridsize(1)

    @cuda.jit
    def xent_bwd(probs, targets, g, gx, C, inv_rows, count, ignore, use_ignore):
        # gx = (probs - onehot(target)) * g / rows counted, g (and with ``use_ignore``
        # the count, clamped >= 1) read on the device: no sync. Ignored rows get 0.
        r = cuda.blockIdx.x
        base = r * C
        tr = targets[r]
        if use_ignore:
            scale = Z if tr == ignore else g[0] / count[0]
        else:
            scale = g[0] * inv_rows
        j = cuda.threadIdx.x
        while j < C:
            p = probs[base + j]
            if j == tr:
                p -= ONE
            gx[base + j] = p * scale
            j += cuda.blockDim.x

    @cuda.jit
    def ln_fwd(x, w, b, y, mean, rstd, C, inv_c, eps):
        sm = cuda.shared.array(SMEM, t)
        r = cuda.blockIdx.x
        base = r * C
        acc = Z
        j = cuda.threadIdx.x
        while j < C:
            acc += x[base + j]
            j += cuda.blockDim.x
        mu = block_reduce(SUM, sm, acc) * inv_c
        acc = Z
        j = cuda.threadIdx.x
        while j < C:
            d = x[base + j] - mu
            acc += d * d
            j += cuda.blockDim.x
        rs = ONE / math.sqrt(block_reduce(SUM, sm, acc) * inv_c + eps)
        j = cuda.threadIdx.x
        while j < C:
            y[base + j] = (x[base + j] - mu) * rs * w[j] + b[j]
            j += cuda.blockDim.x
        if cuda.threadIdx.x == 0:
            mean[r] = mu
            rstd[r] = rs

    @cuda.jit
    def ln_bwd_x(gy, x, w, mean, rstd, gx, C, inv_c):
        # gx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = gy * w
        sm = cuda.shared.array(SMEM, t)
        r = cuda.blockIdx.x
        base = r * C
        mu = mean[r]
        rs = rstd[r]
        a = Z
        bsum = Z
        j = cuda.threadIdx.x
        while j < C:
            g = gy[base + j] * w[j]
            a += g
            bsum += g * (x[base + j] - mu) * rs
            j += cuda.blockDim.x
        a = block_reduce(SUM, sm, a) * inv_c
        bsum = block_reduce(SUM, sm, bsum) * inv_c
        j = cuda.threadIdx.x
        while j < C:
            xh = (x[base + j] - mu) * rs
            gx[base + j] = rs * (gy[base + j] * w[j] - a - xh * bsum)
            j += cuda.blockDim.x

    @cuda.jit
    def ln_bwd_wb(gy, x, mean, rstd, gw, gb, rows, C):
        # column sums over rows: gw = sum gy * xhat, gb = sum gy
        smw = cuda.shared.array((COLS_Y, COLS_X), t)
        smb = cuda.shared.array((COLS_Y, COLS_X), t)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        c = cuda.blockIdx.x * COLS_X + tx
        aw = Z
        ab = Z
        if c < C:
            r = ty
            while r < rows:
                g = gy[r * C + c]
                aw += g * (x[r * C + c] - mean[r]) * rstd[r]
                ab += g
                r += COLS_Y
        smw[ty, tx] = aw
        smb[ty, tx] = ab
        cuda.syncthreads()
        s = COLS_Y // 2
        while s > 0:
            if ty < s:
                smw[ty, tx] += smw[ty + s, tx]
                smb[ty, tx] += smb[ty + s, tx]
            cuda.syncthreads()
            s //= 2
        if ty == 0 and c < C:
            gw[c] = smw[0, tx]
            gb[c] = smb[0, tx]

    return dict(softmax=softmax, softmax_bwd=softmax_bwd, xent=xent, xent_bwd=xent_bwd, xent_counted=xent_counted,
                ln_fwd=ln_fwd, ln_bwd_x=ln_bwd_x, ln_bwd_wb=ln_bwd_wb)


def kernels(dtype):
    return _kernels(np.dtype(dtype).str)


def launch_rows(kernel, rows, C, *args):
    if rows:
        kernel[rows, row_threads(C)](*args)


def launch_cols(kernel, C, *args):
    if C:
        kernel[((C + COLS_X - 1) // COLS_X,), (COLS_X, COLS_Y)](*args)


__all__ = ["SOFTMAX", "LOG_SOFTMAX", "MAX", "kernels", "launch_rows", "launch_cols"]
