"""Every op and layer against central finite differences in float64."""

import numpy as np
import pytest

from hpcdp.autograd import Tensor, functional as F, ops
from hpcdp.autograd.gradcheck import gradcheck
from hpcdp.nn import GPT, MLP

TOL = 1e-7  # relative error; typical values are ~1e-9 or below


def leaf(*shape, seed=0, low=None):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if low is not None:  # keep away from kinks/poles (relu at 0, log at 0)
        a = np.abs(a) + low
    return Tensor(a, requires_grad=True)


@pytest.mark.parametrize("op", [ops.add, ops.sub, ops.mul, ops.div])
@pytest.mark.parametrize("sa,sb", [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)),
                                   ((1,), (2, 3))])
def test_binary_broadcasting(op, sa, sb):
    a = leaf(*sa, seed=1)
    b = leaf(*sb, seed=2, low=0.5)  # positive: division well conditioned
    assert gradcheck(lambda: op(a, b), [a, b]) < TOL


def test_scalar_operators_both_sides():
    x = leaf(3, 4, low=0.5)
    fns = [lambda: x + 2.0, lambda: 2.0 + x, lambda: x - 1.5, lambda: 1.5 - x,
           lambda: x * 3.0, lambda: 3.0 * x, lambda: x / 4.0, lambda: 4.0 / x, lambda: -x]
    for fn in fns:
        assert gradcheck(fn, [x]) < TOL


@pytest.mark.parametrize("sa,sb,ta,tb", [
    ((3, 4), (4, 5), False, False),
    ((4, 3), (4, 5), True, False),
    ((3, 4), (5, 4), False, True),
    ((4, 3), (5, 4), True, True),
    ((2, 3, 4), (2, 4, 5), False, False),   # batched
    ((2, 3, 4), (4, 5), False, False),      # shared 2-D weight
    ((2, 3, 4), (5, 4), False, True),       # shared weight, transposed (tied head)
    ((2, 1, 3, 4), (5, 4, 2), False, False),  # broadcast batch dims
    ((2, 4, 3), (2, 5, 4), True, True),
])
def test_matmul(sa, sb, ta, tb):
    a, b = leaf(*sa, seed=3), leaf(*sb, seed=4)
    assert gradcheck(lambda: ops.matmul(a, b, ta, tb), [a, b]) < TOL


@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True),
                                           ((0, 2), False), (-1, True)])
def test_reductions(axis, keepdims):
    x = leaf(2, 3, 4, seed=5)
    for op in (ops.sum, ops.mean, ops.max):
        assert gradcheck(lambda: op(x, axis, keepdims), [x]) < TOL


def test_max_splits_ties_evenly():
    x = Tensor(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]]), requires_grad=True)
    ops.max(x, axis=1).sum().backward()
    np.testing.assert_array_equal(x.grad, [[0, 0.5, 0.5], [1, 0, 0]])


def test_shape_ops():
    x = leaf(2, 3, 4, seed=6)
    y = leaf(2, 2, 4, seed=7)
    cases = [lambda: x.reshape(6, 4), lambda: x.reshape(-1), lambda: x.transpose(2, 0, 1),
             lambda: x.transpose(), lambda: x[1], lambda: x[:, 1:3, ::2], lambda: x[..., -1],
             lambda: ops.concatenate([x, y], axis=1), lambda: ops.concatenate([x, x], axis=-1)]
    for fn in cases:
        assert gradcheck(fn, [x, y]) < TOL


def test_unary_math():
    x = leaf(3, 5, seed=8)
    p = leaf(3, 5, seed=9, low=0.2)
    for fn in (lambda: ops.exp(x), lambda: ops.tanh(x), lambda: ops.relu(p - 0.1 * (x * 0 + 1)),
               lambda: ops.gelu(x), lambda: ops.log(p), lambda: ops.sqrt(p)):
        assert gradcheck(fn, [x, p]) < TOL


def test_relu_away_from_zero():
    x = Tensor(np.array([[-2.0, -0.5, 0.3, 1.7]]), requires_grad=True)
    assert gradcheck(lambda: ops.relu(x), [x]) < TOL


def test_softmax_and_log_softmax():
    x = leaf(2, 3, 7, seed=10)
    assert gradcheck(lambda: ops.softmax(x), [x]) < TOL
    assert gradcheck(lambda: ops.log_softmax(x), [x]) < TOL


