"""Optimizers against a straightforward NumPy reference (PyTorch semantics), float64."""

import math

import numpy as np
import pytest

from hpcdp.config import OptimConfig
from hpcdp.optim import SGD, AdamW, build_optimizer, lr_at


def ref_sgd(p, grads, lr, momentum, wd, nesterov):
    p = p.copy()
    buf = np.zeros_like(p)
    for g in grads:
        d = g + wd * p
        if momentum:
            buf = momentum * buf + d
            d = d + momentum * buf if nesterov else buf
        p = p - lr * d
    return p


def ref_adamw(p, grads, lr, b1, b2, eps, wd):
    p = p.copy()
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        mhat = m / (1 - b1 ** t)
        vhat = v / (1 - b2 ** t)
        p = p - lr * mhat / (np.sqrt(vhat) + eps)
    return p


def _problem(n=37, steps=6, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=n), [rng.normal(size=n) for _ in range(steps)]


@pytest.mark.parametrize("momentum, nesterov, wd", [
    (0.0, False, 0.0), (0.0, False, 0.01), (0.9, False, 0.0), (0.9, False, 0.05), (0.9, True, 0.05),
])
def test_sgd_matches_reference(momentum, nesterov, wd):
    p0, grads = _problem()
    opt = SGD(len(p0), lr=0.1, momentum=momentum, weight_decay=wd, nesterov=nesterov, dtype="float64")
    p = p0.copy()
    for g in grads:
        opt.step(p, g)
    np.testing.assert_allclose(p, ref_sgd(p0, grads, 0.1, momentum, wd, nesterov), rtol=1e-12, atol=1e-12)
    assert set(opt.state_arrays()) == ({"momentum_buf"} if momentum else set())


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adamw_matches_reference(wd):
    p0, grads = _problem(seed=1)
    opt = AdamW(len(p0), lr=0.01, betas=(0.9, 0.99), eps=1e-8, weight_decay=wd, dtype="float64")
    p = p0.copy()
    for g in grads:
        opt.step(p, g)
    np.testing.assert_allclose(p, ref_adamw(p0, grads, 0.01, 0.9, 0.99, 1e-8, wd), rtol=1e-12, atol=1e-12)
    assert set(opt.state_arrays()) == {"m", "v"} and opt.steps == len(grads)


def test_lr_attribute_change_takes_effect_between_steps():
    p0, grads = _problem(steps=2)
    opt = SGD(len(p0), lr=0.1, dtype="float64")
    p = p0.copy()
    opt.step(p, grads[0])
    opt.lr = 0.01
    opt.step(p, grads[1])
    np.testing.assert_allclose(p, p0 - 0.1 * grads[0] - 0.01 * grads[1], rtol=1e-12)


def test_state_sized_on_first_step_so_a_shard_can_be_given():
    p0, grads = _problem(n=40)
    shard = slice(10, 23)
    opt = build_optimizer(OptimConfig(kind="adamw", lr=0.01), dtype="float64")
    assert opt.state_arrays() == {}
    p = p0.copy()
    for g in grads:
        opt.step(p[shard], g[shard])  # views: updated in place
    assert opt.state_arrays()["m"].shape == (13,)
    expect = p0.copy()
    expect[shard] = ref_adamw(p0[shard], [g[shard] for g in grads], 0.01, 0.9, 0.999, 1e-8, 0.0)
    np.testing.assert_allclose(p, expect, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="state holds 13 elements, got an array of 40"):
        opt.step(p, grads[0])


def test_float32_state_keeps_its_dtype():
    opt = SGD(8, lr=0.1, momentum=0.9, dtype="float32")
    p, g = np.ones(8, np.float32), np.ones(8, np.float32)
    opt.step(p, g)
    assert opt.state_arrays()["momentum_buf"].dtype == np.float32 and p.dtype == np.float32
    np.testing.assert_allclose(p, 0.9)


def test_lr_schedule_warmup_then_cosine():
    cfg = OptimConfig(lr=1.0, schedule="cosine", warmup_steps=4, min_lr=0.1)
    lrs = [lr_at(cfg, s, 14) for s in range(1, 15)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))  # monotone decay
    mid = lrs[4 + 4]  # halfway through the 9 decay steps (index 4..13)
    assert mid == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * 4 / 9)))
    const = OptimConfig(lr=0.3, warmup_steps=0)
    assert [lr_at(const, s, 10) for s in (1, 5, 10)] == [0.3, 0.3, 0.3]
