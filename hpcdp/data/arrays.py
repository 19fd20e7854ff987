"""Arrays on disk, opened and read by rows: the out-of-core half of :mod:`hpcdp.data`.

A :class:`DiskArray` is a ``.npy`` file or an HDF5 dataset that is opened, not
loaded: it knows its shape and dtype and reads the rows (first axis) it is asked
for. A read sorts the requested rows, reads each run of consecutive rows with one
call, and puts the rows back in the requested order, so callers see exactly what
``array[rows]`` would give.

Two ways to read a run:

- ``pread``: a ``.npy`` file, and an HDF5 dataset stored contiguously without
  filters, is plain bytes at a known file offset, so a run of rows is one
  ``os.preadv`` straight into the output buffer. No temporary, and the GIL is
  released while the kernel copies, so a prefetch thread reads while the main
  thread computes. Pages come through the page cache and are not mapped into the
  process: unlike ``np.memmap``, whose touched pages count toward the process's
  resident memory until unmapped (the reason nanoGPT recreates its memmap every
  batch), resident memory stays at the size of the batch.
- ``h5py``: a chunked or compressed HDF5 dataset: one ``read_direct`` per run
  (HDF5 decompresses whole chunks; its chunk cache is bounded, 1 MiB per dataset
  by default). h5py serialises calls under its own lock.

Data sieving (ROMIO's name for it): rows closer together than ``sieve_gap`` bytes
are read as one span, into a scratch buffer of at most ``sieve_max`` bytes, and
the wanted rows are copied out. One call costs about as much as copying 50 KB
from the page cache, so a batch of 64 random rows of a 0.5 MB file (the digits)
is one read instead of 64; rows of a large set, far apart, are still one read
each. Cost: the gap bytes are read and dropped; memory: ``sieve_max`` per read.

Not mapped, on purpose. Copying scattered rows out of a mapping is faster on this
project's 2-core VM (a system call costs 10-40 us there; 256 random 4 KiB rows
took 2-9 ms through a mapping made for the read against 15-45 ms by ``preadv``), but
a fault maps whole page-cache folios: one read of 500 random rows of a 391 MB file
through a mapping raised the process's peak resident memory (VmHWM) from 80 to
423 MB, even with ``MADV_RANDOM`` and the mapping closed after the read. Reads
into the process's own buffer keep it at the batch.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .dataset import DataError


def runs(sorted_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of the runs of consecutive values in sorted unique ``sorted_rows``."""
    if len(sorted_rows) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cut = np.flatnonzero(np.diff(sorted_rows) != 1) + 1
    first = np.concatenate(([0], cut))
    lengths = np.diff(np.concatenate((first, [len(sorted_rows)])))
    return sorted_rows[first].astype(np.int64), lengths.astype(np.int64)


class DiskArray:
    """An opened array; ``read(rows)`` returns ``array[rows]`` (rows: int array or slice)."""

    sieve_gap = 32 << 10   # bytes: rows at most this far apart are read as one span
    sieve_max = 4 << 20    # bytes: the largest span read for sieving

    def __init__(self, path: Path, shape: tuple, dtype: np.dtype, *, offset: int | None = None,
                 dataset=None, where: str = ""):
        self.path, self.shape, self.dtype = Path(path), tuple(int(d) for d in shape), np.dtype(dtype)
        self.where = where or str(path)  # for messages: "file.h5:train/x"
        self.row_shape = self.shape[1:]
        self.row_bytes = int(np.prod(self.row_shape, dtype=np.int64)) * self.dtype.itemsize
        self._offset, self._dataset = offset, dataset
        self._fd = os.open(self.path, os.O_RDONLY) if offset is not None else None

    @property
    def method(self) -> str:
        return "pread" if self._fd is not None else "h5py"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def read(self, rows) -> np.ndarray:
        """Rows in the requested order (repeats allowed); one read per run of rows."""
        if isinstance(rows, slice):
            start, stop, step = rows.indices(len(self))
            if step == 1:
                out = np.empty((max(stop - start, 0),) + self.row_shape, self.dtype)
                if len(out):
                    self._read_run(start, out)
                return out
            rows = np.arange(start, stop, step)
        rows = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            bad = int(rows[(rows < 0) | (rows >= len(self))][0])
            raise IndexError(f"{self.where}: row {bad} is out of range for {len(self)} rows")
        uniq, inverse = np.unique(rows, return_inverse=True)  # sorted: reads go forward
        buf = np.empty((len(uniq),) + self.row_shape, self.dtype)
        if len(uniq) == 0:
            return buf
        gap_rows = self.sieve_gap // max(self.row_bytes, 1)
        bounds = np.concatenate(([0], np.flatnonzero(np.diff(uniq) - 1 > gap_rows) + 1, [len(uniq)]))
        values = uniq.tolist()
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):  # groups: uniq[a:b]
            lo, span = values[a], values[b - 1] - values[a] + 1
            if span == b - a:  # one run of consecutive rows
                self._read_run(lo, buf[a:b])
            elif span * self.row_bytes <= self.sieve_max:  # sieve: read the span, keep the rows
                scratch = np.empty((span,) + self.row_shape, self.dtype)
                self._read_run(lo, scratch)
                buf[a:b] = scratch[uniq[a:b] - lo]
            else:
                at = a
                for start, k in zip(*runs(uniq[a:b])):
                    self._read_run(int(start), buf[at:at + k])
                    at += k
        if len(uniq) == len(rows) and np.array_equal(uniq, rows):
            return buf  # already in order: no reorder copy
        return buf[inverse]

    def read_windows(self, starts, length: int) -> np.ndarray:
        """(len(starts), length) array of 1-D windows ``array[s:s + length]``: one read each,
        in increasing file order."""
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        if len(starts) and (starts.min() < 0 or starts.max() + length > len(self)):
            bad = int(starts[(starts < 0) | (starts + length > len(self))][0])
            raise IndexError(f"{self.where}: a window of {length} at {bad} is out of range for {len(self)} rows")
        out = np.empty((len(starts), length) + self.row_shape, self.dtype)
        for i in np.argsort(starts, kind="stable"):
            self._read_run(int(starts[i]), out[i])
        return out

    def _read_run(self, start: int, out: np.ndarray) -> None:
        """Rows ``start .. start + len(out) - 1`` into ``out`` (C-contiguous)."""
        if self._fd is None:
            self._dataset.read_direct(out, np.s_[start:start + len(out)])
            return
        view = memoryview(out).cast("B")  # out is C-contiguous: its bytes, no copy
        pos, want = self._offset + start * self.row_bytes, len(view)
        done = 0
        while done < want:  # preadv may return short counts (large reads, signals)
            got = os.preadv(self._fd, [view[done:]], pos + done)
            if got == 0:
                raise DataError(f"{self.where}: file ends early (truncated?): wanted {want} bytes "
                                f"at offset {pos}, got {done}")
            done += got

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# -- opening -----------------------------------------------------------------------

