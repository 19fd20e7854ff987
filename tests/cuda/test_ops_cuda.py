"""Elementwise, broadcast, reduction and layout primitives of the cuda backend
against NumPy float64 (outputs are NaN-poisoned at allocation, so an element a
kernel does not write fails the comparison)."""

import numpy as np
import pytest

from kernels import reference as ref


def _close(be, got, want, tol=1e-12):
    got = be.to_numpy(got)
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    assert ref.rel_err(got, want) < tol


@pytest.mark.parametrize("sa,sb", [((4, 5), (4, 5)), ((2, 3, 5), (5,)), ((3, 1), (1, 4)),
                                   ((1, 5), (3, 4, 5)), ((2, 1, 3), (4, 1)), ((), (3, 2))])
def test_binary_broadcast(be, rng, sa, sb):
    a, b = rng.standard_normal(sa), rng.standard_normal(sb) + 3.0
    A, B = be.asarray(a), be.asarray(b)
    _close(be, be.add(A, B), a + b)
    _close(be, be.sub(A, B), a - b)
    _close(be, be.mul(A, B), a * b)
    _close(be, be.div(A, B), a / b)


def test_scalar_operands_keep_array_dtype(be, rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    A = be.asarray(a)
    for got, want in [(be.add(A, 2.0), a + 2), (be.sub(1.5, A), 1.5 - a), (be.mul(3, A), 3 * a),
                      (be.div(A, 4.0), a / 4), (be.div(2.0, A), 2 / a)]:
        assert got.dtype == np.float32
        _close(be, got, want.astype(np.float64), 1e-6)


def test_equal_and_shape_errors(be):
    a = np.array([[1.0, 2.0, 3.0]])
    got = be.equal(be.asarray(a), be.asarray(np.array([[1.0], [3.0]])))
    _close(be, got, np.array([[1.0, 0, 0], [0, 0, 1.0]]))
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4,\)"):
        be.add(be.zeros((2, 3), np.float64), be.zeros((4,), np.float64))


def test_unary_and_activations(be, rng):
    x = rng.standard_normal((7, 33))
    X = be.asarray(x)
    _close(be, be.neg(X), -x)
    _close(be, be.exp(X), np.exp(x))
    _close(be, be.log(be.asarray(np.abs(x) + 0.1)), np.log(np.abs(x) + 0.1))
    _close(be, be.sqrt(be.asarray(np.abs(x))), np.sqrt(np.abs(x)))
    _close(be, be.tanh(X), np.tanh(x))
    _close(be, be.relu(X), np.maximum(x, 0))
    _close(be, be.gelu(X), ref.gelu(x))
    gy = rng.standard_normal(x.shape)
    _close(be, be.relu_backward(X, be.asarray(gy)), gy * (x > 0))
    _close(be, be.gelu_backward(X, be.asarray(gy)), ref.gelu_backward(x, gy))


def test_float32_gelu(be, rng):
    x = rng.standard_normal(100).astype(np.float32)
    out = be.gelu(be.asarray(x))
    assert out.dtype == np.float32
    _close(be, out, ref.gelu(x), 1e-6)


@pytest.mark.parametrize("shape,axis,keep", [((5, 40), -1, False), ((5, 40), 0, True),
                                             ((3, 4, 5), (0, 2), False), ((3, 4, 5), 1, True),
                                             ((6, 7), None, False), ((2, 3, 4), (1, 2), True)])
def test_sum_max(be, rng, shape, axis, keep):
    x = rng.standard_normal(shape)
    X = be.asarray(x)
    _close(be, be.sum(X, axis, keep), np.sum(x, axis=axis, keepdims=keep))
    _close(be, be.max(X, axis, keep), np.max(x, axis=axis, keepdims=keep))


def test_full_sum_two_pass(be, rng, monkeypatch):
    from hpcdp.backend.cuda import reduce as red
    # shrink the two-pass threshold so the simulator runs it at a small size
    monkeypatch.setattr(red, "TWO_PASS_MIN", 1000)
    monkeypatch.setattr(red, "PARTIAL_BLOCKS", 3)
    x = rng.standard_normal(1500)  # partial sums per block, then one block
    _close(be, be.sum(be.asarray(x)), x.sum(), 1e-12)
    _close(be, be.max(be.asarray(x)), x.max())


