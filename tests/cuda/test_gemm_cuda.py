"""Tiled GEMM against float64 matmul: partial tiles in M, N and K, transposed
operands, broadcast batch dims, both tile configurations."""

import numpy as np
import pytest

from hpcdp.backend.cuda import gemm
from kernels import reference as ref

F32_TOL = 2e-6 * 8  # float32 accumulation over K <= 70


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_transposes_partial_tiles(be, rng, ta, tb):
    m, k, n = 37, 45, 29  # no dimension a multiple of any tile size
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    out = be.to_numpy(be.matmul(be.asarray(a), be.asarray(b), trans_a=ta, trans_b=tb))
    assert out.shape == (m, n) and out.dtype == np.float32
    assert ref.rel_err(out, ref.matmul(a, b, ta, tb)) < F32_TOL


@pytest.mark.parametrize("config", ["16x16", "64x64", "128x128"])
def test_gemm_configs_multi_tile(be, rng, config):
    """Both register-blocking configurations, more than one tile in M and N
    (64x64) and a K spanning several BK slices with a ragged end."""
    m, k, n = {"16x16": (35, 20, 18), "64x64": (70, 21, 66), "128x128": (40, 19, 33)}[config]
    a = rng.standard_normal((m, k))
    b = rng.standard_normal((k, n))
    A, B = be.asarray(a), be.asarray(b)
    C = be.empty((m, n), np.float64)
    be.fill_(C, np.nan)
    gemm.launch(A.reshape(m * k), B.reshape(k * n), C.reshape(m * n), m, n, k, False, False, (0, 0, 0), (0, 0, 0),
                (1, 1, 1), config=gemm.CONFIGS[config])
    assert ref.rel_err(be.to_numpy(C), a @ b) < 1e-13


def test_matmul_batched_broadcast(be, rng):
    a = rng.standard_normal((2, 3, 5, 7))
    b = rng.standard_normal((3, 9, 7))  # broadcast over the leading batch dim, transposed
    out = be.to_numpy(be.matmul(be.asarray(a), be.asarray(b), trans_b=True))
    assert out.shape == (2, 3, 5, 9)
    assert ref.rel_err(out, ref.matmul(a, b, False, True)) < 1e-13


def test_matmul_folds_batch_into_m(be, rng):
    x = rng.standard_normal((2, 5, 6)).astype(np.float32)  # (B, T, C) @ (C, N)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    out = be.to_numpy(be.matmul(be.asarray(x), be.asarray(w)))
    assert ref.rel_err(out, x.astype(np.float64) @ w) < F32_TOL


def test_matmul_shape_errors_name_both_shapes(be):
    a, b = be.zeros((3, 4), np.float32), be.zeros((5, 2), np.float32)
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(5, 2\)"):
        be.matmul(a, b)
    with pytest.raises(ValueError, match="dtypes differ"):
        be.matmul(a, be.zeros((4, 2), np.float64))
