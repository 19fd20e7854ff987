"""tests/cuda: the numba.cuda kernels against float64 references.

They run unchanged on a real GPU and under numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``, how CI runs them on machines without a GPU). Sizes
are small (simulated threads are Python threads) but always include partial
tiles. Without a GPU and without the simulator the directory is skipped with the
reason; CI sets the variable.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from numba import cuda  # noqa: F401  (import before hpcdp.backend.cuda, simulator needs it)

from hpcdp.backend.cuda import CUDABackend, simulated


def _usable() -> str | None:
    try:
        CUDABackend()
    except RuntimeError as e:
        return str(e)
    return None


_REASON = _usable()


def pytest_collection_modifyitems(config, items):
    if _REASON is None:
        return
    skip = pytest.mark.skip(reason=f"{_REASON} (CI runs tests/cuda with NUMBA_ENABLE_CUDASIM=1)")
    for item in items:
        if "tests/cuda" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def be():
    return CUDABackend(poison=True)


@pytest.fixture
def rng(request):
    # fresh inputs per test, reproducible from the test's name
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


@pytest.fixture(scope="session")
def on_simulator():
    return simulated()