@pytest.mark.parametrize("shape", [(6, 5), (2, 3, 5)])
def test_cross_entropy(shape):
    x = leaf(*shape, seed=11)
    t = np.random.default_rng(0).integers(0, shape[-1], size=shape[:-1])
    assert gradcheck(lambda: F.cross_entropy(x, t), [x]) < TOL


def test_cross_entropy_extreme_logits_stay_finite_and_correct():
    x = Tensor(np.array([[1000.0, 0.0, -1000.0]]), requires_grad=True)
    loss = F.cross_entropy(x, np.array([2]))
    assert loss.item() == pytest.approx(2000.0)
    loss.backward()
    np.testing.assert_allclose(x.grad, [[1.0, 0.0, -1.0]], atol=1e-12)


def test_layer_norm():
    x = leaf(2, 3, 6, seed=12)
    w, b = leaf(6, seed=13), leaf(6, seed=14)
    assert gradcheck(lambda: F.layer_norm(x, w, b), [x, w, b]) < TOL


def test_embedding_repeated_ids():
    table = leaf(5, 3, seed=15)
    ids = np.array([[0, 2, 2], [4, 2, 0]])
    assert gradcheck(lambda: F.embedding(table, ids), [table]) < TOL


def test_dropout_fixed_mask():
    x = leaf(4, 6, seed=16)
    key = {"seed": 5, "step": 0, "layer": 1, "samples": np.arange(4)}
    assert gradcheck(lambda: F.dropout(x, 0.3, key), [x]) < TOL


@pytest.mark.parametrize("activation", [None, "relu", "gelu", "tanh"])
def test_fused_linear(activation):
    x, w, b = leaf(2, 3, 4, seed=17), leaf(4, 5, seed=18), leaf(5, seed=19)
    assert gradcheck(lambda: F.linear(x, w, b, activation), [x, w, b]) < TOL
    x2 = leaf(3, 4, seed=20)
    assert gradcheck(lambda: F.linear(x2, w, None, activation), [x2, w]) < TOL


def test_causal_mask_and_attention():
    q, k, v = leaf(2, 2, 4, 3, seed=21), leaf(2, 2, 4, 3, seed=22), leaf(2, 2, 4, 3, seed=23)
    assert gradcheck(lambda: F.causal_self_attention(q, k, v), [q, k, v]) < TOL
    s = leaf(2, 4, 4, seed=24)
    assert gradcheck(lambda: ops.softmax(F.causal_mask_fill(s)), [s]) < TOL


def test_attention_from_qkv_projection():
    # the fused op from (B, T, 3C) to merged heads (B, T, C), and that it is the split
    # heads' attention
    qkv = leaf(2, 4, 12, seed=25)
    assert gradcheck(lambda: F.causal_self_attention_qkv(qkv, 2), [qkv]) < TOL
    heads = ops.transpose(ops.reshape(qkv, (2, 4, 3, 2, 2)), (2, 0, 3, 1, 4))
    y = F.causal_self_attention(heads[0], heads[1], heads[2])
    y = ops.reshape(ops.transpose(y, (0, 2, 1, 3)), (2, 4, 4))
    np.testing.assert_allclose(F.causal_self_attention_qkv(qkv, 2).data, y.data, rtol=1e-13)


def test_whole_mlp():
    m = MLP([6, 8, 7, 3], "relu", seed=0, dtype="float64")
    x = np.random.default_rng(1).standard_normal((5, 6))
    y = np.array([0, 1, 2, 1, 0])
    ps = list(m.flat.params.values())
    assert gradcheck(lambda: m.loss(x, y), ps) < TOL


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_gpt(tied):
    m = GPT(11, 5, 2, 2, 8, tied_head=tied, dropout=0.0, seed=0, dtype="float64")
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 11, size=(2, 5))
    ids[0, :3] = 4  # repeated tokens: embedding accumulation
    tgt = rng.integers(0, 11, size=(2, 5))
    # GPT-2 init gives some gradients of ~1e-5, where finite-difference rounding
    # (1e-16 * loss / eps) dominates: check at random O(1) weights instead, with
    # eps = 1e-5 (rounding and O(eps^2) truncation both ~1e-10 here).
    m.flat.data[:] = rng.normal(0.0, 0.5, size=m.flat.numel)
    ps = list(m.flat.params.values())
    assert gradcheck(lambda: m.loss(ids, tgt), ps, eps=1e-5, max_checks=12) < TOL
