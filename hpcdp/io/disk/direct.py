"""Bulk bytes to disk past the page cache: O_DIRECT writes of aligned storage.

The data files are laid out so that this works (``h5.create``): every dataset of at
least ``ALIGN_THRESHOLD`` bytes starts at a multiple of ``ALIGN`` (HDF5's
``H5Pset_alignment``), contiguous, allocated early and never filled by HDF5. A
piece's bytes then go to ``[offset, offset + n)`` of the file in three parts:

- the whole ``ALIGN`` pages inside the range, with ``O_DIRECT`` ``pwrite`` calls of
  up to ``CHUNK`` bytes, straight from the array when its memory is page aligned (the
  asynchronous save's snapshot buffers are) or through two page-aligned bounce
  buffers otherwise (the copy into one overlaps the write of the other: ``pwrite``
  and NumPy's copy both release the GIL);
- the partial pages at either end (a dataset's tail; a shared-file piece that starts
  mid-page), with a plain ``pwrite`` through the page cache.

No byte outside the range is written (HDF5's own metadata may share the partial
pages), so the file's bytes are the same whichever way they went. Where the file
system refuses ``O_DIRECT`` (``EINVAL``: tmpfs, some FUSE and network mounts) or
``HPCDP_CKPT_DIRECT=0`` is set, everything goes through the page cache, as before.
The caller makes the file durable with one ``fsync`` at the end.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

ALIGN = 4096                 # file offsets, lengths and memory of O_DIRECT transfers
ALIGN_THRESHOLD = 64 << 10   # datasets at least this large are page aligned in the file
CHUNK = 16 << 20             # bytes per O_DIRECT pwrite
ENV = "HPCDP_CKPT_DIRECT"    # "0": never O_DIRECT (benchmarks compare both ways)


def pwrite_all(fd: int, arr: np.ndarray, offset: int) -> None:
    """All of ``arr``'s bytes to ``fd`` at ``offset`` (plain ``pwrite``, repeated
    until done)."""
    view = memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


def wanted() -> bool:
    return os.environ.get(ENV, "1") != "0" and hasattr(os, "O_DIRECT")


def open_direct(path, flags: int = os.O_WRONLY) -> int | None:
    """A descriptor of ``path`` with O_DIRECT (write, or ``flags``), or None where
    the file system refuses it (or it is switched off)."""
    if not wanted():
        return None
    try:
        return os.open(path, flags | os.O_DIRECT)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            return None
        raise


def aligned_empty(nbytes: int) -> np.ndarray:
    """Page-aligned uint8 memory (an anonymous mapping), for O_DIRECT transfers."""
    buf = mmap.mmap(-1, max(ALIGN, -(-int(nbytes) // ALIGN) * ALIGN))
    return np.frombuffer(buf, dtype=np.uint8)[:nbytes]


class Spares:
    """Buffers kept for the next transfer, at most ``keep`` of them, shared by threads:
    fresh pages cost a fault each (on the development VM, faulting in memory was slower
    than writing it to disk). ``take`` gives a kept one or None."""

    def __init__(self, keep: int):
        self._keep, self._items, self._lock = keep, [], threading.Lock()

    def take(self):
        with self._lock:
            return self._items.pop() if self._items else None

    def give(self, item) -> None:
        with self._lock:
            if len(self._items) < self._keep:
                self._items.append(item)


_BOUNCE = Spares(2)  # bounce buffer pairs, kept for the next file


def _take_bounce() -> list:
    pair = _BOUNCE.take()
    return pair if pair is not None else [aligned_empty(CHUNK), aligned_empty(CHUNK)]


def _give_bounce(pair: list) -> None:
    _BOUNCE.give(pair)


class DirectReads:
    """``pread`` past the page cache: the pages around a range are read with
    O_DIRECT into a page-aligned buffer and the range copied out (reading an
    evicted file through the cache costs a fresh page per 4 KiB on top). Falls back
    to a plain ``pread`` where O_DIRECT is refused (at open or per read)."""

    def __init__(self, max_bytes: int):
        self._buf = aligned_empty(max_bytes + 2 * ALIGN)
        self.refused = False

    def read_into(self, dfd: int | None, fd: int, out: np.ndarray, offset: int) -> int:
        """Fill ``out`` (contiguous) from ``offset``; returns the bytes that came;
        fewer than ``out.nbytes`` means the file ended."""
        view = out.reshape(-1).view(np.uint8)
        n = view.shape[0]
        a = offset // ALIGN * ALIGN
        b = -(-(offset + n) // ALIGN) * ALIGN
        if dfd is None or self.refused or b - a > self._buf.shape[0]:
            return pread_full(fd, view, offset)
        try:
            got = pread_full(dfd, self._buf[:b - a], a)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            self.refused = True
            return pread_full(fd, view, offset)
        have = max(0, min(n, got - (offset - a)))
        view[:have] = self._buf[offset - a:offset - a + have]
        return have


def pread_full(fd: int, view: np.ndarray, offset: int) -> int:
    """Read into ``view`` (uint8) from ``offset`` until it is full or the file ends;
    returns the bytes read."""
    done = 0
    while done < view.shape[0]:
        k = os.preadv(fd, [memoryview(view[done:])], offset + done)
        if k == 0:
            break
        done += k
    return done


def is_aligned(arr: np.ndarray) -> bool:
    return arr.ctypes.data % ALIGN == 0


class PieceWriter:
    """Writes arrays at file offsets of one open file; counts what went which way.

    ``with PieceWriter(path) as w: w.write(arr, offset)``; the bytes are all in the
    file (not yet durable) when the ``with`` block ends."""

    def __init__(self, path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY)
        self.dfd = open_direct(path)
        self.direct = self.dfd is not None
        self.direct_bytes = self.buffered_bytes = 0
        self.refused = False        # O_DIRECT opened but a transfer was refused (EINVAL)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1) if self.direct else None
        self._bounce = _take_bounce() if self.direct else []
        self._busy = [None, None]   # the write in flight from each bounce buffer
        self._turn = 0

    def write(self, arr: np.ndarray, offset: int) -> None:
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        n = raw.shape[0]
        if not self.direct or self.refused or n == 0:
            pwrite_all(self.fd, raw, offset)
            self._count(n, 0)
            return
        lo = min(n, (-offset) % ALIGN)                 # up to the first page boundary
        hi = lo + (n - lo) // ALIGN * ALIGN            # the last whole page's end
        if lo:
            pwrite_all(self.fd, raw[:lo], offset)
        if hi < n:
            pwrite_all(self.fd, raw[hi:], offset + hi)
        self._count(n - (hi - lo), 0)
        zero_copy = is_aligned(raw[lo:hi]) if hi > lo else True
        for a in range(lo, hi, CHUNK):
            b = min(hi, a + CHUNK)
            if zero_copy:
                self._direct(raw[a:b], offset + a)
                continue
            k = self._turn
            self._turn ^= 1
            if self._busy[k] is not None:
                self._busy[k].result()
            buf = self._bounce[k][:b - a]
            np.copyto(buf, raw[a:b])  # releases the GIL: overlaps the other buffer's write
            self._busy[k] = self._pool.submit(self._direct, buf, offset + a)

    def _direct(self, buf: np.ndarray, offset: int) -> None:
        """One O_DIRECT transfer; where the file system refuses it at write time
        (EINVAL: it wants a larger alignment than ALIGN), this and every later
        transfer of the file goes through the page cache instead."""
        if not self.refused:
            try:
                pwrite_all(self.dfd, buf, offset)
                self._count(0, buf.nbytes)
                return
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self.refused = True
        pwrite_all(self.fd, buf, offset)
        self._count(buf.nbytes, 0)

    def _count(self, buffered: int, direct: int) -> None:
        with self._lock:  # the bounce buffers' writes run on a pool thread
            self.buffered_bytes += buffered
            self.direct_bytes += direct

    def close(self) -> None:
        try:
            for f in self._busy:
                if f is not None:
                    f.result()
        finally:
            self._busy = [None, None]
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            if self._bounce:
                _give_bounce(self._bounce)
                self._bounce = []
            if self.dfd is not None:
                os.close(self.dfd)
                self.dfd = None
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["PieceWriter", "pwrite_all", "DirectReads", "open_direct", "pread_full", "aligned_empty", "is_aligned", "wanted", "ALIGN", "ALIGN_THRESHOLD",
           "CHUNK", "ENV"]
