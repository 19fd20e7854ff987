"""Datasets from user files: HDF5 files, directories of ``.npy`` files, ``.npz`` archives.

The data is two arrays, named by ``data.x_key`` / ``data.y_key`` (default ``x`` /
``y``): datasets of an HDF5 file (a key may be a path such as ``train/images``),
files ``<key>.npy`` in the directory ``data.path``, or members of a ``.npz``:

- for an MLP (classification): ``x`` numeric, shape (n, features) or (n, d1, d2, ...)
  (flattened to (n, features)); ``y`` integer class labels >= 0, shape (n,)
- for a GPT (sequences): ``x`` integer token ids >= 0, shape (n, T); ``y`` the same
  shape (usually ``x`` shifted by one token)

The test set is ``data.test_path`` (same keys) when given, otherwise a deterministic
``data.test_fraction`` split of the file.

Storage (``data.storage``): HDF5 and ``.npy`` data stays on disk (``"auto"`` or
``"disk"``): the arrays are opened, and ``Dataset.x_train`` etc. are views that read
the rows asked for (:mod:`.views`, :mod:`.arrays`). ``"memory"`` reads them whole, as
``.npz`` archives always are. Either way the values are checked once at startup:
each rank scans its share of the rows (``shard_range``) in 4 MiB pieces and the
ranks combine their findings (:mod:`.same_files`), so memory stays bounded and the file
is read once in total.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hpcdp.shard import shard_range

from .dataset import DataError, Dataset, split_indices
from .same_files import check_same_files, combine_max
from .arrays import open_h5_dataset, open_npy
from .external import refuse_external
from .views import RowView

SCAN_BYTES = 4 << 20  # rows per piece of the startup value scan: about this many bytes


def _read_npz(path: Path, keys: dict[str, str]) -> dict[str, np.ndarray]:
    try:
        archive = np.load(path, allow_pickle=False)
    except Exception as e:  # zipfile.BadZipFile, ValueError, OSError...
        raise DataError(f"{path}: cannot read as a .npz archive ({type(e).__name__}: {e})") from None
    if not hasattr(archive, "files"):
        raise DataError(f"{path}: is a single .npy array, expected a .npz archive with keys "
                        f"{sorted(set(keys.values()))} (np.savez(path, x=..., y=...))")
    with archive:
        out = {}
        for cfg_key, name in keys.items():
            if name not in archive.files:
                raise DataError(f"data.{cfg_key}: key {name!r} not found in {path}; "
                                f"keys found: {sorted(archive.files)}")
            try:
                out[cfg_key] = archive[name]
            except ValueError as e:  # object arrays need pickle, which hpcdp never loads
                raise DataError(f"{path}: array {name!r} cannot be loaded without pickle ({e}); "
                                "store a numeric array") from None
    return out


def _open_hdf5(path: Path, keys: dict[str, str]) -> dict:
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DataError(f"{path}: cannot open as an HDF5 file ({e})") from None
    # The file stays open while its datasets are in use (views read from it).
    return {cfg_key: open_h5_dataset(f, name, cfg_key, path) for cfg_key, name in keys.items()}


def _open_npy(path: Path, keys: dict[str, str]) -> dict:
    return {cfg_key: open_npy(path / f"{name}.npy", f"{path / name}.npy") for cfg_key, name in keys.items()}


def _files_of(kind: str, path: str, keys: dict[str, str], cfg_key: str) -> list[tuple[str, str]]:
    """The (config key, file) pairs every rank must see alike."""
    if kind == "npy":
        return [(f"data.{cfg_key}", str(Path(path) / f"{keys[k]}.npy")) for k in ("x_key", "y_key")]
    return [(f"data.{cfg_key}", path)]


def _check_meta(where: Path, x, y, task: str, keys: dict[str, str]) -> None:
    """Shapes and dtypes (from metadata: nothing is read). Errors say expected vs found."""
    xk, yk = keys["x_key"], keys["y_key"]

    def is_int(a):
        return a.dtype.kind in "iu"

    if task == "classification":
        if x.dtype.kind not in "fiu":
            raise DataError(f"{where}: {xk!r} must be a numeric array (float or int), found dtype {x.dtype}")
        if x.ndim < 2:
            raise DataError(f"{where}: {xk!r} must have shape (n, features), found shape {x.shape}")
        if not is_int(y):
            raise DataError(f"{where}: {yk!r} must hold integer class labels, found dtype {y.dtype}")
        if tuple(y.shape) != (x.shape[0],):
            raise DataError(f"{where}: {yk!r} must have shape (n,) = ({x.shape[0]},) to match {xk!r}, "
                            f"found shape {tuple(y.shape)}")
    else:
        if not is_int(x):
            raise DataError(f"{where}: {xk!r} must hold integer token ids, found dtype {x.dtype}")
        if x.ndim != 2:
            raise DataError(f"{where}: {xk!r} must have shape (n, T), found shape {x.shape}")
        if not is_int(y):
            raise DataError(f"{where}: {yk!r} must hold integer token ids, found dtype {y.dtype}")
        if tuple(y.shape) != tuple(x.shape):
            raise DataError(f"{where}: {yk!r} must have the same shape as {xk!r} {tuple(x.shape)}, "
                            f"found shape {tuple(y.shape)}")
    if x.shape[0] == 0:
        raise DataError(f"{where}: {xk!r} holds no samples (shape {tuple(x.shape)})")


def _read_rows(a, lo: int, hi: int) -> np.ndarray:
    return a[lo:hi] if isinstance(a, np.ndarray) else a.read(slice(lo, hi))


def _scan(x, y, task: str, rank: int, size: int, dtype) -> np.ndarray:
    """This rank's share of the value checks, as maxima: [-min y, max y, -min x, max x,
    nonfinite x, x values beyond ``dtype``'s range (None: not checked here)]."""
    big = np.iinfo(np.int64).max
    acc = np.array([-big, -big, -big, -big, 0, 0], dtype=np.int64)  # neutral for max
    n = x.shape[0]
    off, count = shard_range(n, size, rank)
    row_bytes = max(1, int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize)
    piece = max(1, SCAN_BYTES // row_bytes)
    limit = np.finfo(dtype).max if dtype is not None and task == "classification" else None
    for lo in range(off, off + count, piece):
        hi = min(lo + piece, off + count)
        yv = _read_rows(y, lo, hi)
        acc[0] = max(acc[0], -int(yv.min()))
        acc[1] = max(acc[1], int(yv.max()))
        xv = _read_rows(x, lo, hi)
        if task == "sequence":
            acc[2] = max(acc[2], -int(xv.min()))
            acc[3] = max(acc[3], int(xv.max()))
        elif xv.dtype.kind == "f":
            finite = np.isfinite(xv)
            acc[4] += int(xv.size - np.count_nonzero(finite))
            if limit is not None and xv.dtype.itemsize > np.dtype(dtype).itemsize:
                acc[5] += int(np.count_nonzero(np.abs(xv[finite]) > limit))
    return acc


def _check_values(where: Path, stats: np.ndarray, task: str, keys: dict[str, str], dtype) -> None:
    xk, yk = keys["x_key"], keys["y_key"]
    if -stats[0] < 0:
        raise DataError(f"{where}: {yk!r} must be >= 0 (class or token ids), found minimum {-stats[0]}")
    if task == "sequence" and -stats[2] < 0:
        raise DataError(f"{where}: {xk!r} must be >= 0 (class or token ids), found minimum {-stats[2]}")
    if stats[4] > 0:
        raise DataError(f"{where}: {xk!r} contains NaN or infinite values")
    if stats[5] > 0:
        raise DataError(f"{where}: feature values of {xk!r} overflow run.dtype = {str(np.dtype(dtype))!r} "
                        f"({np.dtype(dtype)} holds up to {float(np.finfo(dtype).max):.3g}): rescale the data or "
                        'set run.dtype = "float64"')


def _open_one(kind: str, path: Path, keys: dict[str, str], task: str, dtype, comm, timeout):
    """(x, y, stats) of one file: arrays or DiskArrays, checked; stats as :func:`_scan`.

    Opening and scanning are local; the ranks then combine their scans (and any
    rank's error) in one agreement, so every rank decides alike."""
    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    x = y = acc = error = None
    try:
        if kind == "npz":
            arrays = _read_npz(path, keys)
        elif kind == "npy":
            arrays = _open_npy(path, keys)
        else:
            arrays = _open_hdf5(path, keys)
        x, y = arrays["x_key"], arrays["y_key"]
        _check_meta(path, x, y, task, keys)
        acc = _scan(x, y, task, rank, size, dtype)
    except Exception as e:  # noqa: BLE001 - agreed on below: every rank raises it
        error = e
    stats = combine_max(acc, comm, timeout, error)
    _check_values(path, stats, task, keys, dtype)
    return x, y, stats


def _materialize(a, task: str, is_x: bool) -> np.ndarray:
    """A whole array in memory, shaped and typed as the in-memory Dataset holds it."""
    a = a if isinstance(a, np.ndarray) else a.read(slice(None))
    if is_x and task == "classification":
        return a.reshape(a.shape[0], -1)
    return a.astype(np.int64)


def load_file_dataset(cfg, task: str, dtype: str = "float32", comm=None, timeout=None) -> Dataset:
    """The dataset in ``cfg.path`` (and ``cfg.test_path``); collective over ``comm`` if given."""
    keys = {"x_key": cfg.x_key, "y_key": cfg.y_key}
    files = _files_of(cfg.kind, cfg.path, keys, "path")
    if cfg.test_path:
        files += _files_of(cfg.kind, cfg.test_path, keys, "test_path")
    check_same_files(files, comm, timeout)  # before anything is opened: same verdict on every rank
    refuse_external(cfg)  # HDF5 data stored outside the file: only with data.allow_external
    on_disk = cfg.kind in ("hdf5", "npy") and cfg.storage in ("auto", "disk")

    cast = dtype if on_disk else None  # in memory: hpcdp.data.cast checks the cast instead
    x, y, st = _open_one(cfg.kind, Path(cfg.path), keys, task, cast, comm, timeout)
    stats = [st]
    if cfg.test_path:
        x_te, y_te, st_te = _open_one(cfg.kind, Path(cfg.test_path), keys, task, cast, comm, timeout)
        stats.append(st_te)
        if tuple(x_te.shape[1:]) != tuple(x.shape[1:]):
            raise DataError(f"data.test_path: {cfg.test_path}: samples have shape {tuple(x_te.shape[1:])}, "
                            f"expected {tuple(x.shape[1:])} as in data.path")
        parts = [(x, y, None), (x_te, y_te, None)]
    else:
        tr, te = split_indices(x.shape[0], cfg.test_fraction, cfg.seed)
        parts = [(x, y, tr), (x, y, te)]

    flatten = task == "classification"
    x_dtype = dtype if task == "classification" else np.int64
    out = []
    for xa, ya, rows in parts:
        if on_disk:
            out += [RowView(xa, rows, x_dtype, flatten), RowView(ya, rows, np.int64)]
        else:
            xm, ym = _materialize(xa, task, True), _materialize(ya, task, False)
            out += [xm if rows is None else xm[rows], ym if rows is None else ym[rows]]
    top = max(int(s[1]) for s in stats)
    if task == "sequence":
        top = max([top] + [int(s[3]) for s in stats])
    n_classes = top + 1
    if task == "classification" and n_classes < 2:
        raise DataError(f"{cfg.path}: {cfg.y_key!r} holds a single class; classification needs at least 2")
    info = {"storage": "disk" if on_disk else "memory"}
    return Dataset(Path(cfg.path).name, task, *out, n_classes, info)
