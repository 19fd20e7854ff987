"""Exact mode's integer fixed point: sums independent of order and partition,
equal to the correctly rounded sum where the grid holds every input, no overflow at
the bound, NaN for non-finite tensors; and the elementwise optimizers give the same
bits on a shard as on the whole buffer."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from hpcdp.data.micro import plan_micro_batches
from hpcdp.exact.fixed import FRACTION_BITS, NONFINITE, QUANTUM, Codec, exponents, headroom_bits


def layout(*sizes):
    out, off = [], 0
    for i, n in enumerate(sizes):
        out.append(SimpleNamespace(name=f"t{i}", offset=off, size=n))
        off += n
    return out, off


def grads(rng, m, n, dtype=np.float32):
    # magnitudes over ~2**-30 .. 2**4 in every tensor, both signs
    return [(rng.standard_normal(n) * np.exp2(rng.integers(-30, 4, size=n))).astype(dtype)
            for _ in range(m)]


def exact_sum(codec, gs, parts):
    """Sum gs in integers, cut into ``parts`` groups (ranks), groups summed last."""
    gmax = np.zeros(codec.n_tensors)
    for g in gs:
        codec.absmax_into(g, gmax)
    codec.set_exponents(exponents(gmax, len(gs)))
    total = np.zeros(len(gs[0]), dtype=np.int64)
    for p in parts:
        acc = np.zeros_like(total)
        for j in p:
            codec.encode_add(gs[j], acc)
        total += acc
    out = np.empty_like(gs[0])
    codec.decode(total, out)
    return out


def test_sum_is_independent_of_order_and_partition():
    rng = np.random.default_rng(0)
    lay, n = layout(7, 33, 1, 100)
    codec = Codec(lay)
    gs = grads(rng, 12, n)
    want = exact_sum(codec, gs, [range(12)])
    for parts in ([[11, 3, 5], [0, 1, 2, 4], [6, 7, 8, 9, 10]], [[j] for j in reversed(range(12))],
                  [list(range(6)), list(range(6, 12))]):
        np.testing.assert_array_equal(exact_sum(codec, gs, parts), want)
    # a float32 sum in another order does differ (what fast mode sees across N)
    a = np.sum(np.stack(gs), axis=0, dtype=np.float32)
    b = np.sum(np.stack(gs[::-1]), axis=0, dtype=np.float32)
    c = gs[0].copy()
    for g in gs[1:]:
        c += g
    assert not (np.array_equal(a, c) and np.array_equal(b, c))


def test_correctly_rounded_where_the_grid_holds_the_inputs():
    """Inputs within 2**-(31-c) of the tensor's max lie on the grid, so the integer sum
    is the exact sum, rounded once (math.fsum is exact, then rounded to float64)."""
    rng = np.random.default_rng(1)
    lay, n = layout(50)
    codec = Codec(lay)
    gs = [(rng.standard_normal(n) * np.exp2(rng.integers(-20, 2, size=n))).astype(np.float32)
          for _ in range(8)]
    got = exact_sum(codec, gs, [range(8)])
    want = np.array([math.fsum(float(g[i]) for g in gs) for i in range(n)]).astype(np.float32)
    np.testing.assert_array_equal(got, want)


def test_no_overflow_at_the_bound_and_exponent_rule():
    for m in (1, 2, 3, 4, 5, 64, 65, 1000):
        c = headroom_bits(m)
        assert 2 ** c >= m and (c == 0 or 2 ** (c - 1) < m)
        for mx in (1.0, 0.75, 3.0e-30, 6.0e4, 2.0 ** 17, 2.0 ** 16 * 0.999):
            e = int(exponents(np.array([mx]), m)[0])
            # below the bound, by at most the 8-bit band of the quantized exponent
            assert mx * 2.0 ** e < 2.0 ** (FRACTION_BITS - c) <= 2 ** QUANTUM * mx * 2.0 ** e
    lay, n = layout(4)
    codec = Codec(lay)
    worst = [np.full(n, np.float32(-3.5)) for _ in range(65)]  # every term at the max
    out = exact_sum(codec, worst, [range(65)])
    np.testing.assert_array_equal(out, np.float32(-3.5 * 65))


def test_float64_gradients_with_extreme_exponents():
    """Scales beyond float64's exponent range as one factor (e ~ 1060, e ~ -780)."""
    lay, n = layout(3, 3)
    codec = Codec(lay)
    for g in (np.array([1e-300, -2e-300, 3e-301, 4e-302, 0.0, -1e-299]),
              np.array([1e250, 0.0, -1e249, 3e248, 2e250, -5e249])):
        out = exact_sum(codec, [g, g, g], [[0], [1, 2]])
        np.testing.assert_allclose(out, 3 * g, rtol=1e-15)


