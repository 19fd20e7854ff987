"""Gradient buckets: which contiguous ranges of the flat grad buffer are reduced together.

Pure planning logic (no MPI, no arrays), so it is unit-tested on its own.

The flat buffer's layout is in forward (registration) order, and backward produces
gradients roughly in reverse order of use, so the last parameters are ready first.
Buckets are therefore cut from the END of the buffer: bucket 0 is the range that ends
at ``numel``, bucket 1 the range before it, and so on. Every bucket is a contiguous
``[offset, offset + size)`` range, so it is reduced in place on a view of the grad
buffer (no copy into a staging buffer).

Rule ("reverse greedy, split the large"): walk the parameters from last to first and
add each to the open bucket while the bucket stays within ``cap`` elements. A parameter
that does not fit closes the open bucket; a parameter larger than ``cap`` is cut into
``cap``-sized buckets from its end, and its first (shorter) piece opens the next bucket,
which later parameters may join. So no bucket exceeds ``cap``, small parameters are
never split, and a bucket is ready when every parameter overlapping it is ready.

Per-parameter mode (``cap=None``): one bucket per parameter, the no-bucketing baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Bucket:
    index: int           # launch order: 0 is ready first (end of the buffer)
    offset: int          # first element in the flat grad buffer
    size: int            # number of elements
    params: tuple        # layout indices of the parameters overlapping this range


@dataclass(frozen=True)
class BucketPlan:
    numel: int
    buckets: tuple               # of Bucket, in launch order
    buckets_of_param: tuple      # layout index -> tuple of bucket indices

    def __len__(self) -> int:
        return len(self.buckets)


def bucket_cap_elements(bucket_mb: float, itemsize: int, key: str = "parallel.ddp.bucket_mb") -> int:
    """Bucket size in MiB (as configured) -> capacity in elements of ``itemsize`` bytes.

    A bucket must hold at least one element; anything smaller is a configuration error
    naming ``key``.
    """
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)):
        raise ValueError(f"{key} must be a number of MiB, got {bucket_mb!r}")
    if not bucket_mb > 0:
        raise ValueError(
            f"{key} must be > 0 (MiB per gradient bucket), got {bucket_mb}; "
            "use parallel.ddp.bucketing = \"per_param\" for one bucket per parameter"
        )
    cap = int(bucket_mb * MIB) // itemsize
    if cap < 1:
        raise ValueError(
            f"{key} = {bucket_mb} MiB is smaller than one {itemsize}-byte "
            f"element; use at least {itemsize / MIB:.3g}"
        )
    return cap


def _spans(layout) -> list[tuple[int, int]]:
    """(offset, size) of each layout entry, checked to tile the buffer contiguously."""
    spans = []
    expect = 0
    for i, spec in enumerate(layout):
        off, size = int(spec.offset), int(spec.size)
        if off != expect or size < 0:
            raise ValueError(
                f"bucket planning needs a contiguous layout: entry {i} "
                f"({getattr(spec, 'name', '?')}) starts at {off}, expected {expect}"
            )
        spans.append((off, size))
        expect = off + size
    return spans


def plan_buckets(layout, cap: int | None) -> BucketPlan:
    """Cut the flat grad buffer described by ``layout`` into buckets.

    ``layout``: sequence of objects with ``offset`` and ``size`` (forward order, contiguous
    from 0). ``cap``: bucket capacity in elements, or None for one bucket per parameter.
    """
    if cap is not None and (isinstance(cap, bool) or int(cap) != cap or cap <= 0):
        raise ValueError(f"bucket capacity must be a positive number of elements, got {cap!r}")
    spans = _spans(layout)
    numel = spans[-1][0] + spans[-1][1] if spans else 0
    ranges: list[tuple[int, int]] = []  # (offset, size), in launch order

    if cap is None:
        for off, size in reversed(spans):
            if size:
                ranges.append((off, size))
    else:
        end = numel          # open bucket is [start, end)
        start = numel
        for off, size in reversed(spans):
            if size == 0:
                continue
            if end - off <= cap:             # fits in the open bucket
                start = off
                continue
            if start < end:                  # close the open bucket
                ranges.append((start, end - start))
                end = start
            while end - off > cap:           # a parameter larger than the cap
                ranges.append((end - cap, cap))
                end -= cap
            start = off                      # its remainder opens the next bucket
        if start < end:
            ranges.append((start, end - start))

    return plan_from_ranges(layout, ranges)


def plan_from_ranges(layout, ranges) -> BucketPlan:
    """A BucketPlan whose buckets are the given ``(offset, size)`` ranges, in the given
    (launch) order; each bucket lists the layout entries overlapping it."""
    spans = _spans(layout)
    numel = spans[-1][0] + spans[-1][1] if spans else 0
    buckets = []
    of_param: list[list[int]] = [[] for _ in spans]
    for b, (boff, bsize) in enumerate(ranges):
        members = tuple(i for i, (off, size) in enumerate(spans)
                        if size and off < boff + bsize and boff < off + size)
        for i in members:
            of_param[i].append(b)
        buckets.append(Bucket(index=b, offset=boff, size=bsize, params=members))
    return BucketPlan(numel=numel, buckets=tuple(buckets),
                      buckets_of_param=tuple(tuple(b) for b in of_param))


class ReadyTracker:
    """Counts ready parameters per bucket during one backward and yields buckets to
    launch, strictly in plan order.

    Launching in a fixed order on every rank keeps the sequence of collectives identical
    across ranks even if hooks were to fire in a different order on different ranks.
    """

    def __init__(self, plan: BucketPlan):
        self.plan = plan
        self.reset()

    def reset(self) -> None:
        self.pending = [len(b.params) for b in self.plan.buckets]
        self.seen = [False] * len(self.plan.buckets_of_param)
        self.next = 0  # first bucket not yet launched

    def mark_ready(self, param_index: int) -> list[int]:
        """Record that a parameter's gradient is final; return buckets now launchable."""
        if self.seen[param_index]:
            raise RuntimeError(
                f"grad-ready hook fired twice for parameter #{param_index} in one backward"
            )
        self.seen[param_index] = True
        for b in self.plan.buckets_of_param[param_index]:
            self.pending[b] -= 1
        return self._advance()

    def _advance(self) -> list[int]:
        out = []
        while self.next < len(self.pending) and self.pending[self.next] == 0:
            out.append(self.next)
            self.next += 1
        return out

    def remaining(self) -> list[int]:
        """Buckets not launched yet (e.g. parameters that got no gradient in this
        backward); the caller launches them when backward is over."""
        out = list(range(self.next, len(self.pending)))
        self.next = len(self.pending)
        return out
