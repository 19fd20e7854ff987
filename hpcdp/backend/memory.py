"""The memory seam: tagged allocations, counted while they are alive.

Model state is allocated through ``backend.alloc(shape, dtype, tag, zero=False)``
with one of :data:`TAGS`:

- ``"params"``, ``"grads"``, ``"optim"``: the persistent model state (full buffers
  or this rank's shards);
- ``"working"``: transient buffers a strategy allocates during a step (gathered
  units, unit gradient buffers).

Activations and kernel temporaries are not tagged (they are not model state). The
:class:`MemoryTracker` of the backend counts each tagged allocation from ``alloc``
until the array is freed: there is no separate free call, *releasing* an allocation
means dropping the last reference to it (``FlatParams.release`` drops a unit's
parameter views). Because the count follows the array's real lifetime (a
``weakref.finalize`` on it; views keep their base alive), a view left behind keeps
its bytes in the figures: a test that asserts "no full parameter buffer exists" reads
what is really held, not what the code meant to free. On cuda the same arrays come
from the caching pool (``backend/cuda/pool.py``), so these are the pool's
allocations seen by tag.

Not counted here: the ring's scratch (``hpcdp.comm`` keeps its own pooled host
buffers: two chunk-sized slots per reduce-scatter in flight) and Python's own
overhead; ``rss_peak_bytes`` (the process's peak resident set) covers everything.
"""

from __future__ import annotations

import resource
import sys
import weakref

TAGS = ("params", "grads", "optim", "working")
PERSISTENT = ("params", "grads", "optim")


class MemoryTracker:
    """Live and peak bytes per tag of one backend in this process."""

    def __init__(self):
        self.live = {t: 0 for t in TAGS}
        self.peak = {t: 0 for t in TAGS}
        self.peak_total = 0
        self.allocs = 0

    def track(self, array, tag: str):
        """Count ``array`` under ``tag`` until it is freed; returns it."""
        if tag not in self.live:
            raise ValueError(f"memory tag must be one of {TAGS}, got {tag!r}")
        nbytes = int(array.nbytes)
        self.live[tag] += nbytes
        self.allocs += 1
        if self.live[tag] > self.peak[tag]:
            self.peak[tag] = self.live[tag]
        total = sum(self.live.values())
        if total > self.peak_total:
            self.peak_total = total
        weakref.finalize(_memory_owner(array), self._freed, tag, nbytes)
        return array

    def _freed(self, tag: str, nbytes: int) -> None:
        self.live[tag] -= nbytes

    @property
    def persistent(self) -> int:
        return sum(self.live[t] for t in PERSISTENT)

    @property
    def total(self) -> int:
        return sum(self.live.values())

    def reset_peak(self) -> None:
        """Start a new peak window at the current live figures."""
        self.peak = dict(self.live)
        self.peak_total = self.total

    def figures(self, reset: bool = True) -> dict:
        """Bytes for metrics: live per persistent tag, the working buffers' peak, the
        peak of all tagged state since the last reset, and the process's peak RSS."""
        out = {f"mem_{t}_bytes": float(self.live[t]) for t in PERSISTENT}
        out["mem_persistent_bytes"] = float(self.persistent)
        out["mem_working_peak_bytes"] = float(self.peak["working"])
        out["mem_peak_bytes"] = float(self.peak_total)
        out["rss_peak_bytes"] = float(rss_peak_bytes())
        if reset:
            self.reset_peak()
        return out


def _memory_owner(array):
    """The object whose lifetime is the allocation's: a numpy array (its views hold
    it as ``.base``), the simulator's host array behind a fake device array. A real
    numba device array is its own owner: its views share a refcounted pointer, so a
    view that outlives its base is not counted there (the pool's reserved bytes,
    ``hpcdp.backend.cuda.pool_stats``, bound the total from above)."""
    return getattr(array, "_ary", array)


def rss_peak_bytes() -> int:
    """Peak resident set size of this process (bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


__all__ = ["TAGS", "PERSISTENT", "MemoryTracker", "rss_peak_bytes"]
