"""Fused CPU kernels (numba.njit, cache=True) behind :mod:`hpcdp.backend.cpu`.

Each kernel does in one pass what NumPy would do in several temporaries: GELU,
row softmax / log-softmax and their backwards, attention's scaled causal softmax and
its backward (float32), cross-entropy, LayerNorm forward and backward (a float32
pair that also adds the residual stream's gradient), bias + residual, embedding
backward and the SGD/AdamW flat updates. The float32 GELU and causal softmax use
``exp_f32``, an exp in plain float32 arithmetic that vectorizes (see its section). Row kernels take 2-D
C-contiguous arrays (rows, cols); the wrappers in cpu.py reshape to that.
Reductions accumulate in float64 whatever the storage dtype, so float32 results stay
close to the float64 reference (the float32 layer norm pair sums its short rows in
float32 lanes: see its section). Kernels are serial (no prange): deterministic, and
under MPI each rank runs single-threaded anyway. Compilation happens once per dtype
signature and is cached on disk (``cache=True``).
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir as llvm_ir
from numba import njit, types
from numba.extending import intrinsic

from .philox import make_group_writer

# LLVM may reorder float sums into SIMD lanes (reassoc), fuse multiply-adds
# (contract) and use reciprocals (arcp); no nnan/ninf, so NaN and inf still
# propagate. Serial kernels stay deterministic: the order is fixed per build.
# Vectorizes the row reductions: LayerNorm fwd 4x, bwd 2.4x faster.
_FAST = {"reassoc", "contract", "nsz", "arcp"}

_GELU_S = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


# GELU(v) = 0.5 v (1 + tanh(u)), u = s (v + c v^3). The tanh runs in NumPy's SIMD
# np.tanh (about 0.4 ns/element in float32, against 10-20 ns for a scalar libm call
# per element in a numba loop, which cannot vectorize transcendentals without SVML);
# the polynomial before it and the products after it are plain loops that LLVM
# vectorizes. Three passes over the array instead of one, still ~10x faster.
@njit(cache=True, nogil=True)
def gelu_inner(x, u):
    """u <- s (x + c x^3) (the tanh argument)."""
    for i in range(x.size):
        v = x[i]
        u[i] = _GELU_S * (v + _GELU_C * v * v * v)


@njit(cache=True, nogil=True)
def gelu_outer(x, t, y):
    """y <- 0.5 x (1 + t), t = tanh(u)."""
    for i in range(x.size):
        y[i] = 0.5 * x[i] * (1.0 + t[i])


@njit(cache=True, nogil=True)
def gelu_bwd_t(x, t, gy, gx):
    """gx <- gy * d GELU/dx given t = tanh(u):
    0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 c x^2)."""
    for i in range(x.size):
        v = x[i]
        ti = t[i]
        du = _GELU_S * (1.0 + 3.0 * _GELU_C * v * v)
        gx[i] = gy[i] * (0.5 * (1.0 + ti) + 0.5 * v * (1.0 - ti * ti) * du)


# Exact GELU: 0.5 x (1 + erf(x / sqrt 2)). erf is a scalar libm call per element
# (numba has no SIMD erf), about 5x the cost of the tanh form above.
_RSQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


@njit(cache=True, nogil=True)
def gelu_exact(x, y):
    for i in range(x.size):
        v = x[i]
        y[i] = 0.5 * v * (1.0 + math.erf(v * _RSQRT2))


@njit(cache=True, nogil=True)
def gelu_exact_bwd(x, gy, gx):
    """gx <- gy * (Phi(x) + x phi(x))."""
    for i in range(x.size):
        v = x[i]
        gx[i] = gy[i] * (0.5 * (1.0 + math.erf(v * _RSQRT2)) + v * _INV_SQRT_2PI * math.exp(-0.5 * v * v))


# Row softmax in three passes: an njit pass writes x - rowmax, NumPy's SIMD np.exp
# exponentiates in place (numba's scalar exp costs ~4 ns/element, np.exp ~0.4 in
# float32), an njit pass divides by the row sums.
@njit(cache=True, nogil=True)
def shift_rows_by_max(x, y):
    n, c = x.shape
    for i in range(n):
        m = x[i, 0]
        for j in range(1, c):
            if x[i, j] > m:
                m = x[i, j]
        for j in range(c):
            y[i, j] = x[i, j] - m


@njit(cache=True, nogil=True, fastmath=_FAST)
def normalize_rows(y):
    n, c = y.shape
    for i in range(n):
        s = 0.0
        for j in range(c):
            s += y[i, j]
        inv = 1.0 / s
        for j in range(c):
            y[i, j] *= inv


@njit(cache=True, nogil=True, fastmath=_FAST)
def softmax_bwd_rows(y, gy, gx):
    n, c = y.shape
    for i in range(n):
        dot = 0.0
        for j in range(c):
            dot += gy[i, j] * y[i, j]
        for j in range(c):
            gx[i, j] = y[i, j] * (gy[i, j] - dot)


@njit(cache=True, nogil=True)
def log_softmax_rows(x, y):
    n, c = x.shape
    for i in range(n):
        m = x[i, 0]
        for j in range(1, c):
            if x[i, j] > m:
                m = x[i, j]
        s = 0.0
        for j in range(c):
            s += math.exp(x[i, j] - m)
        lse = m + math.log(s)
        for j in range(c):
            y[i, j] = x[i, j] - lse


@njit(cache=True, nogil=True)
def log_softmax_bwd_rows(y, gy, gx):
    n, c = y.shape
    for i in range(n):
        s = 0.0
        for j in range(c):
            s += gy[i, j]
        for j in range(c):
            gx[i, j] = gy[i, j] - math.exp(y[i, j]) * s


@njit(cache=True, nogil=True)
def cross_entropy_fwd(logits, targets, probs, ignore, use_ignore):
    """probs <- softmax(logits); returns the mean of -log p[target] (float64) over the
    rows whose target is not ``ignore`` (when ``use_ignore``); 0.0 if none counts."""
    n, c = logits.shape
    total = 0.0
    counted = 0
    for i in range(n):
        m = logits[i, 0]
        for j in range(1, c):
            if logits[i, j] > m:
                m = logits[i, j]
        s = 0.0
        for j in range(c):
            e = math.exp(logits[i, j] - m)
            probs[i, j] = e
            s += e
        inv = 1.0 / s
        for j in range(c):
            probs[i, j] *= inv
        if use_ignore and targets[i] == ignore:
            continue
        # log p[t] from the logits (not log of a rounded prob): stable for p -> 0
        total += math.log(s) + m - logits[i, targets[i]]
        counted += 1
    return total / counted if counted else 0.0


@njit(cache=True, nogil=True)
def cross_entropy_bwd(probs, targets, scale, gx, ignore, use_ignore):
    """gx <- scale * (probs - onehot(target)) / counted rows; ignored rows get 0."""
    n, c = probs.shape
    counted = n
    if use_ignore:
        counted = 0
        for i in range(n):
            if targets[i] != ignore:
                counted += 1
    k = scale / counted if counted else 0.0
    for i in range(n):
        if use_ignore and targets[i] == ignore:
            for j in range(c):
                gx[i, j] = 0.0
            continue
        for j in range(c):
            gx[i, j] = probs[i, j] * k
        gx[i, targets[i]] -= k


@njit(cache=True, nogil=True, fastmath=_FAST)
def layernorm_fwd(x, w, b, eps, y, mean, rstd):
    n, c = x.shape
    for i in range(n):
        s = 0.0
        for j in range(c):
            s += x[i, j]
        mu = s / c
        v = 0.0
        for j in range(c):
            d = x[i, j] - mu
            v += d * d
        r = 1.0 / math.sqrt(v / c + eps)
        mean[i] = mu
        rstd[i] = r
        for j in range(c):
            y[i, j] = (x[i, j] - mu) * r * w[j] + b[j]


@njit(cache=True, nogil=True, fastmath=_FAST)
def layernorm_bwd(gy, x, w, mean, rstd, gx, gw, gb):
    """gw, gb must be zeroed float64 accumulators of length c."""
    n, c = x.shape
    for i in range(n):
        mu = mean[i]
        r = rstd[i]
        # gx = r * (g - mean(g) - xhat * mean(g * xhat)),  g = gy * w
        sg = 0.0
        sgx = 0.0
        for j in range(c):
            xhat = (x[i, j] - mu) * r
            g = gy[i, j] * w[j]
            sg += g
            sgx += g * xhat
            gw[j] += gy[i, j] * xhat
            gb[j] += gy[i, j]
        sg /= c
        sgx /= c
        for j in range(c):
            xhat = (x[i, j] - mu) * r
            gx[i, j] = r * (gy[i, j] * w[j] - sg - xhat * sgx)


@njit(cache=True, nogil=True)
def embedding_bwd(gy, ids, out):
    """out (V, D) zeroed; rows of gy added at ids in order: deterministic."""
    n, d = gy.shape
    for i in range(n):
        row = ids[i]
        for j in range(d):
            out[row, j] += gy[i, j]


@njit(cache=True, nogil=True)
def sgd_momentum(p, g, buf, lr, momentum, wd, nesterov):
    for i in range(p.size):
        d = g[i] + wd * p[i]
        b = momentum * buf[i] + d
        buf[i] = b
        if nesterov:
            d = d + momentum * b
        else:
            d = b
        p[i] -= lr * d


@njit(cache=True, nogil=True)
def sgd_plain(p, g, lr, wd):
    for i in range(p.size):
        p[i] -= lr * (g[i] + wd * p[i])


@njit(cache=True, nogil=True)
def adamw(p, g, m, v, decay, a, b1, omb1, b2, omb2, ic2, eps):
    """p <- p*decay - a*m' / (sqrt(v'*ic2) + eps) with m', v' the updated moments.

    The scalars come in the arrays' dtype (cpu.py casts them): float32 buffers then
    update in float32 SIMD, 2.3x faster than with float64 scalars promoting every
    element (the formula is PyTorch's AdamW with a = lr / (1 - b1^t), ic2 =
    1 / (1 - b2^t))."""
    for i in range(p.size):
        gi = g[i]
        mi = b1 * m[i] + omb1 * gi
        vi = b2 * v[i] + omb2 * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] = p[i] * decay - a * mi / (math.sqrt(vi * ic2) + eps)


_write_group = make_group_writer(njit)  # the same source the CUDA kernel compiles


@njit(cache=True, nogil=True)
def dropout_mask(out, samples, per, step, layer, k0, k1, thr, keep, drop):
    """Flat mask of len(samples) rows of ``per`` elements: element j of row b is
    ``keep`` or ``drop`` from Philox at counter (j // 4, samples[b], step, layer),
    key (k0, k1) (hpcdp/backend/philox.py). Bit-identical to the CUDA kernel."""
    groups = (per + 3) // 4
    for b in range(samples.size):
        s = samples[b]
        for g in range(groups):
            _write_group(out, b * per, g, per, s, step, layer, k0, k1, thr, keep, drop)


@njit(cache=True, nogil=True)
def causal_fill(x, value, y):
    """y[b, i, j] = x[b, i, j] for j <= i, else value; x, y (batch, T1, T2)."""
    nb, t1, t2 = x.shape
    for b in range(nb):
        for i in range(t1):
            lim = min(i + 1, t2)
            for j in range(lim):
                y[b, i, j] = x[b, i, j]
            for j in range(lim, t2):
                y[b, i, j] = value


# -- float32 kernels with a vectorizable exp ------------------------------------------
# numba has no SIMD exp (no SVML), and NumPy's float32 exp / tanh run at 2-5 ns an
# element on a CPU without AVX-512 (this AMD host: np.tanh 5 ns, np.exp 2 ns). exp_f32
# is Cephes' expf in plain float32 arithmetic plus a bit cast, so the loops that call
# it vectorize (8 lanes with AVX2): GELU, and the attention softmax with its scale and
# causal mask, in one pass each. No fastmath: the order of every operation is the
# source's, so results are the same on every machine that runs the build.
_F = np.float32
_LOG2E = _F(1.44269504088896341)
_LN2_HI = _F(0.693359375)
_LN2_LO = _F(-2.12194440e-4)
_EXP_LO = _F(-87.0)
_EXP_HI = _F(88.0)
_MAGIC = _F(12582912.0)  # 1.5 * 2^23: adding and subtracting it rounds to an integer
_P0, _P1, _P2 = _F(1.9875691500e-4), _F(1.3981999507e-3), _F(8.3334519073e-3)
_P3, _P4, _P5 = _F(4.1665795894e-2), _F(1.6666665459e-1), _F(5.0000001201e-1)
_ONE, _HALF, _TWO = _F(1.0), _F(0.5), _F(2.0)
_GELU_S32, _GELU_C32 = _F(_GELU_S), _F(_GELU_C)


@intrinsic
def _bits_as_f32(typingctx, i):
    """The float32 whose bits are the low 32 bits of the integer ``i``."""
    if not isinstance(i, types.Integer):
        return None
    sig = types.float32(i)

    def codegen(context, builder, signature, args):
        v = args[0]
        if signature.args[0].bitwidth != 32:
            v = builder.trunc(v, llvm_ir.IntType(32))
        return builder.bitcast(v, llvm_ir.FloatType())
    return sig, codegen


@njit(cache=True, nogil=True, inline="always", error_model="numpy")
def exp_f32(x):
    """exp(x) for float32 x in [-87, 88] (clamped outside: exp(-inf) gives 1.6e-38,
    not 0; callers that need 0 there write it). Within 2 ulp of the float64 exp."""
    if x < _EXP_LO:  # comparisons, not min/max: a NaN stays NaN
        x = _EXP_LO
    if x > _EXP_HI:
        x = _EXP_HI
    n = (x * _LOG2E + _MAGIC) - _MAGIC  # round(x / ln 2), |n| <= 127
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5
    p = p * (r * r) + r + _ONE
    return p * _bits_as_f32((np.int32(n) + np.int32(127)) << 23)


@njit(cache=True, nogil=True, error_model="numpy")
def gelu_f32(x, y):
    """y <- GELU_tanh(x) = x * sigmoid(2u), u = s (x + c x^3): 0.5 (1 + tanh u) is
    sigmoid(2u), which needs no cancellation-prone 1 + tanh for negative x."""
    for i in range(x.size):
        v = x[i]
        u = _GELU_S32 * (v + _GELU_C32 * v * v * v)
        y[i] = v / (_ONE + exp_f32(-_TWO * u))


@njit(cache=True, nogil=True, error_model="numpy")
def gelu_bwd_f32(x, gy, gx):
    """gx <- gy * (sig + 2 x sig (1 - sig) du/dx), sig = sigmoid(2u): the derivative
    of x * sigmoid(2u), with 1 - sig = e / (1 + e) computed without cancellation."""
    for i in range(x.size):
        v = x[i]
        u = _GELU_S32 * (v + _GELU_C32 * v * v * v)
        e = exp_f32(-_TWO * u)
        sig = _ONE / (_ONE + e)
        du = _GELU_S32 * (_ONE + _F(3.0) * _GELU_C32 * v * v)
        gx[i] = gy[i] * (sig + _TWO * v * sig * (e * sig) * du)


@njit(cache=True, nogil=True, fastmath=_FAST)
def _max_f32(y, lim):
    m = y[0]
    for j in range(1, lim):
        if y[j] > m:
            m = y[j]
    return m


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def _sum_rescale(y, lim):
    """y[:lim] /= sum(y[:lim]) (the sum in float64, in SIMD lanes)."""
    s = 0.0
    for j in range(lim):
        s += y[j]
    inv = _F(1.0 / s)
    for j in range(lim):
        y[j] *= inv


@njit(cache=True, nogil=True, error_model="numpy")
def causal_softmax_f32(x, scale, y):
    """y[b, i] <- softmax(x[b, i, :i+1] * scale) and 0 for j > i; x, y (batch, T1, T2)
    float32 C-contiguous. The same as ``x * scale`` (float32), the causal mask, then
    softmax, in one pass over the kept half of each row."""
    nb, t1, t2 = x.shape
    for b in range(nb):
        for i in range(t1):
            lim = min(i + 1, t2)
            row = y[b, i]
            xr = x[b, i]
            for j in range(lim):
                row[j] = xr[j] * scale
            m = _max_f32(row, lim)
            for j in range(lim):
                row[j] = exp_f32(row[j] - m)
            _sum_rescale(row, lim)
            for j in range(lim, t2):
                row[j] = 0.0


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def causal_softmax_bwd_f32(y, gy, scale, gx):
    """gx <- scale * y * (gy - sum_j gy y) over j <= i, 0 for j > i (y is 0 there);
    float32 (the dot in float64)."""
    nb, t1, t2 = y.shape
    for b in range(nb):
        for i in range(t1):
            lim = min(i + 1, t2)
            dot = 0.0
            for j in range(lim):
                dot += gy[b, i, j] * y[b, i, j]
            d = _F(dot)
            for j in range(lim):
                gx[b, i, j] = scale * (y[b, i, j] * (gy[b, i, j] - d))
            for j in range(lim, t2):
                gx[b, i, j] = 0.0


@njit(cache=True, nogil=True, fastmath=_FAST)
def _sum_f64(y, lim):
    """sum(y[:lim]) in float64, in SIMD lanes."""
    s = 0.0
    for j in range(lim):
        s += y[j]
    return s


@njit(cache=True, nogil=True, error_model="numpy")
def cross_entropy_fwd_f32(logits, targets, probs, ignore, use_ignore):
    """``cross_entropy_fwd`` for float32 logits with ``exp_f32`` (vectorized; the float64
    kernel calls a scalar exp per element): probs <- softmax(logits) (float32), returns
    the mean of -log p[target] (float64, from the logits) over the counted rows."""
    n, c = logits.shape
    total = 0.0
    counted = 0
    for i in range(n):
        xr = logits[i]
        row = probs[i]
        m = _max_f32(xr, c)
        for j in range(c):
            row[j] = exp_f32(xr[j] - m)
        s = _sum_f64(row, c)
        inv = _F(1.0 / s)
        for j in range(c):
            row[j] *= inv
        if use_ignore and targets[i] == ignore:
            continue
        total += math.log(s) + m - xr[targets[i]]
        counted += 1
    return total / counted if counted else 0.0


# -- float32 layer norm and bias + residual ---------------------------------------------
# The generic layernorm_fwd / layernorm_bwd above accumulate in float64 whatever the
# storage: for float32 every element is converted, and the weight and bias gradients
# are read-modify-writes of float64 arrays per element (75 and 120 us for the GPT's
# 1024 x 128 on this AMD host, 4-6x a copy). These keep the row sums in float32 SIMD
# lanes (the rows are short; the two-pass variance has no cancellation) and sum the
# weight and bias gradients in float32 over blocks of _LN_BLOCK rows, each block's sum
# added into float64 totals: 42 and 47 us, within 2e-7 of the float64 reference at
# these sizes. Serial and in a fixed order: the same bits on every run and rank.
_LN_BLOCK = 16


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def layernorm_fwd_f32(x, w, b, eps, y, mean, rstd):
    """y <- (x - mean) * rstd * w + b over each row of x (n, c) float32; mean, rstd (n,)."""
    n, c = x.shape
    inv_c = _F(1.0 / c)
    for i in range(n):
        xr = x[i]
        yr = y[i]
        s = _F(0.0)
        for j in range(c):
            s += xr[j]
        mu = s * inv_c
        v = _F(0.0)
        for j in range(c):
            d = xr[j] - mu
            v += d * d
        r = _F(1.0 / math.sqrt(v * inv_c + eps))
        mean[i] = mu
        rstd[i] = r
        for j in range(c):
            yr[j] = (xr[j] - mu) * r * w[j] + b[j]


@njit(cache=True, nogil=True, fastmath=_FAST, error_model="numpy")
def layernorm_bwd_f32(gy, x, w, mean, rstd, gres, add_res, gx, gw, gb):
    """gx <- rstd (g - mean(g) - xhat mean(g xhat)), g = gy w, plus gres (n, c) when
    ``add_res`` (the gradient that already reached x by another path, e.g. the residual
    stream: one pass instead of a second add); gw, gb (c,) float32 <- the column sums
    of gy xhat and gy. ``gres`` is any float32 (n, c) array when not ``add_res``."""
    n, c = x.shape
    inv_c = _F(1.0 / c)
    tw = np.zeros(c)  # float64 totals
    tb = np.zeros(c)
    aw = np.zeros(c, dtype=np.float32)  # this block's float32 sums
    ab = np.zeros(c, dtype=np.float32)
    for i in range(n):
        mu = mean[i]
        r = rstd[i]
        xr = x[i]
        gr = gy[i]
        gxr = gx[i]
        sg = _F(0.0)
        sgx = _F(0.0)
        for j in range(c):
            xhat = (xr[j] - mu) * r
            g = gr[j] * w[j]
            sg += g
            sgx += g * xhat
            aw[j] += gr[j] * xhat
            ab[j] += gr[j]
        sg *= inv_c
        sgx *= inv_c
        if add_res:
            rr = gres[i]
            for j in range(c):
                xhat = (xr[j] - mu) * r
                gxr[j] = rr[j] + r * (gr[j] * w[j] - sg - xhat * sgx)
        else:
            for j in range(c):
                xhat = (xr[j] - mu) * r
                gxr[j] = r * (gr[j] * w[j] - sg - xhat * sgx)
        if i % _LN_BLOCK == _LN_BLOCK - 1 or i == n - 1:
            for j in range(c):
                tw[j] += aw[j]
                tb[j] += ab[j]
                aw[j] = 0.0
                ab[j] = 0.0
    for j in range(c):
        gw[j] = tw[j]
        gb[j] = tb[j]


@njit(cache=True, nogil=True)
def bias_residual_add(z, b, res):
    """z[i, j] <- (z[i, j] + b[j]) + res[i, j] in place, in that order (the same
    bits as adding the bias and then the residual): a linear layer's bias and the
    residual stream in one pass. z, res (n, c); b (c,)."""
    n, c = z.shape
    for i in range(n):
        zr = z[i]
        rr = res[i]
        for j in range(c):
            zr[j] = (zr[j] + b[j]) + rr[j]


def rows(x):
    """View ``x`` as 2-D (rows, last axis), C-contiguous (copies only if it must)."""
    x = np.ascontiguousarray(x)
    return x.reshape(-1, x.shape[-1]) if x.ndim != 2 else x
