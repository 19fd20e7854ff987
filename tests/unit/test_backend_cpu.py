"""CPU backend primitives against plain NumPy references, float32 and float64."""

import inspect

import numpy as np
import pytest

from hpcdp.backend import Backend, get_backend
from hpcdp.backend.cpu import CPUBackend

be = get_backend("cpu")
DTYPES = [np.float32, np.float64]


def rand(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def tol(dtype):
    return dict(rtol=1e-5, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)


def test_implements_every_abstract_primitive():
    assert not CPUBackend.__abstractmethods__
    for name, fn in inspect.getmembers(Backend, inspect.isfunction):
        if getattr(fn, "__isabstractmethod__", False):
            assert getattr(CPUBackend, name) is not fn, name
    assert get_backend("cpu") is be
    with pytest.raises(ValueError, match="cpu"):
        get_backend("tpu")


def test_in_place_helpers_and_flat_view():
    flat = np.arange(10.0)
    v = be.flat_view(flat, 2, (2, 3))
    assert np.shares_memory(v, flat) and v.shape == (2, 3)
    be.add_(v, np.ones(3))  # broadcasting in-place add
    np.testing.assert_array_equal(flat[2:8], np.arange(2.0, 8.0) + 1)
    be.fill_(v, 0.0)
    assert np.all(flat[2:8] == 0) and flat[8] == 8
    with pytest.raises(ValueError, match="outside"):
        be.flat_view(flat, 8, (3,))
    be.copy_(v, np.full((2, 3), 5.0))
    assert np.all(flat[2:8] == 5)


def test_sum_to_shape_and_broadcast_to():
    x = rand(2, 3, 4)
    np.testing.assert_allclose(be.sum_to_shape(x, (3, 1)), x.sum(axis=(0, 2)).reshape(3, 1))
    np.testing.assert_allclose(be.sum_to_shape(x, (4,)), x.sum(axis=(0, 1)))
    assert be.sum_to_shape(x, (2, 3, 4)) is x
    b = be.broadcast_to(np.arange(3.0), (2, 3))
    assert b.flags.c_contiguous and b.flags.writeable
    np.testing.assert_array_equal(b, [[0, 1, 2], [0, 1, 2]])


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul_transpose_flags(ta, tb):
    a, b = rand(2, 3, 4, seed=1), rand(2, 4, 5, seed=2)
    aa = np.swapaxes(a, -1, -2).copy() if ta else a
    bb = np.swapaxes(b, -1, -2).copy() if tb else b
    np.testing.assert_allclose(be.matmul(aa, bb, ta, tb), a @ b, rtol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_and_backward(dtype):
    x = rand(3, 7, seed=3, dtype=dtype)
    x64 = x.astype(np.float64)
    t = np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3))
    y = be.gelu(x)
    assert y.dtype == dtype
    np.testing.assert_allclose(y, 0.5 * x64 * (1 + t), **tol(dtype))
    h = 1e-6
    xp, xm = x64 + h, x64 - h
    f = lambda z: 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))
    gy = rand(3, 7, seed=4, dtype=dtype)
    num = gy * (f(xp) - f(xm)) / (2 * h)
    np.testing.assert_allclose(be.gelu_backward(x, gy), num, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_long_strided_and_extreme_inputs(dtype):
    # long enough for the vectorized loop body plus a remainder; a strided view;
    # saturated tails: GELU(-30) = -0 (no NaN), GELU(30) = 30, slopes 0 and 1
    x = np.concatenate([rand(1037, seed=5, dtype=dtype) * 4, np.array([-30, 30], dtype)])
    xs = np.stack([x, x]).T  # (n, 2), not C-contiguous
    x64 = x.astype(np.float64)
    ref = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    y = be.gelu(xs)
    assert y.shape == xs.shape and y.dtype == dtype
    np.testing.assert_allclose(y[:, 1], ref, **tol(dtype))
    g = be.gelu_backward(xs, np.ones_like(xs))
    assert np.all(np.isfinite(g))
    np.testing.assert_allclose(g[-2:, 0], [0.0, 1.0], atol=1e-6)


def test_tune_malloc_applies_once_and_respects_opt_out():
    import os
    import platform
    import subprocess
    import sys

    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    code = "from hpcdp.backend.cpu import tune_malloc; print(tune_malloc())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    on = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        check=True).stdout.strip()
    off = subprocess.run([sys.executable, "-c", code], env={**env, "HPCDP_MALLOC_TUNE": "0"},
                         capture_output=True, text=True, check=True).stdout.strip()
    user = subprocess.run([sys.executable, "-c", code], env={**env, "MALLOC_ARENA_MAX": "2"},
                          capture_output=True, text=True, check=True).stdout.strip()
    assert (on, off, user) == (str(glibc), "False", "False")


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_family(dtype):
    x = rand(2, 3, 6, seed=5, dtype=dtype) * 10
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    y = be.softmax(x)
    assert y.dtype == dtype and y.shape == x.shape
    np.testing.assert_allclose(y, p, **tol(dtype))
    np.testing.assert_allclose(be.log_softmax(x), np.log(p), **tol(dtype))
    gy = rand(2, 3, 6, seed=6, dtype=dtype)
    ref = p * (gy - (gy * p).sum(-1, keepdims=True))
    np.testing.assert_allclose(be.softmax_backward(y, gy), ref, **tol(dtype))
    ref_l = gy - p * gy.sum(-1, keepdims=True)
    np.testing.assert_allclose(be.log_softmax_backward(be.log_softmax(x), gy), ref_l, **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_forward_backward(dtype):
    x = rand(8, 5, seed=7, dtype=dtype)
    t = np.array([0, 1, 2, 3, 4, 0, 1, 2])
    x64 = x.astype(np.float64)
    lp = x64 - np.log(np.exp(x64).sum(1, keepdims=True))
    loss, probs = be.cross_entropy(x, t)
    assert loss.shape == () and loss.dtype == dtype
    assert float(loss) == pytest.approx(-lp[np.arange(8), t].mean(), rel=1e-6)
    g = be.cross_entropy_backward(probs, t, 2.0)
    ref = np.exp(lp)
    ref[np.arange(8), t] -= 1
    np.testing.assert_allclose(g, ref * 2.0 / 8, **tol(dtype))
    with pytest.raises(ValueError, match="targets"):
        be.cross_entropy(x, np.array([0, 5, 0, 0, 0, 0, 0, 0]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [6, 131])  # 131: vectorized row loops plus a remainder
def test_layernorm_forward_backward(dtype, c):
    x = rand(4, 3, c, seed=8, dtype=dtype) * 3 + 1
    w, b = rand(c, seed=9, dtype=dtype), rand(c, seed=10, dtype=dtype)
    y, mean, rstd = be.layernorm(x, w, b, 1e-5)
    x64 = x.astype(np.float64)
    mu, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    xhat = (x64 - mu) / np.sqrt(var + 1e-5)
    np.testing.assert_allclose(y, xhat * w + b, **tol(dtype))
    gy = rand(4, 3, c, seed=11, dtype=dtype)
    gx, gw, gb = be.layernorm_backward(gy, x, w, mean, rstd)
    g = gy * w
    r = 1 / np.sqrt(var + 1e-5)
    ref_gx = r * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
    np.testing.assert_allclose(gx, ref_gx, rtol=1e-4 if dtype == np.float32 else 1e-10, atol=1e-5)
    np.testing.assert_allclose(gw, (gy * xhat).sum((0, 1)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gb, gy.sum((0, 1)), rtol=1e-5, atol=1e-5)
    assert gx.dtype == gw.dtype == gb.dtype == dtype


def test_embedding_and_deterministic_backward():
    table = rand(6, 3, seed=12)
    ids = np.array([[5, 0, 5], [5, 2, 1]])
    np.testing.assert_array_equal(be.embedding(table, ids), table[ids])
    gy = rand(2, 3, 3, seed=13, dtype=np.float32)
    g1 = be.embedding_backward(gy, ids, 6)
    ref = np.zeros((6, 3), np.float32)
    np.add.at(ref, ids.reshape(-1), gy.reshape(-1, 3))
    np.testing.assert_array_equal(g1, ref)  # same order of adds: bitwise equal
    np.testing.assert_array_equal(be.embedding_backward(gy, ids, 6), g1)


def test_causal_mask_fill_and_dropout_mask():
    x = np.ones((2, 3, 3))
    y = be.causal_mask_fill(x, -5.0)
    np.testing.assert_array_equal(y[1], [[1, -5, -5], [1, 1, -5], [1, 1, 1]])
    assert np.all(x == 1)  # new array
    key = dict(seed=3, step=0, layer=1, samples=np.arange(50))
    m1, m2 = be.dropout_mask((50, 40), 0.2, **key), be.dropout_mask((50, 40), 0.2, **key)
    np.testing.assert_array_equal(m1, m2)
    assert not np.array_equal(m1, be.dropout_mask((50, 40), 0.2, **{**key, "seed": 4}))
    with pytest.raises(ValueError, match="dropout"):
        be.dropout_mask((2,), 1.0, seed=0, step=0, layer=1, samples=np.arange(2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 5, 5), (4, 6), (3, 6, 4)])
def test_causal_mask_then_softmax(dtype, shape):
    # square, wide (T2 > T1) and tall (T1 > T2) masks; -inf entries give exact zeros
    x = rand(*shape, seed=9, dtype=dtype) * 5
    t1, t2 = shape[-2:]
    keep = np.tril(np.ones((t1, t2), dtype=bool))
    y = be.causal_mask_fill(x, float("-inf"))
    assert y.dtype == dtype and y.shape == x.shape and y.flags.c_contiguous
    np.testing.assert_array_equal(y, np.where(keep, x, -np.inf))
    np.testing.assert_array_equal(be.causal_mask_fill(np.asfortranarray(x), 0.0),
                                  np.where(keep, x, 0.0))
    p = be.softmax(y)
    x64 = np.where(keep, x.astype(np.float64), -np.inf)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    np.testing.assert_allclose(p, e / e.sum(-1, keepdims=True), **tol(dtype))
    assert np.all(p[..., ~keep] == 0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2, 3, 9, 9), (4, 6), (3, 6, 4)])
def test_causal_softmax_fused_and_its_backward(dtype, shape):
    # attention's scale + causal mask + softmax in one call (float32: the fused kernel
    # with its own exp; float64: the composed primitives), against float64 NumPy
    x = rand(*shape, seed=10, dtype=dtype) * 8
    scale = 0.3
    t1, t2 = shape[-2:]
    keep = np.tril(np.ones((t1, t2), dtype=bool))
    p = be.causal_softmax(x, scale)
    assert p.dtype == dtype and p.shape == x.shape
    z = np.where(keep, x.astype(np.float64) * scale, -np.inf)
    e = np.exp(z - z.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(p, want, **tol(dtype))
    assert np.all(p[..., ~keep] == 0)
    gy = rand(*shape, seed=11, dtype=dtype)
    g = be.causal_softmax_backward(p, gy, scale)
    gy64 = gy.astype(np.float64)
    gwant = scale * want * (gy64 - (gy64 * want).sum(-1, keepdims=True))
    np.testing.assert_allclose(g, gwant, **tol(dtype))
    assert np.all(g[..., ~keep] == 0)


def test_float32_exp_and_gelu_kernels_stay_close_to_float64():
    # the float32 kernels' own exp (Cephes expf + a bit cast): within 2 ulp over its
    # range, NaN stays NaN; GELU through it within a few float32 ulp of float64's
    from hpcdp.backend import cpu_kernels as K
    x = np.linspace(-30, 30, 20001).astype(np.float32)
    x = np.concatenate([x, np.array([np.nan, -1e30, 1e30, 0.0], np.float32)])
    y = be.gelu(x)
    x64 = x.astype(np.float64)
    ref = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    assert np.isnan(y[-4]) and y[-1] == 0.0 and y[-2] == np.float32(1e30)
    np.testing.assert_allclose(y[:-4], ref[:-4], rtol=2e-6, atol=1e-7)
    z = np.linspace(-80, 80, 4001).astype(np.float32)
    e = np.array([K.exp_f32(v) for v in z], np.float32)
    np.testing.assert_allclose(e, np.exp(z.astype(np.float64)), rtol=2.5e-7)
    assert np.isnan(K.exp_f32(np.float32(np.nan)))


def test_row_kernels_propagate_nan_to_their_row_only():
    # the fast-math kernels reorder sums but must not assume NaN-free inputs
    x = rand(4, 33, seed=12, dtype=np.float32)
    x[1, 5] = np.nan
    w, b = np.ones(33, np.float32), np.zeros(33, np.float32)
    y, _, _ = be.layernorm(x, w, b, 1e-5)
    assert np.all(np.isnan(y[1])) and np.all(np.isfinite(np.delete(y, 1, axis=0)))
    gx, _, _ = be.layernorm_backward(np.ones_like(x), x, w, *be.layernorm(x, w, b, 1e-5)[1:])
    assert np.all(np.isnan(gx[1])) and np.all(np.isfinite(np.delete(gx, 1, axis=0)))


def test_equal_and_relu_backward():
    a = np.array([1.0, 2.0, 2.0])
    np.testing.assert_array_equal(be.equal(a, 2.0), [0, 1, 1])
    np.testing.assert_array_equal(be.relu_backward(np.array([-1.0, 0.0, 3.0]), np.ones(3) * 2),
                                  [0, 0, 2])


def _sgd_ref(p, g, buf, lr, mom, wd, nesterov, steps):
    p, buf = p.copy(), buf.copy()
    for _ in range(steps):
        d = g + wd * p
        if mom:
            buf = mom * buf + d
            d = d + mom * buf if nesterov else buf
        p = p - lr * d
    return p, buf


@pytest.mark.parametrize("mom,wd,nesterov", [(0.0, 0.0, False), (0.0, 0.1, False),
                                             (0.9, 0.01, False), (0.9, 0.01, True)])
def test_sgd_update(mom, wd, nesterov):
    p, g = rand(50, seed=14), rand(50, seed=15)
    buf = np.zeros(50)
    ref_p, ref_buf = _sgd_ref(p, g, buf, 0.1, mom, wd, nesterov, 3)
    for _ in range(3):
        be.sgd_update(p, g, buf if mom else None, 0.1, mom, wd, nesterov)
    np.testing.assert_allclose(p, ref_p, rtol=1e-12)
    if mom:
        np.testing.assert_allclose(buf, ref_buf, rtol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_adamw_update(dtype):
    p, g = rand(40, seed=16, dtype=dtype), rand(40, seed=17, dtype=dtype)
    m, v = np.zeros(40, dtype), np.zeros(40, dtype)
    rp, rm, rv = p.astype(np.float64), np.zeros(40), np.zeros(40)
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.95, 1e-8, 0.1
    for step in (1, 2, 3):
        be.adamw_update(p, g, m, v, lr, b1, b2, eps, wd, step)
        rp = rp * (1 - lr * wd)
        rm = b1 * rm + (1 - b1) * g
        rv = b2 * rv + (1 - b2) * g.astype(np.float64) ** 2
        rp = rp - lr * (rm / (1 - b1 ** step)) / (np.sqrt(rv / (1 - b2 ** step)) + eps)
    np.testing.assert_allclose(p, rp, **tol(dtype))
    with pytest.raises(ValueError, match="1-based"):
        be.adamw_update(p, g, m, v, lr, b1, b2, eps, wd, 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layernorm_backward_add_and_weight_sums_over_many_rows(dtype):
    # 50 rows: the float32 kernel sums the weight/bias gradients in blocks of 16 rows
    x = rand(50, 40, seed=13, dtype=dtype) * 2 + 0.5
    w, b = rand(40, seed=14, dtype=dtype), rand(40, seed=15, dtype=dtype)
    gy, gres = rand(50, 40, seed=16, dtype=dtype), rand(50, 40, seed=17, dtype=dtype)
    _, mean, rstd = be.layernorm(x, w, b, 1e-5)
    gx, gw, gb = be.layernorm_backward(gy, x, w, mean, rstd)
    gx2, gw2, gb2 = be.layernorm_backward_add(gy, x, w, mean, rstd, gres)
    np.testing.assert_array_equal(gw2, gw)
    np.testing.assert_array_equal(gb2, gb)
    if dtype == np.float64:  # the composed path: the engine's add, bit for bit
        np.testing.assert_array_equal(gx2, np.add(gres, gx))
    np.testing.assert_allclose(gx2, gres + gx, **tol(dtype))
    x64 = x.astype(np.float64)
    xhat = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(gw, (gy * xhat).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gb, gy.astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)
    # the abstract default composes the same way
    gx3, _, _ = Backend.layernorm_backward_add(be, gy, x, w, mean, rstd, gres)
    np.testing.assert_array_equal(gx3, np.add(gres, gx))


@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_residual_add_is_bias_then_residual_bit_for_bit(dtype):
    z, bias, res = rand(7, 33, seed=18, dtype=dtype), rand(33, seed=19, dtype=dtype), rand(7, 33, seed=20, dtype=dtype)
    ref = (z + bias) + res
    for fn in (be.bias_residual_add_, lambda *a: Backend.bias_residual_add_(be, *a)):
        out = z.copy()
        fn(out, bias, res)
        np.testing.assert_array_equal(out, ref)
    out = z.copy()
    be.bias_residual_add_(out, None, res)
    np.testing.assert_array_equal(out, z + res)
