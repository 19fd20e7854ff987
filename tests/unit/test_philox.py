"""The keyed random streams: Philox4x32-10 against its published known answers and
an independent Python-int implementation; dropout masks keyed by (seed, step,
sample, layer) and by nothing else."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from hpcdp.backend import get_backend
from hpcdp.backend.philox import philox4x32_10, threshold

# Random123's known-answer vectors (counter words, key words, outputs).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]

be = get_backend("cpu")


def philox_ints(ctr, key):
    """Philox4x32-10 in plain Python ints (written from the paper, not from hpcdp)."""
    c, (k0, k1) = list(ctr), key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k1, p0 & 0xFFFFFFFF]
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return tuple(c)


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_known_answers_in_python_and_njit(ctr, key, want):
    u = [np.uint64(v) for v in (*ctr, *key)]
    assert tuple(int(v) for v in philox4x32_10(*u)) == want
    assert tuple(int(v) for v in njit(philox4x32_10)(*u)) == want
    assert philox_ints(ctr, key) == want


def mask_ints(shape, p, seed, step, layer, samples):
    """The mask rule of hpcdp/backend/philox.py, from philox_ints."""
    b, per = shape[0], int(np.prod(shape[1:]))
    thr = threshold(p)
    out = np.empty((b, per), dtype=np.float32)
    key = (seed & 0xFFFFFFFF, seed >> 32)
    for i, s in enumerate(samples):
        for j in range(per):
            word = philox_ints((j // 4, int(s), step, layer), key)[j % 4]
            out[i, j] = np.float32(1.0 / (1.0 - p)) if word >= thr else 0.0
    return out.reshape(shape)


def test_cpu_mask_equals_the_rule_written_out():
    key = dict(seed=(3 << 33) + 11, step=17, layer=5, samples=np.array([4, 2**32 - 1, 0]))
    got = be.dropout_mask((3, 2, 5), 0.3, **key)
    np.testing.assert_array_equal(got, mask_ints((3, 2, 5), 0.3, **key))


def test_a_sample_draws_its_own_mask_wherever_it_sits():
    """Masks depend on the sample's global index, not its position or its batch
    (N ranks holding different samples draw what one rank draws for them)."""
    key = dict(seed=1, step=4, layer=2)
    whole = be.dropout_mask((6, 33), 0.5, samples=np.arange(10, 16), **key)
    part = be.dropout_mask((2, 33), 0.5, samples=np.array([15, 12]), **key)
    np.testing.assert_array_equal(part, whole[[5, 2]])
    rows = {whole[i].tobytes() for i in range(6)}
    assert len(rows) == 6  # every sample its own pattern (2**-33 chance of a tie)


@pytest.mark.parametrize("field", ["seed", "step", "layer"])
def test_each_key_field_changes_the_mask(field):
    key = dict(seed=1, step=4, layer=2, samples=np.arange(8))
    base = be.dropout_mask((8, 64), 0.5, **key)
    key[field] += 1
    other = be.dropout_mask((8, 64), 0.5, **key)
    assert 0.35 < (base != other).mean() < 0.65  # independent draws differ in ~half


def test_drop_rate_and_scale():
    m = be.dropout_mask((64, 1000), 0.1, seed=0, step=0, layer=1, samples=np.arange(64))
    assert abs((m == 0).mean() - 0.1) < 0.005
    assert set(np.unique(m)) == {0.0, np.float32(1 / 0.9)}


def test_bad_keys_are_clear_errors():
    ok = dict(seed=0, step=0, layer=1)
    with pytest.raises(ValueError, match="3 sample indices for a batch of 2"):
        be.dropout_mask((2, 4), 0.5, samples=np.arange(3), **ok)
    with pytest.raises(ValueError, match="sample indices must be in"):
        be.dropout_mask((1, 4), 0.5, samples=np.array([-1]), **ok)
    with pytest.raises(ValueError, match="step must be in"):
        be.dropout_mask((1, 4), 0.5, seed=0, step=2**32, layer=1, samples=np.arange(1))
