"""``index.h5``: where every logical tensor lives, and the run's state.

Written by rank 0 once every rank's data file is on disk (it reads their metadata,
not their data), read by every rank on load. Contents::

    /  attrs   format, format_version, hpcdp_version, layout, step, strategy,
               world_size, config (the resolved TOML)
    /files       (F,) names of the data files      /file_bytes (F,) their sizes
    /tensors/names (T,) logical tensor names       /tensors/dtypes (T,)
    /tensors/ndim  (T,)   /tensors/dims (T, max ndim)   (shape = dims[:ndim])
    /pieces      (P, 4) int64: tensor index, file index, element offset, size;
                 sorted by tensor then offset; a tensor's pieces tile it exactly
    /state       attrs: step, epoch, batch position, lr schedule, optimizer scalars...
                 datasets: rank_optimizer_steps, rank_ps_version, ... (see runstate.py)

Every dataset carries its SHA-256 block digests, checked on read.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from .checksum import block_elements
from ..errors import EARLIER, CheckpointError, damaged_file
from .names import FORMAT_NAME, FORMAT_VERSION, INDEX_FILE
from .h5 import create, group_at, read_small, write_small
from .ranges import coverage_problems
from .shardfile import set_attrs


@dataclass
class Index:
    attrs: dict                      # root attributes (format, step, layout, config...)
    files: list                      # data file names, relative to the checkpoint dir
    file_bytes: list                 # their sizes when written
    tensors: list                    # logical tensor names
    shapes: list                     # tuple per tensor
    dtypes: list                     # numpy dtype name per tensor
    pieces: np.ndarray               # (P, 4) int64: tensor, file, offset, size
    state: dict = field(default_factory=dict)         # /state attributes
    arrays: dict = field(default_factory=dict)        # /state datasets

    def tensor_id(self, name: str) -> int | None:
        if not hasattr(self, "_ids"):
            self._ids = {t: i for i, t in enumerate(self.tensors)}
        return self._ids.get(name)

    def pieces_of(self, tensor: int) -> np.ndarray:
        """The rows of ``pieces`` of tensor number ``tensor`` (kept: a restore asks
        once per read)."""
        if not hasattr(self, "_rows"):
            self._rows = {}
        rows = self._rows.get(tensor)
        if rows is None:
            lo, hi = np.searchsorted(self.pieces[:, 0], [tensor, tensor + 1])
            rows = self._rows[tensor] = self.pieces[lo:hi]
        return rows

    def numel(self, tensor: int) -> int:
        return math.prod(self.shapes[tensor])  # Python ints: no int64 wrap for absurd dims

    @property
    def step(self) -> int:
        return int(self.attrs["step"])


def _strings(values) -> np.ndarray:
    return np.array([str(v).encode() for v in values], dtype="S") if values else np.zeros(0, "S1")


def build_tables(expected: dict, found: list, files: list, where: str) -> np.ndarray:
    """The (P, 4) piece table from the data files' metadata, checked against the
    ``expected`` tensors ``{name: (shape, dtype)}``: every tensor covered exactly
    once, dtypes as expected, nothing unknown.

    ``found``: per file index, a list of ``(tensor, offset, size, dtype)``.
    """
    names = list(expected)
    ids = {n: i for i, n in enumerate(names)}
    rows, spans = [], {n: [] for n in names}
    for fi, entries in enumerate(found):
        for tensor, off, size, dtype in entries:
            if tensor not in ids:
                raise CheckpointError(f"{where}: {files[fi]} holds {tensor!r}, which the model "
                                      "and optimizer do not have")
            if dtype != expected[tensor][1]:
                raise CheckpointError(f"{where}: {files[fi]} stores {tensor} as {dtype}, "
                                      f"expected {expected[tensor][1]}")
            rows.append((ids[tensor], fi, off, size))
            spans[tensor].append((off, size))
    for n in names:
        numel = int(np.prod(expected[n][0], dtype=np.int64))
        problem = coverage_problems(numel, spans[n])
        if problem:
            raise CheckpointError(f"{where}: tensor {n} ({numel} elements) is not covered "
                                  f"exactly once by the ranks' pieces: {problem}")
    table = np.array(sorted(rows), dtype=np.int64).reshape(-1, 4)
    return table


def write_index(ckpt_dir, attrs: dict, expected: dict, table: np.ndarray, files: list,
                state: dict, arrays: dict) -> Path:
    """Write ``index.h5`` into ``ckpt_dir`` and fsync it."""
    path = Path(ckpt_dir) / INDEX_FILE
    names = list(expected)
    shapes = [tuple(int(d) for d in expected[n][0]) for n in names]
    ndim = np.array([len(s) for s in shapes], dtype=np.int64)
    dims = np.zeros((len(names), max([1, *ndim.tolist()])), dtype=np.int64)
    for i, s in enumerate(shapes):
        dims[i, :len(s)] = s
    sizes = np.array([os.path.getsize(Path(ckpt_dir) / f) for f in files], dtype=np.int64)
    blk = block_elements(8)
    with create(path) as f:
        set_attrs(f, {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "kind": "index", **attrs})
        write_small(f, "files", _strings(files), blk)
        write_small(f, "file_bytes", sizes, blk)
        t = group_at(f, "tensors")
        write_small(t, "names", _strings(names), blk)
        write_small(t, "dtypes", _strings(expected[n][1] for n in names), blk)
        write_small(t, "ndim", ndim, blk)
        write_small(t, "dims", dims, blk)
        write_small(f, "pieces", table, blk)
        s = group_at(f, "state")
        set_attrs(s, state)
        for key in sorted(arrays):
            write_small(s, key, np.asarray(arrays[key]), blk)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def _decode(arr) -> list:
    return [x.decode() if isinstance(x, bytes) else str(x) for x in np.asarray(arr).tolist()]


def _attr(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


# The attributes a reader uses as numbers or names, with their types (a tampered or
# foreign index with a string step is refused naming the attribute, not converted)
ROOT_ATTRS = {"step": int, "format_version": int, "world_size": int, "layout": str, "strategy": str,
              "config": str, "hpcdp_version": str}
STATE_ATTRS = {"step": int, "next_epoch": int, "next_batch": int, "global_batch": int, "n_train": int,
               "batches_per_epoch": int, "data_seed": int, "total_steps": int, "warmup_steps": int,
               "optimizer_steps": int, "world_size": int, "dp_size": int, "lr": float,
               "optimizer_kind": str, "lr_schedule": str, "strategy": str, "dtype": str,
               "batch_schedule": str}


def check_attr_types(attrs: dict, types: dict, prefix: str, where: str) -> None:
    """Each attribute of ``types`` that ``attrs`` holds has that type (an integer
    for int, any real number for float, text for str)."""
    for key, tp in types.items():
        if key not in attrs:
            continue
        v = attrs[key]
        ok = (isinstance(v, int) and not isinstance(v, bool)) if tp is int else \
            (isinstance(v, (int, float)) and not isinstance(v, bool)) if tp is float else isinstance(v, str)
        if not ok:
            want = {int: "an integer", float: "a number", str: "text"}[tp]
            raise CheckpointError(f"{where}: {prefix}attribute {key} is {v!r}, expected {want}: the index is "
                                  f"damaged or was edited; {EARLIER}")


def read_index(ckpt_dir) -> Index:
    """Read and verify ``index.h5`` (checksums, format version); damaged HDF5
    structures give one CheckpointError naming the file (errors.damaged_file)."""
    path = Path(ckpt_dir) / INDEX_FILE
    where = f"checkpoint {ckpt_dir}: file {INDEX_FILE}"
    from .probe import check_in_child, crash_prone_build
    if path.is_file() and crash_prone_build():  # a crash on damage becomes the line (probe.py)
        check_in_child(path, where)
    with damaged_file(where):
        index = _read_index(path)
    check_sizes(index, Path(ckpt_dir), where)
    return index


def check_sizes(index: Index, ckpt_dir: Path, where: str) -> None:
    """Bound what a reader allocates by what the files can hold, before anything is
    allocated: every dtype is a NumPy dtype, no dimension, offset or size is negative,
    each tensor's shape holds no more elements than its pieces, and the pieces each data
    file holds (elements x itemsize) fit in that file's real size on disk (the data is
    stored uncompressed). An index whose dimensions were altered (its checksums and
    the COMMITTED marker recomputed) is refused here in one line, never turned into a
    terabyte ``np.empty``."""
    bad = f"the index is damaged or was altered; {EARLIER}"
    itemsize = []
    for name, dtype, shape in zip(index.tensors, index.dtypes, index.shapes):
        try:
            itemsize.append(np.dtype(dtype).itemsize)
        except TypeError:
            raise CheckpointError(f"{where}: tensor {name} has dtype {dtype!r}, not a NumPy dtype: {bad}") from None
        if any(d < 0 for d in shape):
            raise CheckpointError(f"{where}: tensor {name} has shape {tuple(shape)} (a negative dimension): {bad}")
    pieces = index.pieces
    if pieces.size and (pieces < 0).any():
        raise CheckpointError(f"{where}: /pieces holds a negative tensor, file, offset or size: {bad}")
    held = [0] * len(index.tensors)       # elements the pieces of each tensor hold
    claimed = [0] * len(index.files)      # bytes the pieces in each file take
    for t, fi, _, size in pieces.tolist():
        held[t] += size
        claimed[fi] += size * itemsize[t]
    for t, name in enumerate(index.tensors):
        if index.numel(t) > held[t]:
            raise CheckpointError(f"{where}: tensor {name} has shape {tuple(index.shapes[t])} "
                                  f"({index.numel(t)} elements) but its pieces hold {held[t]}: {bad}")
    for fi, name in enumerate(index.files):
        try:
            real = os.path.getsize(ckpt_dir / name)
        except OSError:
            continue  # a missing data file is named by the reader, with its own remedy
        if claimed[fi] > real:
            raise CheckpointError(f"{where}: the index puts {claimed[fi]} bytes of tensors in {name}, which "
                                  f"has {real} bytes on disk: {bad}")


def _read_index(path: Path) -> Index:
    where = str(path)
    if not path.is_file():
        raise CheckpointError(f"{where}: file is missing")
    with h5py.File(path, "r") as f:
        attrs = {k: _attr(v) for k, v in f.attrs.items()}
        if attrs.get("format") != FORMAT_NAME:
            raise CheckpointError(f"{where}: not an hpcdp checkpoint index (format {attrs.get('format')!r})")
        check_attr_types(attrs, ROOT_ATTRS, "", where)
        version = int(attrs.get("format_version", -1))
        if version > FORMAT_VERSION:
            raise CheckpointError(f"{where}: checkpoint format version {version} is newer than this hpcdp "
                                  f"reads ({FORMAT_VERSION}); upgrade hpcdp")
        files = _decode(read_small(f, "files", where))
        file_bytes = [int(x) for x in read_small(f, "file_bytes", where)]
        if "tensors" not in f:
            raise CheckpointError(f"{where}: group /tensors is missing")
        names = _decode(read_small(f["tensors"], "names", where))
        dtypes = _decode(read_small(f["tensors"], "dtypes", where))
        ndim = read_small(f["tensors"], "ndim", where)
        dims = read_small(f["tensors"], "dims", where)
        pieces = np.asarray(read_small(f, "pieces", where), dtype=np.int64).reshape(-1, 4)
        state, arrays = {}, {}
        if "state" in f:
            state = {k: _attr(v) for k, v in f["state"].attrs.items()}
            check_attr_types(state, STATE_ATTRS, "/state ", where)
            for key in f["state"]:
                arrays[key] = read_small(f["state"], key, where)
    if not (len(names) == len(dtypes) == len(ndim) == len(dims)):
        raise CheckpointError(f"{where}: the tensor tables have different lengths")
    shapes = [tuple(int(d) for d in dims[i, :int(ndim[i])]) for i in range(len(names))]
    if len(file_bytes) != len(files):
        raise CheckpointError(f"{where}: /files and /file_bytes have different lengths")
    if pieces.size and (pieces[:, 0].max() >= len(names) or pieces[:, 1].max() >= len(files)):
        raise CheckpointError(f"{where}: /pieces refers to a tensor or file that is not listed")
    return Index(attrs, files, file_bytes, names, shapes, dtypes, pieces, state, arrays)


__all__ = ["Index", "build_tables", "write_index", "read_index", "check_attr_types", "check_sizes"]
