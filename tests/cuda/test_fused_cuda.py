"""Fused row-wise kernels (softmax, log-softmax, cross-entropy, LayerNorm),
the deterministic embedding backward and the fused optimizer updates against
float64 references; when the CPU backend exists, against it too."""

import numpy as np
import pytest

from kernels import reference as ref


def _close(be, got, want, tol=1e-12):
    got = be.to_numpy(got)
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    assert ref.rel_err(got, want) < tol


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 37), (2, 300)])  # rows shorter/longer than a block
def test_softmax_family(be, rng, shape):
    x = rng.standard_normal(shape) * 3
    gy = rng.standard_normal(shape)
    X, GY = be.asarray(x), be.asarray(gy)
    y = be.softmax(X)
    _close(be, y, ref.softmax(x))
    ly = be.log_softmax(X)
    _close(be, ly, ref.log_softmax(x))
    _close(be, be.softmax_backward(y, GY), ref.softmax_backward(ref.softmax(x), gy))
    _close(be, be.log_softmax_backward(ly, GY), ref.log_softmax_backward(ref.log_softmax(x), gy))


def test_softmax_float32_extreme_rows(be):
    x = np.array([[1000.0, 0.0, -1000.0], [-np.inf, 0.0, 1.0]], dtype=np.float32)
    got = be.to_numpy(be.softmax(be.asarray(x)))
    assert np.all(np.isfinite(got))
    assert ref.rel_err(got, ref.softmax(x)) < 1e-6


def test_causal_mask_fill(be, rng):
    x = rng.standard_normal((2, 4, 5))
    want = x.copy()
    want[:, np.triu_indices(4, 1, 5)[0], np.triu_indices(4, 1, 5)[1]] = -1e9
    _close(be, be.causal_mask_fill(be.asarray(x), -1e9), want)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_cross_entropy(be, rng, dtype, tol):
    n, c = 13, 40
    x = (rng.standard_normal((n, c)) * 2).astype(dtype)
    t = rng.integers(0, c, n)
    loss, probs = be.cross_entropy(be.asarray(x), be.asarray(t))
    assert loss.shape == () and loss.dtype == dtype
    want_loss, want_p = ref.cross_entropy(x, t)
    assert abs(float(be.to_numpy(loss)) - want_loss) <= tol * abs(want_loss)
    _close(be, probs, want_p, tol)
    _close(be, be.cross_entropy_backward(probs, be.asarray(t), 0.5),
           ref.cross_entropy_backward(want_p, t, 0.5), tol)
    g = be.asarray(np.array(0.25, dtype=dtype))  # a 0-d device scale: read on the device
    _close(be, be.cross_entropy_backward(probs, be.asarray(t), g),
           ref.cross_entropy_backward(want_p, t, 0.25), tol)


@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 40)])
def test_layernorm(be, rng, shape):
    c = shape[-1]
    x = rng.standard_normal(shape) * 2 + 1
    w, b = rng.standard_normal(c), rng.standard_normal(c)
    y, mean, rstd = be.layernorm(be.asarray(x), be.asarray(w), be.asarray(b), 1e-5)
    want_y, want_m, want_r = ref.layernorm(x, w, b, 1e-5)
    _close(be, y, want_y)
    _close(be, be.reshape(mean, want_m.shape), want_m)
    _close(be, be.reshape(rstd, want_r.shape), want_r)
    gy = rng.standard_normal(shape)
    gx, gw, gb = be.layernorm_backward(be.asarray(gy), be.asarray(x), be.asarray(w), mean, rstd)
    want = ref.layernorm_backward(gy, x, w, 1e-5)
    for got, exp in zip((gx, gw, gb), want):
        _close(be, got, exp, 1e-11)


def test_embedding_forward_backward_deterministic(be, rng):
    v, d = 11, 6
    table = rng.standard_normal((v, d))
    ids = rng.integers(0, v - 2, (3, 9))  # repeats, and rows 9, 10 never used
    ids[0, :4] = 3  # a heavy bucket
    out = be.embedding(be.asarray(table), be.asarray(ids))
    _close(be, out, table[ids])
    gy = rng.standard_normal((3, 9, d)).astype(np.float32)
    g1 = be.to_numpy(be.embedding_backward(be.asarray(gy), be.asarray(ids), v))
    g2 = be.to_numpy(be.embedding_backward(be.asarray(gy), be.asarray(ids), v))
    assert np.array_equal(g1, g2)  # bit-identical: no float atomics
    assert np.all(g1[9:] == 0)
    assert ref.rel_err(g1, ref.embedding_backward(gy, ids, v)) < 1e-6


@pytest.mark.parametrize("momentum,nesterov", [(0.0, False), (0.9, False), (0.9, True)])
def test_sgd_update(be, rng, momentum, nesterov):
    n = 300
    p, g, buf = rng.standard_normal(n), rng.standard_normal(n), rng.standard_normal(n)
    P, G, B = be.asarray(p), be.asarray(g), be.asarray(buf)
    be.sgd_update(P, G, B if momentum else None, 0.1, momentum, 0.01, nesterov)
    want_p, want_buf = ref.sgd(p, g, buf, 0.1, momentum, 0.01, nesterov)
    _close(be, P, want_p)
    if momentum:
        _close(be, B, want_buf)


def test_adamw_update(be, rng):
    n = 257
    p, g = rng.standard_normal(n), rng.standard_normal(n)
    m, v = rng.standard_normal(n) * 0.1, rng.random(n) * 0.1
    P, G, M, V = (be.asarray(a) for a in (p, g, m, v))
    be.adamw_update(P, G, M, V, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3)
    wp, wm, wv = ref.adamw(p, g, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3)
    _close(be, P, wp)
    _close(be, M, wm)
    _close(be, V, wv)
    with pytest.raises(ValueError, match="1"):
        be.adamw_update(P, G, M, V, 1e-3, 0.9, 0.95, 1e-8, 0.1, 0)


def test_matches_cpu_backend(be, rng):
    """Same inputs through both backends (float32): the primitives models use."""
    cpu_mod = pytest.importorskip("hpcdp.backend.cpu")
    cpu = cpu_mod.CPUBackend()
    x = rng.standard_normal((6, 10)).astype(np.float32)
    w, b = np.ones(10, np.float32), np.zeros(10, np.float32)
    t = rng.integers(0, 10, 6)
    pairs = [
        (cpu.gelu(x), be.gelu(be.asarray(x))),
        (cpu.log_softmax(x), be.log_softmax(be.asarray(x))),
        (cpu.cross_entropy(x, t)[0], be.cross_entropy(be.asarray(x), be.asarray(t))[0]),
        (cpu.layernorm(x, w, b, 1e-5)[0], be.layernorm(be.asarray(x), be.asarray(w), be.asarray(b), 1e-5)[0]),
        (cpu.matmul(x, x, trans_b=True), be.matmul(be.asarray(x), be.asarray(x), trans_b=True)),
        (cpu.embedding_backward(x, t, 12), be.embedding_backward(be.asarray(x), be.asarray(t), 12)),
    ]
    for want, got in pairs:
        assert ref.rel_err(be.to_numpy(got), want) < 1e-5
