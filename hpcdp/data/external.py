"""HDF5 datasets whose bytes live outside the file are refused unless allowed.

An HDF5 file can point elsewhere: a dataset with **external storage** reads its
bytes from other files (any path, e.g. ``/etc/passwd``), a **virtual dataset** maps
regions of datasets in other files, and an **external link** opens another file
in place of a group or dataset. A data file handed to ``hpcdp train`` would then
make it read (and train on, and log statistics of) files the user never named.
hpcdp refuses all three unless ``data.allow_external = true``.

The check opens the file once more and looks at the ``data.x_key`` / ``data.y_key``
datasets' metadata only (no data is read): cheap next to loading them.
"""

from __future__ import annotations

import os

from .dataset import DataError


def outside_sources(dset, path: str) -> str | None:
    """Why ``dset`` (an open h5py Dataset of file ``path``) reads outside that file,
    or None if it does not."""
    own = os.path.realpath(path)
    if os.path.realpath(dset.file.filename) != own:
        return f"it is an external link to {dset.file.filename}"
    ext = dset.external
    if ext:
        files = sorted({name if isinstance(name, str) else name.decode() for name, *_ in ext})
        return f"it has external storage in {', '.join(files)}"
    if dset.is_virtual:
        files = sorted({m.file_name for m in dset.virtual_sources()
                        if m.file_name != "." and os.path.realpath(m.file_name) != own})
        if files:
            return f"it is a virtual dataset mapping data from {', '.join(files)}"
    return None


def refuse_external(cfg) -> None:
    """``data.kind = "hdf5"``: raise DataError if ``x_key`` / ``y_key`` in ``data.path`` or
    ``data.test_path`` read bytes from other files, unless ``data.allow_external``.
    Files or keys that are missing are left to the loader to report."""
    if cfg.kind != "hdf5" or getattr(cfg, "allow_external", False):
        return
    import h5py

    for cfg_key, path in (("path", cfg.path), ("test_path", cfg.test_path)):
        if not path or not os.path.isfile(path):
            continue
        try:
            f = h5py.File(path, "r")
        except OSError:
            continue
        with f:
            for name in (cfg.x_key, cfg.y_key):
                try:
                    obj = f.get(name)
                except (KeyError, OSError) as e:  # e.g. an external link to a missing file
                    raise DataError(f"data.{cfg_key}: {name!r} in {path} cannot be opened ({e}); "
                                    "hpcdp reads only data stored in the file itself") from None
                if obj is None or not hasattr(obj, "external"):
                    continue
                why = outside_sources(obj, path)
                if why:
                    raise DataError(f"data.{cfg_key}: dataset {name!r} in {path} reads bytes from other "
                                    f"files ({why}); hpcdp refuses that unless you set "
                                    "data.allow_external = true")


__all__ = ["refuse_external", "outside_sources"]
