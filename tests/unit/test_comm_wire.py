"""The 16-bit wire's conversions (hpcdp.comm.engines.wire) against NumPy: bfloat16 rounds to
nearest even (ties to the even word), keeps NaN quiet, overflows to inf, widens
exactly; float16 is NumPy's own cast."""

import numpy as np
import pytest

from hpcdp.comm.engines.wire import wire_format
from hpcdp.comm.select import wire_algorithm


def bf16_words(x):
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    top = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), ((b >> 16) | 0x40).astype(np.uint16), top)


def test_bfloat16_rounds_to_nearest_even_and_widens_exactly():
    w = wire_format("bfloat16", np.float32)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(20000) * np.exp(rng.uniform(-60, 60, 20000))).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.4e38, -3.4e38, 1e-45,
                        1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20], np.float32)
    x = np.concatenate([special, x])
    words = np.empty(x.size, w.dtype)
    w.narrow(x, words)
    assert np.array_equal(words, bf16_words(x))
    assert words[8:12].tolist() == [0x0000, 0x3F80, 0x3F82, 0x3F81]  # tie down, tie up, above
    assert words[6] == 0x7F80 and words[7] == 0xFF80                  # past the largest: inf
    back = np.empty(x.size, np.float32)
    w.widen(words, back)
    assert np.array_equal(back.view(np.uint32), words.astype(np.uint32) << 16)
    assert np.isnan(back[4]) and np.isnan(back[5])


def test_float16_is_numpys_cast_bit_for_bit():
    from hpcdp.comm.engines.wire_kernels import f16_narrow, f16_widen

    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)  # every binary16 word
    back = np.empty(every.size, np.uint32)
    f16_widen(every, back)
    h = every.view(np.float16)
    nan = np.isnan(h)
    assert np.array_equal(back[~nan], h[~nan].astype(np.float32).view(np.uint32))
    assert np.isnan(back.view(np.float32)[nan]).all()
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 1 << 32, 200000, dtype=np.uint64).astype(np.uint32)
    near = (rng.standard_normal(200000) * np.exp(rng.uniform(-20, 12, 200000))).astype(np.float32)
    ties = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 2 ** -25, 3 * 2 ** -25, 65520, 65519.99,
                     1.5 * 2 ** -24, 2 ** -14 * (1 - 2 ** -11)], np.float32)
    for x in (bits.view(np.float32), near, ties):
        x = x[~np.isnan(x) | ((x.view(np.uint32) & 0x400000) != 0)]  # quiet NaNs only
        got = np.empty(x.size, np.uint16)
        f16_narrow(x.view(np.uint32), got)
        with np.errstate(over="ignore", invalid="ignore"):
            assert np.array_equal(got, x.astype(np.float16).view(np.uint16))


def test_float16_wire_round_trip():
    w = wire_format("float16", np.float32)
    x = np.array([1.0, 65504.0, 70000.0, 1e-8, 0.1, -2.5], np.float32)
    words = np.empty(x.size, w.dtype)
    w.narrow(x, words)
    with np.errstate(over="ignore"):
        assert np.array_equal(words, x.astype(np.float16))
    y = x.copy()
    w.round_trip(y, words)
    assert y[2] == np.inf and y[4] == np.float32(np.float16(0.1))


def test_wire_names_and_algorithms():
    assert wire_format(None, np.float64) is None and wire_format("float32", np.int64) is None
    w = wire_format("bfloat16", np.float32)
    assert wire_algorithm(w, "auto") == "ring" and wire_algorithm(None, "native") == "native"
    with pytest.raises(ValueError, match="algorithm='hierarchical' cannot carry a bfloat16 wire"):
        wire_algorithm(w, "hierarchical", "allreduce")
    with pytest.raises(TypeError, match="carries float32 buffers"):
        wire_format("float16", np.float64)