def test_sum_to_shape_and_broadcast_to(be, rng):
    x = rng.standard_normal((2, 3, 4))
    X = be.asarray(x)
    _close(be, be.sum_to_shape(X, (3, 1)), x.sum(axis=(0, 2)).reshape(3, 1))
    _close(be, be.sum_to_shape(X, (4,)), x.sum(axis=(0, 1)))
    b = rng.standard_normal((3, 1))
    _close(be, be.broadcast_to(be.asarray(b), (2, 3, 4)), np.broadcast_to(b, (2, 3, 4)))


def test_layout_ops(be, rng):
    x = rng.standard_normal((3, 4, 5))
    X = be.asarray(x)
    _close(be, be.transpose(X, (2, 0, 1)), np.transpose(x, (2, 0, 1)))
    _close(be, be.reshape(X, (12, -1)), x.reshape(12, 5))
    for index in [(1,), (slice(None), 2), (Ellipsis, slice(1, 4)), (slice(None, None, -1), 0, slice(0, 5, 2)),
                  (slice(1, 3), None, 3)]:
        _close(be, be.getitem(X, index), x[index])
    y = rng.standard_normal((3, 2, 5))
    _close(be, be.concatenate([X, be.asarray(y)], 1), np.concatenate([x, y], 1))


def test_setitem_add_and_in_place(be, rng):
    d = rng.standard_normal((4, 6))
    D = be.asarray(d.copy())
    s = rng.standard_normal((2, 3))
    be.setitem_add(D, (slice(1, 3), slice(0, 6, 2)), be.asarray(s))
    want = d.copy()
    want[1:3, 0:6:2] += s
    _close(be, D, want)
    row = rng.standard_normal(6)
    be.add_(D, be.asarray(row))  # broadcast accumulate
    _close(be, D, want + row)
    be.fill_(D, 0.5)
    _close(be, D, np.full((4, 6), 0.5))


def test_flat_view_aliases(be):
    flat = be.zeros((10,), np.float32)
    v = be.flat_view(flat, 4, (2, 3))
    be.fill_(v, 2.0)
    assert be.to_numpy(flat).tolist() == [0] * 4 + [2] * 6
    with pytest.raises(ValueError, match="outside buffer"):
        be.flat_view(flat, 6, (2, 3))


def test_copy_and_asarray(be, rng):
    x = rng.standard_normal((3, 2))
    D = be.zeros((3, 2), np.float64)
    be.copy_(D, x)  # host -> device
    _close(be, D, x)
    E = be.empty((3, 2), np.float64)
    be.copy_(E, D)  # device -> device
    _close(be, E, x)
    f = be.asarray(D, np.float32)
    assert f.dtype == np.float32
    with pytest.raises(ValueError, match="shapes differ"):
        be.copy_(E, be.zeros((2, 3), np.float64))


def test_dropout_mask_deterministic_and_equal_to_the_cpu_backend(be):
    """The CUDA kernel and the CPU njit kernel compile the same Philox source: the
    same key gives the same mask bit for bit (odd row length: partial groups)."""
    from hpcdp.backend import get_backend

    key = dict(seed=2**40 + 5, step=3, layer=2, samples=np.array([7, 0, 2**31 + 9]))
    m1 = be.to_numpy(be.dropout_mask((3, 5, 7), 0.25, **key))
    m2 = be.to_numpy(be.dropout_mask((3, 5, 7), 0.25, **key))
    m3 = be.to_numpy(be.dropout_mask((3, 5, 7), 0.25, **{**key, "step": 4}))
    assert m1.dtype == np.float32
    assert np.array_equal(m1, m2) and not np.array_equal(m1, m3)
    assert set(np.unique(m1)) <= {0.0, np.float32(1 / 0.75)}
    assert np.array_equal(m1, get_backend("cpu").dropout_mask((3, 5, 7), 0.25, **key))
    assert 0.1 < (m1 == 0).mean() < 0.4