def test_one_scale_for_the_whole_gradient():
    """Every finite tensor is converted at the scale of the largest element anywhere:
    a tensor 2**-40 below it keeps only its top bits, one 2**-70 below it is lost."""
    lay, n = layout(2, 2, 2)
    codec = Codec(lay)
    g = np.array([1.0, -0.5, 2.0 ** -40 * 1.75, 2.0 ** -41, 2.0 ** -70, 3.0 * 2.0 ** -71])
    out = exact_sum(codec, [g, g], [[0], [1]])
    np.testing.assert_array_equal(out[:4], 2 * g[:4])      # on the grid: exact
    np.testing.assert_array_equal(out[4:], 0.0)            # below the grid (2**-(62-1-8))
    assert len(set(codec.exps.tolist())) == 1


def test_nonfinite_tensor_sums_to_nan_zero_tensor_to_zero():
    lay, n = layout(3, 4, 2)
    codec = Codec(lay)
    g1 = np.ones(n, dtype=np.float32)
    g2 = np.ones(n, dtype=np.float32)
    g2[4] = np.inf
    g1[0] = np.nan
    g1[7:] = 0.0
    g2[7:] = 0.0
    out = exact_sum(codec, [g1, g2], [[0], [1]])
    assert np.isnan(out[:7]).all() and (out[7:] == 0).all()
    assert codec.nonfinite() == ["t0", "t1"] and codec.exps[0] == NONFINITE


def test_a_range_converts_like_the_same_elements_of_the_whole():
    """Buckets and shards: encode/decode of [lo, hi) equals the whole buffer's slice."""
    rng = np.random.default_rng(2)
    lay, n = layout(10, 17, 5, 31)
    codec = Codec(lay)
    gs = grads(rng, 3, n)
    gmax = np.zeros(codec.n_tensors)
    for g in gs:
        codec.absmax_into(g, gmax)
    part = np.zeros(codec.n_tensors)
    for g in gs:
        for lo, hi in ((0, 13), (13, 40), (40, n)):
            codec.absmax_into(g[lo:hi], part, lo=lo)
    np.testing.assert_array_equal(part, gmax)
    codec.set_exponents(exponents(gmax, 3))
    whole = np.zeros(n, dtype=np.int64)
    for g in gs:
        codec.encode_add(g, whole)
    for lo, hi in ((0, 1), (1, 29), (29, 60), (60, n)):
        acc = np.zeros(hi - lo, dtype=np.int64)
        for g in gs:
            codec.encode_add(g[lo:hi], acc, lo=lo)
        np.testing.assert_array_equal(acc, whole[lo:hi])
        out = np.empty(hi - lo, dtype=np.float32)
        codec.decode(acc, out, lo=lo)
        ref = np.empty(n, dtype=np.float32)
        codec.decode(whole, ref)
        np.testing.assert_array_equal(out, ref[lo:hi])


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_optimizer_on_shards_gives_the_bits_of_the_whole(kind, dtype):
    """Elementwise updates: a shard at any offset (other SIMD alignment, other tail
    length) computes each element exactly as the whole buffer does."""
    from hpcdp.optim import SGD, AdamW

    def make(size):
        if kind == "adamw":
            return AdamW(size, lr=1e-3, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, dtype=dtype)
        return SGD(size, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True, dtype=dtype)

    rng = np.random.default_rng(3)
    n = 1031
    p0 = rng.standard_normal(n).astype(dtype)
    gs = [rng.standard_normal(n).astype(dtype) for _ in range(3)]
    whole, opt = p0.copy(), make(n)
    for g in gs:
        opt.step(whole, g)
    for cuts in ([0, 1, 2, 3, 5, 8, 13, 21, 34, 100, 517, n], [0, 7, 999, 1030, n]):
        parts = p0.copy()
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            o = make(hi - lo)
            buf = parts[lo:hi].copy()      # a shard in its own (differently aligned) buffer
            for g in gs:
                o.step(buf, g[lo:hi].copy())
            parts[lo:hi] = buf
        np.testing.assert_array_equal(parts, whole)


def test_micro_batch_plan():
    g = np.arange(100, 112)
    for n in (1, 2, 3, 4, 5, 7):
        got, total = [], None
        passes = set()
        for r in range(n):
            mine, total = plan_micro_batches(g, 3, n, r)
            passes.add(len(mine))
            got += [list(x) for x in mine if len(x)]
        assert total == 4 and len(passes) == 1  # every rank the same number of passes
        assert got == [list(g[i:i + 3]) for i in range(0, 12, 3)]  # whole micro-batches, in order
    mine, total = plan_micro_batches(g[:10], 4, 2, 1)  # a short last batch: 4, 4 | 2
    assert total == 3 and [len(x) for x in mine] == [0, 2]  # fillers first