def open_npy(path: Path, where: str) -> DiskArray:
    """A ``.npy`` file: parse its header (no pickle), then read rows at the data offset."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            offset = f.tell()
    except (ValueError, OSError) as e:
        raise DataError(f"{where}: cannot read as a .npy file ({e})") from None
    if dtype.hasobject:
        raise DataError(f"{where}: holds Python objects ({dtype}), which need pickle; store a numeric array")
    if fortran and len(shape) > 1:
        raise DataError(f"{where}: is stored in Fortran order, so a sample is not contiguous on disk; "
                        "save it C-ordered: np.save(path, np.ascontiguousarray(a))")
    if len(shape) == 0:
        raise DataError(f"{where}: is a scalar; expected an array of samples (n, ...)")
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = os.path.getsize(path)
    if size < need:
        raise DataError(f"{where}: file is truncated: the header says {need} bytes, the file has {size}")
    return DiskArray(path, shape, dtype, offset=offset, where=where)


def contiguous_offset(dataset) -> int | None:
    """File offset of an HDF5 dataset's bytes if they are one plain contiguous block, else None.

    Contiguous layout, no filters, no external or virtual storage; the offset is
    checked by reading the first row both ways (a mismatch falls back to h5py).
    """
    if dataset.chunks is not None or dataset.compression is not None or dataset.size == 0 \
            or dataset.dtype.kind not in "biuf":
        return None
    if dataset.is_virtual or dataset.external:
        return None
    try:
        offset = dataset.id.get_offset()
    except Exception:  # not allocated, or an HDF5 without the call
        return None
    if offset is None or offset + dataset.size * dataset.dtype.itemsize > os.path.getsize(dataset.file.filename):
        return None  # a truncated file: h5py's reads report it
    row = int(np.prod(dataset.shape[1:], dtype=np.int64)) * dataset.dtype.itemsize
    with open(dataset.file.filename, "rb") as f:
        f.seek(offset)
        raw = f.read(row)
    want = np.empty((1,) + dataset.shape[1:], dataset.dtype)
    dataset.read_direct(want, np.s_[0:1])
    return offset if raw == want.tobytes() else None


def open_h5_dataset(f, name: str, cfg_key: str, path: Path) -> DiskArray:
    """The dataset ``name`` of open h5py file ``f`` as a DiskArray (errors name ``data.<cfg_key>``)."""
    import h5py

    if name not in f:
        found = []
        f.visititems(lambda n, obj: found.append(n) if isinstance(obj, h5py.Dataset) else None)
        raise DataError(f"data.{cfg_key}: dataset {name!r} not found in {path}; datasets found: {sorted(found)}")
    obj = f[name]
    if not isinstance(obj, h5py.Dataset):
        raise DataError(f"data.{cfg_key}: {name!r} in {path} is a group, expected a dataset")
    if obj.shape is None or len(obj.shape) == 0:
        raise DataError(f"{path}: {name!r} is a scalar; expected an array of samples (n, ...)")
    # pread from the file that holds the bytes: an external link (data.allow_external) names another
    return DiskArray(Path(obj.file.filename), obj.shape, obj.dtype, offset=contiguous_offset(obj),
                     dataset=obj, where=f"{path}:{name}")


class MemoryArray:
    """An in-memory array with DiskArray's read interface (``data.storage = "memory"``)."""

    method = "memory"

    def __init__(self, data: np.ndarray, where: str = "memory"):
        self.data, self.where = data, where
        self.shape, self.dtype, self.row_shape = data.shape, data.dtype, data.shape[1:]

    def __len__(self) -> int:
        return self.shape[0]

    def read(self, rows) -> np.ndarray:
        return self.data[rows].copy() if isinstance(rows, slice) else self.data[np.asarray(rows, np.int64)]

    def read_windows(self, starts, length: int) -> np.ndarray:
        starts = np.asarray(starts, dtype=np.int64).reshape(-1)
        return self.data[starts[:, None] + np.arange(length)]
