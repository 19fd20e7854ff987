"""A caching device allocator, so a training step does not call cudaMalloc.

``BlockCache`` is the policy, in plain Python (tested without a GPU): sizes are
rounded up to a bin (512 B granularity below 1 MiB, then 1/16 of the next power
of two), a freed block goes back to its bin's free list instead of to the driver,
and the next request of that bin reuses it. After the first step of training, the
same shapes are requested in the same order, so every request is a hit.

``CachingMemoryManager`` plugs the cache into numba's External Memory Management
interface: numba calls ``memalloc`` for every device array, and the finalizer of
the returned pointer (run when the array is garbage-collected) returns the block
to the cache. Reuse is safe because hpcdp launches all kernels of a step on one
stream: a kernel that reads a freed block is ordered before any later kernel
that writes it again. Cost: memory stays reserved by the process (``reset()``
releases it, and an out-of-memory error first empties the cache and retries).
"""

from __future__ import annotations

import itertools
import threading
import weakref

MIN_BIN = 512
SMALL_LIMIT = 1 << 20


def bin_size(nbytes: int) -> int:
    """Round a request up to its bin: multiples of 512 B below 1 MiB, above it
    steps of 1/16 of the next power of two (at most 12.5% waste)."""
    n = max(int(nbytes), 1)
    if n <= SMALL_LIMIT:
        return (n + MIN_BIN - 1) // MIN_BIN * MIN_BIN
    step = (1 << (n - 1).bit_length()) // 16  # <= n / 8
    return (n + step - 1) // step * step


class BlockCache:
    """Free lists of raw blocks keyed by bin size. ``raw_alloc(size)`` and
    ``raw_free(ptr)`` talk to the driver; everything else is bookkeeping."""

    def __init__(self, raw_alloc, raw_free):
        self._alloc = raw_alloc
        self._free = raw_free
        self._bins: dict[int, list] = {}
        self._lock = threading.Lock()  # finalizers may run from any thread
        self.hits = 0
        self.misses = 0
        self.reserved = 0  # bytes held from the driver (in use + cached)
        self.cached = 0  # bytes sitting in free lists

    def acquire(self, nbytes: int):
        """Return ``(ptr, bin)``: a cached block if one fits, else a new one."""
        size = bin_size(nbytes)
        with self._lock:
            free = self._bins.get(size)
            if free:
                self.hits += 1
                self.cached -= size
                return free.pop(), size
        try:
            ptr = self._alloc(size)
        except MemoryError:
            self.empty()
            ptr = self._alloc(size)
        with self._lock:
            self.misses += 1
            self.reserved += size
        return ptr, size

    def release(self, ptr, size: int) -> None:
        with self._lock:
            self._bins.setdefault(size, []).append(ptr)
            self.cached += size

    def empty(self) -> None:
        """Give every cached (unused) block back to the driver."""
        with self._lock:
            bins, self._bins = self._bins, {}
            freed = sum(size * len(ptrs) for size, ptrs in bins.items())
            self.reserved -= freed
            self.cached -= freed
        for ptrs in bins.values():
            for p in ptrs:
                self._free(p)

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses,
                "reserved_bytes": self.reserved, "cached_bytes": self.cached}


def make_memory_manager():
    """The EMM plugin class (built lazily: it needs the real CUDA driver)."""
    from numba.cuda.cudadrv import driver as drv

    class CachingMemoryManager(drv.GetIpcHandleMixin, drv.HostOnlyCUDAMemoryManager):
        cache: BlockCache | None = None  # class-level: shared with hpcdp for stats

        def initialize(self):
            def raw_alloc(size):
                try:
                    return drv.driver.cuMemAlloc(size)
                except drv.CudaAPIError as e:
                    if e.code == drv.binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
                        raise MemoryError(str(e)) from e
                    raise
            type(self).cache = BlockCache(raw_alloc, drv.driver.cuMemFree)

        def memalloc(self, size):
            cache = type(self).cache
            ptr, bin_ = cache.acquire(size)
            # self.allocations keeps the pointer object alive while arrays use it
            # (they hold only a weak proxy); its finalizer drops that entry and
            # hands the block back to the cache.
            key = next(_KEYS)
            finalizer = _returner(weakref.ref(cache), ptr, bin_, self.allocations, key)
            ctx = weakref.proxy(self.context)
            mem = drv.AutoFreePointer(ctx, ptr, size, finalizer=finalizer)
            self.allocations[key] = mem
            return mem.own()

        def get_memory_info(self):
            free, total = drv.driver.cuMemGetInfo()
            return drv.MemoryInfo(free=free, total=total)

        def reset(self):
            super().reset()
            if type(self).cache is not None:
                type(self).cache.empty()

        @property
        def interface_version(self):
            return 1

    return CachingMemoryManager


_KEYS = itertools.count(1)


def _returner(cache_ref, ptr, size, allocations, key):
    def give_back():
        allocations.pop(key, None)
        cache = cache_ref()
        if cache is not None:
            cache.release(ptr, size)
    return give_back
