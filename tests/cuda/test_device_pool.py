"""Device selection, the no-GPU error, and the caching allocator's policy."""

import subprocess
import sys

import pytest

from hpcdp.backend.cuda import pool


def test_cuda_without_gpu_is_a_clear_error():
    # a fresh interpreter without the simulator: on a GPU machine it constructs
    code = ("from hpcdp.backend import get_backend\n"
            "try:\n    get_backend('cuda'); print('OK')\n"
            "except RuntimeError as e:\n    print('ERR', e)\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120).stdout
    assert out.startswith("OK") or (
        "device='cuda' requested but no CUDA GPU is available" in out and "use device='cpu'" in out)


def test_select_device_round_robin(on_simulator):
    from hpcdp.backend.cuda import gpu_count, select_device
    n = gpu_count()
    assert select_device(0) == 0
    assert select_device(n) == 0  # local rank n shares GPU 0
    with pytest.raises(ValueError, match="local_rank"):
        select_device(-1)


def test_bin_sizes():
    assert pool.bin_size(1) == 512 and pool.bin_size(513) == 1024
    assert pool.bin_size(3 << 20) == 3 << 20
    big = (5 << 20) + 1
    assert big <= pool.bin_size(big) <= big * 1.125 + 1


def test_block_cache_reuses_freed_blocks():
    calls = []
    cache = pool.BlockCache(lambda n: calls.append(n) or len(calls), lambda p: calls.append(-p))
    p1, b1 = cache.acquire(1000)
    cache.release(p1, b1)
    p2, b2 = cache.acquire(900)  # same bin: a hit, no driver call
    assert (p2, b2) == (p1, b1) and calls == [1024]
    p3, _ = cache.acquire(100)  # other bin: a miss
    assert p3 == 2 and cache.stats()["hits"] == 1 and cache.stats()["misses"] == 2
    cache.release(p2, b2)
    cache.empty()
    assert calls[-1] == -1 and cache.stats()["cached_bytes"] == 0


def test_block_cache_oom_empties_and_retries():
    state = {"fail": True, "freed": []}

    def alloc(n):
        if state["fail"]:
            state["fail"] = False
            raise MemoryError("out of memory")
        return 7

    cache = pool.BlockCache(alloc, state["freed"].append)
    cache.release(3, 512)  # a cached block that can be given back
    assert cache.acquire(4096)[0] == 7 and state["freed"] == [3]


def test_training_step_does_not_allocate_on_gpu(be, on_simulator):
    """On a real GPU the second identical step is served from the cache."""
    if on_simulator:
        pytest.skip("the simulator's arrays are host arrays: no device allocator to observe")
    import numpy as np
    if be.pool_stats() is None:
        pytest.skip("caching allocator not installed (a CUDA context existed before hpcdp's)")

    def step():
        x = be.asarray(np.ones((64, 32), np.float32))
        y = be.gelu(be.matmul(x, x, trans_b=True))
        return be.to_numpy(be.sum(y))

    step()
    misses = be.pool_stats()["misses"]
    step()
    assert be.pool_stats()["misses"] == misses
