"""HDF5 the deterministic way, plus raw reads and writes of contiguous datasets.

Same state saved twice gives byte-identical files because every file is created
with fixed library-version bounds (``format.LIBVER``), no object timestamps
(``track_times=False``, h5py's default, passed explicitly) and the same sequence of
creations. Bulk data bypasses HDF5: a dataset is created with its storage allocated
up front and no fill, its file offset is read back, and the bytes go in with
``os.pwrite`` through a second descriptor (HDF5 itself writes only metadata,
elsewhere in the file); ``pwrite`` releases the GIL and copies at page-cache speed.
Reads take the same path with ``os.pread``; a dataset that is not contiguous
(someone repacked the file with chunks) is read through h5py instead.
"""

from __future__ import annotations

import os

import h5py
import numpy as np

from ..disk.direct import ALIGN, ALIGN_THRESHOLD
from ..errors import CheckpointError
from .checksum import block_digests, first_bad_block
from .names import LIBVER


def create(path, **kw) -> h5py.File:
    """A new file whose large datasets start on page boundaries (disk/direct.py's ALIGN),
    so their bytes can be written with O_DIRECT; small objects pack as usual."""
    return h5py.File(path, "w", libver=LIBVER, alignment_threshold=ALIGN_THRESHOLD, alignment_interval=ALIGN,
                     **kw)


def open_read(path) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file is missing") from None
    except OSError as e:
        raise CheckpointError(f"{path}: not a readable HDF5 file ({e}); the file is damaged "
                              "or truncated") from None


def group_at(parent, path: str, cache: dict | None = None):
    """The group ``parent/path``, creating missing levels WITHOUT timestamps (HDF5's
    default group property list records times in v2 object headers, which parallel
    HDF5 writes: the same save would differ in 8 bytes a second later). ``cache``
    (a dict the caller keeps while the file is open) keeps every level it met, so a
    new group is looked up from its deepest known ancestor: a save makes one group
    per tensor under a few shared ones (``optim/m``), ~3 datasets per parameter."""
    if not path:
        return parent
    if cache is not None and path in cache:
        return cache[path]
    parts = [p for p in path.split("/") if p]
    group, start = parent, 0
    if cache is not None:
        for k in range(len(parts) - 1, 0, -1):   # the deepest level already known
            known = cache.get("/".join(parts[:k]))
            if known is not None:
                group, start = known, k
                break
    for k in range(start, len(parts)):
        part = parts[k]
        if part not in group:
            gcpl = h5py.h5p.create(h5py.h5p.GROUP_CREATE)
            gcpl.set_obj_track_times(False)
            h5py.h5g.create(group.id, part.encode(), gcpl=gcpl)
        group = group[part]
        if cache is not None:
            cache["/".join(parts[:k + 1])] = group
    return group


def put_attr(obj, name: str, value) -> None:
    """A new numeric attribute on ``obj`` (an h5py object) through the low-level API:
    the same type, dataspace and bytes as ``obj.attrs[name] = value`` for a name not
    yet there, at a fraction of h5py's high-level cost (a save writes three per
    piece)."""
    data = np.array(value, order="C")   # 0-d stays 0-d: a scalar dataspace, as h5py makes it
    attr = h5py.h5a.create(obj.id, name.encode(), h5py.h5t.py_create(data.dtype, logical=True),
                           h5py.h5s.create_simple(data.shape))
    attr.write(data)


def raw_dataset(group, name: str, n: int, dtype, cache: dict | None = None, **kw):
    """A 1-D contiguous dataset whose storage exists now and is never filled by HDF5
    (the caller writes the bytes at ``ds.id.get_offset()``)."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    parent, _, base = name.rpartition("/")
    return group_at(group, parent, cache).create_dataset(base, shape=(int(n),), dtype=np.dtype(dtype), dcpl=dcpl,
                                                  track_times=False, **kw)


def write_small(group, name: str, arr, block: int) -> None:
    """A small dataset written through h5py, with its block digests (index tables)."""
    arr = np.ascontiguousarray(arr)
    parent, _, base = name.rpartition("/")
    ds = group_at(group, parent).create_dataset(base, data=arr, track_times=False)
    ds.attrs["block"] = np.int64(block)
    ds.attrs["sha256"] = block_digests(arr.reshape(-1), block, "sha256")  # the index keeps SHA-256


def read_small(group, name: str, where: str) -> np.ndarray:
    """Read and verify a dataset written by :func:`write_small`."""
    if name not in group:
        raise CheckpointError(f"{where}: dataset {group.name.rstrip('/')}/{name} is missing")
    ds = group[name]
    arr = ds[()]
    bad = first_bad_block(np.asarray(arr).reshape(-1), 0, int(ds.attrs["block"]), ds.attrs["sha256"],
                          "sha256")
    if bad is not None:
        raise CheckpointError(f"{where}: dataset {ds.name} fails its SHA-256 check (block {bad}); "
                              "the file is corrupt")
    return arr


class QuickDataset:
    """Read-only access to one dataset through h5py's low-level API: what a reader of
    hpcdp's own data files asks (dtype, shape, file offset, attributes). h5py's
    high-level ``name in group``, ``group[name]`` and ``.attrs[...]`` cost several
    times more per call (the checks and wrappers of a general API; measured ~1.5 ms
    against ~0.3-0.7 ms per piece on the 2-core test machine), and a restore asks
    it of every stored piece. Raises KeyError when ``path`` is not a dataset of ``h5``."""

    def __init__(self, h5: h5py.File, path: str):
        self.id = h5py.h5d.open(h5.id, path.encode())
        self.attrs = QuickAttrs(self.id)
        self.dtype, self.shape = self.id.dtype, self.id.shape
        self._ds = None

    def __getitem__(self, key):   # the slow path (a repacked, non-contiguous dataset)
        if self._ds is None:
            self._ds = h5py.Dataset(self.id)
        return self._ds[key]


class QuickAttrs:
    """``in`` and ``[]`` of numeric attributes by name (h5a, no high-level wrapper);
    KeyError names the attribute that is not there."""

    def __init__(self, oid):
        self._id = oid

    def __contains__(self, name: str) -> bool:
        return bool(h5py.h5a.exists(self._id, name.encode()))

    def __getitem__(self, name: str):
        if not h5py.h5a.exists(self._id, name.encode()):
            raise KeyError(name)
        attr = h5py.h5a.open(self._id, name.encode())
        out = np.empty(attr.shape, dtype=attr.dtype)
        attr.read(out)
        return out[()] if out.ndim == 0 else out


def pread_into(fd: int, out: np.ndarray, offset: int, path) -> None:
    """Fill ``out`` (contiguous) from the file at ``offset``; a short read means the
    file ends early (truncated)."""
    view = memoryview(out.reshape(-1).view(np.uint8))
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise CheckpointError(f"{path}: file ends at byte {offset + done}, a dataset needs "
                                  f"{offset + len(view)}: the file is truncated")
        done += n


def fsync_file(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path) -> None:
    """Make a directory's entries (new files, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def has_mpi() -> bool:
    return bool(h5py.get_config().mpi)


__all__ = ["create", "open_read", "group_at", "raw_dataset", "write_small", "read_small",
           "pread_into", "fsync_file", "fsync_dir", "has_mpi", "QuickDataset", "QuickAttrs", "put_attr"]
