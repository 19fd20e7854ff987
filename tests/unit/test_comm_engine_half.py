"""The compiled engine's float16 arithmetic (it works on the bits: Numba has no half
type on the CPU) equals NumPy's half loops bit for bit: add, maximum, minimum on
random pairs of every finite half (inf, -0, subnormals included), a NaN operand,
and mean's division by N on all 65536 halves."""

import numpy as np
import pytest

from hpcdp.comm.engines.compiled import kernels as K

ALL = np.arange(1 << 16, dtype=np.uint16)
FINITE = ALL[(ALL & 0x7FFF) <= 0x7C00]  # every half but the NaNs


@pytest.mark.parametrize("op,fn", [(K.OP_SUM, np.add), (K.OP_MAX, np.maximum),
                                   (K.OP_MIN, np.minimum)], ids=["sum", "max", "min"])
def test_binary_ops_match_numpy(op, fn):
    rng = np.random.default_rng(op)
    for _ in range(3):
        a, b = rng.permutation(FINITE), rng.permutation(FINITE)
        out = np.empty_like(a)
        K._reduce_half(op, out, a, b)
        with np.errstate(all="ignore"):
            ref = fn(a.view(np.float16), b.view(np.float16)).view(np.uint16)
        assert np.array_equal(out, ref)
    nan = np.full(512, 0x7E12, np.uint16)
    for x, y in ((FINITE[:512], nan), (nan, FINITE[:512])):
        out = np.empty_like(x)
        K._reduce_half(op, out, x, y)
        assert np.array_equal(out, fn(x.view(np.float16), y.view(np.float16)).view(np.uint16))


@pytest.mark.parametrize("N", [2, 3, 5, 7])
def test_mean_division_matches_numpy(N):
    out = ALL.copy()
    K._finalize_half(out, 0, out.size, N)
    with np.errstate(all="ignore"):
        ref = np.true_divide(ALL.view(np.float16), np.float16(N)).view(np.uint16)
    assert np.array_equal(out, ref)
