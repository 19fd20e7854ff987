"""Coalesced reads: the byte ranges a restore will read, merged into few large ones.

A restore reads many small ranges (one per checksum block, and a GPT's many small
tensors are one block each), spread over several data files in the order the
targets want them. One O_DIRECT request per range leaves the disk far below its
sequential rate. Given the ranges beforehand (``Reader.prepare``):

1. ``merge`` sorts them by (file, offset) and merges neighbours whose gap is at
   most ``GAP`` bytes into extents of at most ``EXTENT_BYTES`` (page aligned, so
   they are read with O_DIRECT); the gap bytes (HDF5 headers between datasets,
   alignment padding) are read and dropped;
2. ``Extents`` reads each extent once, in the order its first range is wanted, up
   to ``AHEAD`` extents before the one a reader waits for (a pool of its own: one
   thread per file at a time), into recycled page-aligned buffers; each range is
   then a view of its extent's buffer, and the buffer goes back once every range
   in it has been taken (``release``).

The caller copies and verifies each range as before, so checksums, error messages
and the fallbacks (``pread`` where O_DIRECT is refused; a short read left to the
caller, which names where the file ends) do not change. Live buffers are bounded
by ``LIVE_BYTES`` for the read-ahead; an extent a reader waits for is read even
beyond it, so a restore whose order jumps around a file still finishes (holding
more memory). ``HPCDP_CKPT_COALESCE=0`` switches the merge off (one read per block).
"""

from __future__ import annotations

import errno
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from .direct import ALIGN, Spares, aligned_empty, pread_full

EXTENT_BYTES = 8 << 20     # the most bytes one coalesced read covers
GAP = 256 << 10            # unwanted bytes between two ranges still read through
AHEAD = 3                  # extents read before the one a reader waits for
LIVE_BYTES = 40 << 20      # read-ahead stops while this many bytes are held
THREADS = 2                # extent reads in flight
ENV = "HPCDP_CKPT_COALESCE"   # "0": one read per block, as before (benchmarks compare both)

_BUFFER = EXTENT_BYTES + 2 * ALIGN
_SPARES = Spares(AHEAD + THREADS)  # buffers of _BUFFER bytes, kept for the next restore


def wanted() -> bool:
    return os.environ.get(ENV, "1") != "0"


def merge(ranges, extent_bytes: int | None = None, gap: int | None = None):
    """``ranges``: ``(file, start, end)`` byte ranges in the order they will be
    wanted. Returns ``(extents, where)``: extents ``(file, start, end)`` (``start``
    and ``end`` page aligned), ordered by the first range each holds, and for each
    range the number of its extent (``extent_bytes``, ``gap``: the module's by default)."""
    extent_bytes = EXTENT_BYTES if extent_bytes is None else extent_bytes
    gap = GAP if gap is None else gap
    order = sorted(range(len(ranges)), key=lambda i: (ranges[i][0], ranges[i][1]))
    spans: list = []      # [file, aligned start, aligned end, first wanted]
    where = [0] * len(ranges)
    for i in order:
        fi, a, b = ranges[i]
        a0, b0 = a // ALIGN * ALIGN, -(-b // ALIGN) * ALIGN
        last = spans[-1] if spans else None
        if last is not None and last[0] == fi and a0 <= last[2] + gap and max(b0, last[2]) - last[1] <= extent_bytes:
            last[2] = max(last[2], b0)
            last[3] = min(last[3], i)
        else:
            spans.append([fi, a0, b0, i])
        where[i] = len(spans) - 1
    rank = sorted(range(len(spans)), key=lambda e: spans[e][3])
    new = {e: k for k, e in enumerate(rank)}
    return [tuple(spans[e][:3]) for e in rank], [new[e] for e in where]


def _take(nbytes: int):
    buf = _SPARES.take() if nbytes <= _BUFFER else None  # (only _BUFFER-sized ones are kept)
    return buf if buf is not None else aligned_empty(max(nbytes, _BUFFER))


def _give(buf) -> None:
    if buf.shape[0] == _BUFFER:
        _SPARES.give(buf)


class Extents:
    """Reads ``extents`` (from :func:`merge`) of open files once each, ahead of need.

    ``fds(file)`` gives ``(O_DIRECT descriptor or None, plain descriptor)``;
    ``uses[e]`` is how many ranges will be taken from extent ``e``."""

    def __init__(self, extents, uses, fds):
        self._ext, self._left, self._fds = list(extents), list(uses), fds
        self._futures: list = [None] * len(self._ext)
        self._next = 0
        self._live = 0
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=THREADS) if self._ext else None
        self.refused = False   # O_DIRECT refused at read time: plain preads from then on
        self.requests = 0      # reads issued (for the tests and the benchmark's notes)

    def view(self, e: int, start: int, end: int):
        """Bytes ``[start, end)`` of the file of extent ``e`` (uint8, a view of its
        buffer; shorter where the file ended). Waits for the extent's read."""
        with self._lock:
            if self._pool is None:
                raise RuntimeError("the coalesced reads are closed")
            self._submit(e)
            while self._next < min(len(self._ext), e + 1 + AHEAD) and self._live < LIVE_BYTES:
                self._submit(self._next)
            fut = self._futures[e]
        buf, got = fut.result()
        a = self._ext[e][1]
        return buf[start - a:min(end, a + got) - a] if start < a + got else buf[:0]

    def release(self, e: int) -> None:
        """One range of extent ``e`` has been taken; the last gives its buffer back."""
        with self._lock:
            self._left[e] -= 1
            if self._left[e] == 0 and self._futures[e] is not None:
                fut, self._futures[e] = self._futures[e], False
                if fut.done() and fut.exception() is None:
                    _give(fut.result()[0])
                self._live -= self._ext[e][2] - self._ext[e][1]

    def _submit(self, e: int) -> None:
        if self._futures[e] is None:
            fi, a, b = self._ext[e]
            self._futures[e] = self._pool.submit(self._read, fi, a, b)
            self._live += b - a
            self.requests += 1
        while self._next < len(self._ext) and self._futures[self._next] is not None:
            self._next += 1

    def _read(self, fi: int, a: int, b: int):
        buf = _take(b - a)
        dfd, fd = self._fds(fi)
        if dfd is not None and not self.refused:
            try:
                return buf, pread_full(dfd, buf[:b - a], a)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.refused = True
        return buf, pread_full(fd, buf[:b - a], a)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


__all__ = ["merge", "Extents", "wanted", "EXTENT_BYTES", "GAP", "AHEAD", "ENV"]
