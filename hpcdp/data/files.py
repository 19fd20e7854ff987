"""Datasets from user files: NumPy ``.npz`` archives and HDF5 files.

The file holds two arrays, named by ``data.x_key`` / ``data.y_key`` (default ``x`` /
``y``; in HDF5 a key may be a path such as ``train/images``):

- for an MLP (classification): ``x`` numeric, shape (n, features) or (n, d1, d2, ...)
  (flattened to (n, features)); ``y`` integer class labels >= 0, shape (n,)
- for a GPT (sequences): ``x`` integer token ids >= 0, shape (n, T); ``y`` the same
  shape (usually ``x`` shifted by one token)

The test set is ``data.test_path`` (same keys) when given, otherwise a deterministic
``data.test_fraction`` split of the file. Arrays are read into memory whole: the
sampler indexes samples at random.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from . import DataError, Dataset, split_indices
from .external import refuse_external


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


def _read_hdf5(path: Path, keys: dict[str, str]) -> dict[str, np.ndarray]:
    import h5py

    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DataError(f"{path}: cannot open as an HDF5 file ({e})") from None
    with f:
        out = {}
        for cfg_key, name in keys.items():
            if name not in f:
                found = []
                f.visititems(lambda n, obj: found.append(n) if isinstance(obj, h5py.Dataset) else None)
                raise DataError(f"data.{cfg_key}: dataset {name!r} not found in {path}; "
                                f"datasets found: {sorted(found)}")
            obj = f[name]
            if not isinstance(obj, h5py.Dataset):
                raise DataError(f"data.{cfg_key}: {name!r} in {path} is a group, expected a dataset")
            out[cfg_key] = obj[()]
    return out


def _check_arrays(path: Path, x: np.ndarray, y: np.ndarray, task: str, keys: dict[str, str]):
    """Validate shapes and dtypes; return (x, y) normalized. Errors say expected vs found."""
    xk, yk = keys["x_key"], keys["y_key"]
    where = f"{path}"

    def is_int(a):
        return a.dtype.kind in "iu"

    if task == "classification":
        if x.dtype.kind not in "fiu":
            raise DataError(f"{where}: {xk!r} must be a numeric array (float or int), found dtype {x.dtype}")
        if x.ndim < 2:
            raise DataError(f"{where}: {xk!r} must have shape (n, features), found shape {x.shape}")
        if not is_int(y):
            raise DataError(f"{where}: {yk!r} must hold integer class labels, found dtype {y.dtype}")
        if y.shape != (x.shape[0],):
            raise DataError(f"{where}: {yk!r} must have shape (n,) = ({x.shape[0]},) to match {xk!r}, "
                            f"found shape {y.shape}")
        x = x.reshape(x.shape[0], -1)
    else:
        if not is_int(x):
            raise DataError(f"{where}: {xk!r} must hold integer token ids, found dtype {x.dtype}")
        if x.ndim != 2:
            raise DataError(f"{where}: {xk!r} must have shape (n, T), found shape {x.shape}")
        if not is_int(y):
            raise DataError(f"{where}: {yk!r} must hold integer token ids, found dtype {y.dtype}")
        if y.shape != x.shape:
            raise DataError(f"{where}: {yk!r} must have the same shape as {xk!r} {x.shape}, found shape {y.shape}")
    if x.shape[0] == 0:
        raise DataError(f"{where}: {xk!r} holds no samples (shape {x.shape})")
    for name, a in ((yk, y),) + (((xk, x),) if task == "sequence" else ()):
        if a.size and a.min() < 0:
            raise DataError(f"{where}: {name!r} must be >= 0 (class or token ids), found minimum {a.min()}")
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        raise DataError(f"{where}: {xk!r} contains NaN or infinite values")
    x = x.astype(np.int64) if task == "sequence" else x
    return x, y.astype(np.int64)


def _load_one(path_str: str, kind: str, keys: dict[str, str], task: str, cfg_key: str):
    path = Path(path_str)
    if not path.is_file():
        raise DataError(f"data.{cfg_key}: file not found: {path_str!r}")
    reader = _read_npz if kind == "npz" else _read_hdf5
    arrays = reader(path, keys)
    return _check_arrays(path, arrays["x_key"], arrays["y_key"], task, keys)


def load_file_dataset(cfg, task: str) -> Dataset:
    refuse_external(cfg)  # HDF5 data stored outside the file: only with data.allow_external
    keys = {"x_key": cfg.x_key, "y_key": cfg.y_key}
    x, y = _load_one(cfg.path, cfg.kind, keys, task, "path")
    if cfg.test_path:
        x_te, y_te = _load_one(cfg.test_path, cfg.kind, keys, task, "test_path")
        if x_te.shape[1:] != x.shape[1:]:
            raise DataError(f"data.test_path: {cfg.test_path}: samples have shape {x_te.shape[1:]}, "
                            f"expected {x.shape[1:]} as in data.path")
        x_tr, y_tr = x, y
    else:
        tr, te = split_indices(len(x), cfg.test_fraction, cfg.seed)
        x_tr, y_tr, x_te, y_te = x[tr], y[tr], x[te], y[te]
    n_classes = int(max(y_tr.max(), y_te.max() if y_te.size else 0)) + 1
    if task == "sequence":
        n_classes = max(n_classes, int(x_tr.max()) + 1, int(x_te.max()) + 1 if x_te.size else 0)
    if task == "classification" and n_classes < 2:
        raise DataError(f"{cfg.path}: {cfg.y_key!r} holds a single class; classification needs at least 2")
    return Dataset(Path(cfg.path).name, task, x_tr, y_tr, x_te, y_te, n_classes)
